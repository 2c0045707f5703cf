//! Planned restarts: a pause holds every new request before it is sent, while requests already
//! in flight finish on the instance that is about to stop.
//!
//! A pause is the upstream-wide outage opened on purpose (reason `paused`): the same queue,
//! caps, deadlines, cancellation and metrics as any hold. What differs:
//!
//! - Until something shows the upstream **gone** (a request meeting a refused connection or a
//!   route-missing 404, or the pause's own presence check failing), the old instance still
//!   answers. Its answers to in-flight requests do not end the pause, no held request goes out
//!   as a probe, and nothing counts as an outage (`holdfast_upstream_up` stays 1).
//! - Once gone, it is an outage like any other (counted, probed); the first application answer
//!   after that comes from the **new instance** and ends both: held requests go out, oldest
//!   first, exactly once.
//! - `resume` (or `pause.max_secs`) ends the pause early: if the upstream was never seen gone,
//!   held requests are released to whatever answers; if it is gone and not back, the outage
//!   goes on as any other (held until the application answers, or their 503).
//!
//! A request held by a pause waits for the pause to end (at most `pause.max_secs`) and then, if
//! the upstream is still gone, as long as any held request (`hold.timeout_secs`).

use http::HeaderValue;

use super::*;

/// What asking for a pause did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseStart {
    /// A pause began.
    Started,
    /// A pause was already in progress: nothing changed.
    Already,
    /// `hold.enabled = false`: nothing could be held, so no pause.
    HoldDisabled,
    /// holdfast is shutting down.
    ShuttingDown,
}

/// A pause in progress, as the admin status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PauseStatus {
    /// How long it has lasted.
    pub age: Duration,
    /// Until it ends by itself.
    pub remaining: Duration,
    /// Whether the upstream has been seen gone since it began.
    pub upstream_gone: bool,
    /// Requests it holds now.
    pub held: usize,
}

impl OutageRoutes {
    /// Pauses for a planned restart, for at most `max`. `who` asked (for the log); `host` is the
    /// Host the presence check sends (the upstream's own when `None`).
    pub fn pause(&self, max: Duration, who: &str, host: Option<HeaderValue>) -> PauseStart {
        self.upstream().pause(max, who, host)
    }

    /// Ends a pause. False when none was in progress.
    pub fn resume(&self, who: &str) -> bool {
        self.upstream().resume(who)
    }

    /// The pause in progress, if any.
    pub fn pause_status(&self) -> Option<PauseStatus> {
        let view = self.upstream().lock().pause()?;
        let now = now();
        Some(PauseStatus {
            age: now.saturating_duration_since(view.pause.since),
            remaining: view.pause.until.saturating_duration_since(now),
            upstream_gone: view.upstream_gone,
            held: view.held,
        })
    }
}

impl RouteOutage {
    fn pause(self: &Arc<Self>, max: Duration, who: &str, host: Option<HeaderValue>) -> PauseStart {
        if !self.enabled() {
            return PauseStart::HoldDisabled;
        }
        let mut m = self.lock();
        if self.shared.shutting_down.load(Ordering::Acquire) {
            return PauseStart::ShuttingDown;
        }
        let Ok((pause, gone, effects)) = m.begin_pause(now(), max, self.shared.next_id()) else {
            return PauseStart::Already;
        };
        self.apply(&m, effects);
        drop(m);
        self.metrics.paused.set(1);
        tracing::info!(
            peer = who,
            max_secs = max.as_secs_f64(),
            upstream_gone = gone,
            "paused: new requests are held until a new instance answers, `holdfast resume`, \
             or pause.max_secs"
        );
        tokio::spawn(self.clone().watch(pause.id, host));
        PauseStart::Started
    }

    fn resume(&self, who: &str) -> bool {
        self.end(None, who)
    }

    /// Ends the pause in progress (pause `id` only, if given). False when there was none.
    fn end(&self, id: Option<u64>, who: &str) -> bool {
        let mut m = self.lock();
        let (ended, effects) = m.end_pause(id, who, now());
        self.apply(&m, effects);
        ended
    }

    /// Something showed the upstream gone (`reason`) without a request of this route meeting
    /// it: a pause is from now on waiting for a new instance, and its outage counts as one.
    pub fn saw_gone(&self, reason: RewriteReason) {
        if self.in_outage() {
            let mut m = self.lock();
            self.mark_gone(&mut m, reason);
        }
    }

    fn mark_gone(&self, m: &mut Held, reason: RewriteReason) {
        let effects = m.saw_gone(reason, now());
        self.apply(m, effects);
    }

    /// Watches pause `id` until it ends: asks the upstream, with jittered backoff, whether the
    /// application is there, first to see it gone, then to see the new instance answer. Ends it
    /// at `pause.max_secs`.
    async fn watch(self: Arc<Self>, id: u64, host: Option<HeaderValue>) {
        let mut attempt = 0u32;
        loop {
            // Read each time: a reload may change them while a pause lasts.
            let settings = self.settings();
            let presence = settings
                .health
                .clone()
                .or_else(|| settings.presence.clone());
            let until = match self.lock().pause() {
                Some(v) if v.pause.id == id => Instant::from_std(v.pause.until),
                _ => return,
            };
            let delay = backoff(
                settings.cfg.backoff_initial,
                settings.cfg.backoff_max,
                attempt,
                fastrand::f64(),
            );
            attempt = attempt.saturating_add(1);
            if Instant::now() + delay >= until {
                tokio::time::sleep_until(until).await;
                self.end(Some(id), "pause.max_secs");
                return;
            }
            tokio::time::sleep(delay).await;
            if self.shared.shutting_down.load(Ordering::Acquire) {
                return;
            }
            let Some(presence) = &presence else {
                continue;
            };
            let checked = presence.check(host.as_ref()).await;
            let mut m = self.lock();
            let gone = match m.pause() {
                Some(v) if v.pause.id == id => v.upstream_gone,
                _ => return,
            };
            match checked {
                Checked::Up if gone => {
                    drop(m);
                    self.answered();
                    return;
                }
                Checked::Up => {}
                Checked::NotUp(status) if status == http::StatusCode::NOT_FOUND => {
                    self.mark_gone(&mut m, RewriteReason::RouteMissing404)
                }
                Checked::NotUp(_) => self.mark_gone(&mut m, RewriteReason::RouterUnavailable),
                Checked::NoAnswer => self.mark_gone(&mut m, RewriteReason::ConnectError),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hold::tests::until_held;
    use crate::replay::BodyHandle;
    use std::pin::Pin;
    use std::sync::atomic::AtomicU32;

    /// A presence check that answers from a script, then "up" forever; counts its calls.
    struct Scripted {
        script: Mutex<VecDeque<Checked>>,
        calls: AtomicU32,
    }

    impl Health for Scripted {
        fn check<'a>(
            &'a self,
            _host: Option<&'a HeaderValue>,
        ) -> Pin<Box<dyn std::future::Future<Output = Checked> + Send + 'a>> {
            self.calls.fetch_add(1, Ordering::AcqRel);
            let next = self.script.lock().unwrap().pop_front();
            Box::pin(async move { next.unwrap_or(Checked::Up) })
        }
    }

    fn hold(timeout: Duration, presence: Option<Arc<Scripted>>) -> (OutageRoutes, Arc<Metrics>) {
        let cfg = crate::hold::tests::config(timeout);
        let (mut template, metrics) = crate::hold::tests::template(cfg);
        template.presence = presence.map(|p| p as Arc<dyn Health>);
        (OutageRoutes::new(template, false), metrics)
    }

    /// A request held in the upstream-wide outage on its own task: its outcome, whether it went
    /// as the probe, and when it left.
    fn held(hold: &OutageRoutes) -> tokio::task::JoinHandle<(Released, bool, Instant)> {
        let up = hold.upstream().clone();
        tokio::spawn(async move {
            let mut ticket = Ticket::default();
            let released = up.wait(&mut ticket, &BodyHandle::empty()).await;
            (released, ticket.probe.is_some(), Instant::now())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_until_the_upstream_went_and_a_new_instance_answered() {
        let (hold, metrics) = hold(Duration::from_secs(15), None);
        let up = hold.upstream().clone();
        assert_eq!(
            hold.pause(Duration::from_secs(60), "test", None),
            PauseStart::Started
        );
        assert_eq!(
            hold.pause(Duration::from_secs(60), "test", None),
            PauseStart::Already
        );
        assert_eq!(metrics.paused.get(), 1);
        assert_eq!(metrics.upstream_up.get(), 1, "a pause is not an outage");
        assert!(up.holds_before_dispatch(Duration::from_secs(120)));
        let first = held(&hold);
        let second = held(&hold);
        until_held(&metrics, 2).await;

        // The old instance answers what was in flight: nothing is released, nothing probes.
        up.answered();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(metrics.held_requests.get(), 2);
        assert!(hold.pause_status().is_some_and(|p| !p.upstream_gone));

        // It stops: from now on the pause waits for a new instance, as an outage.
        up.missing(RewriteReason::ConnectRefused);
        assert!(hold.pause_status().unwrap().upstream_gone);
        assert_eq!(metrics.upstream_up.get(), 0);
        assert_eq!(metrics.outages.get(), 1);

        // The new instance answers: the pause ends, everyone goes out, oldest first.
        let answered_at = Instant::now();
        up.answered();
        assert_eq!(metrics.paused.get(), 0);
        assert!(hold.pause_status().is_none());
        let (a, b) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!((a.0, a.1, a.2), (Released::Go, false, answered_at));
        assert_eq!((b.0, b.1), (Released::Go, false));
        assert_eq!(metrics.upstream_up.get(), 1);
        assert!(!up.in_outage());
        assert!(!hold.resume("test"), "nothing to resume");
    }

    #[tokio::test(start_paused = true)]
    async fn resume_releases_what_a_pause_held_when_the_upstream_never_went() {
        let (hold, metrics) = hold(Duration::from_secs(15), None);
        hold.pause(Duration::from_secs(60), "test", None);
        let waiter = held(&hold);
        until_held(&metrics, 1).await;
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(hold.resume("test"));
        assert_eq!(waiter.await.unwrap().0, Released::Go);
        assert_eq!(metrics.paused.get(), 0);
        assert_eq!(metrics.outages.get(), 0, "never an outage");
        assert!(
            hold.upstream().shared.history.lock().unwrap().is_empty(),
            "no outage duration for Retry-After to learn from"
        );
        assert!(!hold.upstream().in_outage());
    }

    #[tokio::test(start_paused = true)]
    async fn resumed_while_gone_the_outage_goes_on_and_its_requests_wait_for_the_application() {
        let (hold, metrics) = hold(Duration::from_secs(15), None);
        let up = hold.upstream().clone();
        hold.pause(Duration::from_secs(60), "test", None);
        let waiter = held(&hold);
        until_held(&metrics, 1).await;
        up.missing(RewriteReason::ConnectRefused);
        assert!(hold.resume("test"));
        assert!(up.in_outage(), "still gone: an outage like any other");
        assert_eq!(metrics.held_requests.get(), 1);
        up.answered();
        assert_eq!(waiter.await.unwrap().0, Released::Go);
    }

    #[tokio::test(start_paused = true)]
    async fn max_secs_ends_a_pause_and_a_paused_request_waits_that_long() {
        // The hold timeout (5 s) is shorter than the pause (20 s): the request waits for the
        // pause, and has its own hold timeout after it.
        let (hold, metrics) = hold(Duration::from_secs(5), None);
        let begun = Instant::now();
        hold.pause(Duration::from_secs(20), "test", None);
        let waiter = held(&hold);
        let (released, probe, at) = waiter.await.unwrap();
        assert_eq!((released, probe), (Released::Go, false));
        assert_eq!(at - begun, Duration::from_secs(20));
        assert_eq!(metrics.paused.get(), 0);
        assert!(!hold.upstream().in_outage());
    }

    #[tokio::test(start_paused = true)]
    async fn the_presence_check_sees_the_old_instance_go_and_the_new_one_answer() {
        let presence = Arc::new(Scripted {
            script: Mutex::new(VecDeque::from([
                Checked::Up,
                Checked::Up,
                Checked::NoAnswer,
                Checked::NoAnswer,
            ])),
            calls: AtomicU32::new(0),
        });
        let (hold, metrics) = hold(Duration::from_secs(15), Some(presence.clone()));
        hold.pause(Duration::from_secs(60), "test", None);
        let waiter = held(&hold);
        let (released, probe, _) = waiter.await.unwrap();
        assert_eq!((released, probe), (Released::Go, false));
        // Up twice (the old instance), gone twice, then the new instance: five checks. (The
        // prober's bare connects meanwhile find nothing listening on the probe port, so no
        // held request goes out as a probe.)
        assert_eq!(presence.calls.load(Ordering::Acquire), 5);
        assert_eq!(metrics.paused.get(), 0);
        assert_eq!(
            metrics.outages.get(),
            1,
            "the gap between instances was an outage"
        );
        assert_eq!(
            metrics
                .rewrites
                .get_or_create(&crate::metrics::ReasonLabel::new(
                    RewriteReason::Paused,
                    crate::metrics::RewriteAction::answered_503
                ))
                .get(),
            0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_pause_without_holding_nor_while_shutting_down() {
        let cfg = HoldConfig {
            enabled: false,
            ..crate::hold::tests::config(Duration::from_secs(60))
        };
        let (template, _) = crate::hold::tests::template(cfg);
        let off = OutageRoutes::new(template, false);
        assert_eq!(
            off.pause(Duration::from_secs(60), "test", None),
            PauseStart::HoldDisabled
        );
        let (hold, metrics) = hold(Duration::from_secs(15), None);
        hold.shutdown();
        assert_eq!(
            hold.pause(Duration::from_secs(60), "test", None),
            PauseStart::ShuttingDown
        );
        assert_eq!(metrics.paused.get(), 0);
    }
}
