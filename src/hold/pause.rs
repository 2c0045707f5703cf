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
//! A request held by a pause waits at least until the pause would end by itself
//! (`pause.max_secs`), `hold.timeout_secs` if that is longer.

use http::HeaderValue;

use super::*;

/// A pause in progress.
pub(super) struct Paused {
    /// Which pause, so a watcher stops with its own pause and not the next one's.
    id: u64,
    since: Instant,
    /// When it ends by itself.
    pub(super) until: Instant,
    /// What first showed the upstream gone since the pause began.
    pub(super) gone: Option<RewriteReason>,
}

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

impl Hold {
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
        let up = self.upstream();
        let st = up.lock();
        let now = Instant::now();
        st.paused.as_ref().map(|p| PauseStatus {
            age: now.saturating_duration_since(p.since),
            remaining: p.until.saturating_duration_since(now),
            upstream_gone: p.gone.is_some(),
            held: st.waiters.len(),
        })
    }
}

impl Outages {
    fn pause(self: &Arc<Self>, max: Duration, who: &str, host: Option<HeaderValue>) -> PauseStart {
        if !self.cfg.enabled {
            return PauseStart::HoldDisabled;
        }
        let mut st = self.lock();
        if self.shared.shutting_down.load(Ordering::Acquire) {
            return PauseStart::ShuttingDown;
        }
        if st.paused.is_some() {
            return PauseStart::Already;
        }
        // An outage already open: the upstream is gone now, and the application's first
        // answer ends the outage and the pause together.
        let gone = st.outage.as_ref().map(|o| o.last_reason);
        self.open(&mut st, RewriteReason::Paused);
        st.pauses += 1;
        let id = st.pauses;
        let now = Instant::now();
        st.paused = Some(Paused {
            id,
            since: now,
            until: now + max,
            gone,
        });
        drop(st);
        self.metrics.paused.set(1);
        tracing::info!(
            peer = who,
            max_secs = max.as_secs_f64(),
            upstream_gone = gone.is_some(),
            "paused: new requests are held until a new instance answers, `holdfast resume`, \
             or pause.max_secs"
        );
        tokio::spawn(self.clone().watch(id, host));
        PauseStart::Started
    }

    fn resume(&self, who: &str) -> bool {
        self.end(None, who)
    }

    /// Ends the pause in progress (pause `id` only, if given). False when there was none.
    fn end(&self, id: Option<u64>, who: &str) -> bool {
        let mut st = self.lock();
        if id.is_some() && st.paused.as_ref().map(|p| p.id) != id {
            return false;
        }
        let Some(paused) = self.end_pause(&mut st, who) else {
            return false;
        };
        if paused.gone.is_none() {
            // Never seen gone: release everyone to whatever answers now.
            self.close(&mut st);
        }
        // Gone and not back: an outage like any other from here on; its prober runs while
        // anyone is held (it started with the first of them).
        true
    }

    /// Ends the pause, if one is in progress, saying why (`who` asked, or what happened).
    fn end_pause(&self, st: &mut State, who: &str) -> Option<Paused> {
        let paused = st.paused.take()?;
        self.metrics.paused.set(0);
        tracing::info!(
            by = who,
            paused_ms = paused.since.elapsed().as_millis() as u64,
            upstream_was_gone = paused.gone.is_some(),
            held = st.waiters.len(),
            "resumed"
        );
        Some(paused)
    }

    /// An application answer while an outage is open: whether it ends the outage. While
    /// paused, only once the upstream has been seen gone (before that it is the old instance
    /// finishing what is in flight); it then ends the pause too.
    pub(super) fn pause_ends_on_answer(&self, st: &mut State) -> bool {
        match &st.paused {
            None => true,
            Some(p) if p.gone.is_none() => false,
            Some(_) => {
                self.end_pause(st, "a new instance answered");
                true
            }
        }
    }

    /// Something showed the upstream gone (`reason`). While paused, the pause is from now on
    /// waiting for a new instance, and its outage counts as one.
    pub(super) fn mark_gone(&self, st: &mut State, reason: RewriteReason) {
        let Some(p) = st.paused.as_mut() else {
            return;
        };
        if p.gone.is_none() {
            p.gone = Some(reason);
            tracing::info!(
                reason = reason.as_str(),
                "paused: the upstream is gone; resuming when a new instance answers"
            );
        }
        if let Some(o) = st.outage.as_mut() {
            o.last_reason = reason;
            if std::mem::replace(&mut o.paused_only, false) {
                self.count_outage_start(reason);
            }
        }
    }

    /// A route's outage met the upstream missing (`reason`): a pause learns it is gone.
    pub fn saw_gone(&self, reason: RewriteReason) {
        if self.in_outage() {
            let mut st = self.lock();
            self.mark_gone(&mut st, reason);
        }
    }

    /// Watches pause `id` until it ends: asks the upstream, with jittered backoff, whether the
    /// application is there, first to see it gone, then to see the new instance answer. Ends it
    /// at `pause.max_secs`.
    async fn watch(self: Arc<Self>, id: u64, host: Option<HeaderValue>) {
        let presence = self.health.clone().or_else(|| self.presence.clone());
        let mut attempt = 0u32;
        loop {
            let until = match &self.lock().paused {
                Some(p) if p.id == id => p.until,
                _ => return,
            };
            let delay = backoff(
                self.cfg.backoff_initial,
                self.cfg.backoff_max,
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
            let mut st = self.lock();
            let gone = match &st.paused {
                Some(p) if p.id == id => p.gone.is_some(),
                _ => return,
            };
            match checked {
                Checked::Up if gone => {
                    drop(st);
                    self.answered();
                    return;
                }
                Checked::Up => {}
                Checked::NotUp(status) if status == http::StatusCode::NOT_FOUND => {
                    self.mark_gone(&mut st, RewriteReason::RouteMissing404)
                }
                Checked::NotUp(_) => self.mark_gone(&mut st, RewriteReason::RouterUnavailable),
                Checked::NoAnswer => self.mark_gone(&mut st, RewriteReason::ConnectError),
            }
        }
    }
}
