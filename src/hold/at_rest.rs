//! Health at rest: the upstream is checked every `hold.check_interval_secs` (10 s) even without
//! traffic, so `holdfast_upstream_up`, `/status` and the alerts on them follow the server rather
//! than the last request: a wrong upstream name, or a server gone on a quiet night, shows within
//! one interval, and a server back after an outage longer than the hold reads up again.
//!
//! The check at rest is as cautious as a request would be. With no outage it only connects:
//! nothing listening (refused, a name that does not resolve, no route) is the same evidence a
//! request's failed connection gives, and opens the same upstream-wide outage, whose log line
//! names the reason and the error (the next request is held instead of sent into the gap). An
//! answer that is not healthy (a 5xx, a router's 404) opens nothing: a request would get it too,
//! and decide for itself. With an outage that no prober is working on (nobody is held), it asks
//! whether the application is there (`hold.probe_path`, or else `OPTIONS` on the first endpoint,
//! which runs nothing), and the application's answer closes the outage. While a prober runs, or a
//! pause is on, the check stays out of their way. `hold.check_interval_secs = 0` turns it off.
//! The settings are read at every tick: a reload changes them.

use super::*;

/// What one tick of the check at rest does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtRest {
    /// Nothing: holdfast is shutting down, a pause watches the upstream, or a prober is on it.
    Skip,
    /// No outage: connect, and open one if nothing listens.
    Connect,
    /// An outage nobody probes: ask the health path, and close it if the application answers.
    Health,
}

/// The step for one tick, from what the route's state shows.
pub(super) fn next_step(outage_open: bool, probing: bool, paused: bool, stopping: bool) -> AtRest {
    match (stopping || paused || probing, outage_open) {
        (true, _) => AtRest::Skip,
        (false, false) => AtRest::Connect,
        (false, true) => AtRest::Health,
    }
}

/// `every`, spread over ±10 % so that a fleet started together does not check in step.
fn jittered(every: Duration, jitter: f64) -> Duration {
    every.mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0))
}

/// How long the check sleeps while it is off (`hold.check_interval_secs = 0`) before it reads
/// the settings again (a reload may turn it on).
const OFF_RECHECK: Duration = Duration::from_secs(10);

impl RouteOutage {
    /// The check at rest, for the upstream-wide outage: a task for as long as holdfast serves.
    /// The first check is at once: a wrong upstream shows from the start.
    pub(super) fn at_rest(
        self: &Arc<Self>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move {
            loop {
                let settings = this.settings();
                let Some(every) = settings.cfg.check_interval else {
                    tokio::time::sleep(OFF_RECHECK).await;
                    continue;
                };
                let ask = settings
                    .health
                    .clone()
                    .or_else(|| settings.presence.clone());
                this.check_at_rest(&settings, ask.as_deref()).await;
                tokio::time::sleep(jittered(every, fastrand::f64())).await;
            }
        }
    }

    /// One tick of the check at rest; `ask`: what asks whether the application is there.
    async fn check_at_rest(&self, settings: &Template, ask: Option<&dyn Health>) {
        let step = {
            let m = self.lock();
            next_step(
                m.is_open(),
                m.prober_running(),
                m.pause().is_some(),
                self.shared.shutting_down.load(Ordering::Acquire),
            )
        };
        match step {
            AtRest::Skip => {}
            AtRest::Connect => {
                use tower_service::Service;
                let connect = settings.connector.clone().call(settings.probe_uri.clone());
                let Err(err) = connect.await else {
                    return;
                };
                let Some(reason) = RewriteReason::of_connect(err.kind()) else {
                    return;
                };
                self.note_cause(|| {
                    format!("{} (the check at rest)", crate::errors::ErrorChain(&err))
                });
                self.missing(reason);
            }
            AtRest::Health => {
                let Some(ask) = ask else { return };
                if ask.check(self.host.as_ref()).await == Checked::Up {
                    tracing::debug!(route = self.route, "the check at rest passed");
                    self.answered();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config, template};
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A health path that answers `up` or not, counting its checks.
    struct Fake {
        up: AtomicBool,
        checks: AtomicU32,
    }

    impl Health for Fake {
        fn check<'a>(
            &'a self,
            _host: Option<&'a http::HeaderValue>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Checked> + Send + 'a>> {
            self.checks.fetch_add(1, Ordering::SeqCst);
            let up = self.up.load(Ordering::SeqCst);
            Box::pin(async move {
                if up {
                    Checked::Up
                } else {
                    Checked::NoAnswer
                }
            })
        }
    }

    fn upstream_with(
        health: Option<Arc<Fake>>,
        every: Option<Duration>,
    ) -> (Arc<RouteOutage>, Arc<Metrics>) {
        let cfg = HoldConfig {
            check_interval: every,
            ..config(Duration::from_secs(5))
        };
        let (mut template, metrics) = template(cfg);
        template.health = health.map(|h| h as Arc<dyn Health>);
        let o = RouteOutage::new(SharedHold::new(template), "(all)".into(), None);
        (Arc::new(o), metrics)
    }

    fn fake(up: bool) -> Arc<Fake> {
        Arc::new(Fake {
            up: AtomicBool::new(up),
            checks: AtomicU32::new(0),
        })
    }

    /// Off (`hold.check_interval_secs = 0`): nothing is asked, however long it runs.
    #[tokio::test(start_paused = true)]
    async fn no_check_at_rest_with_the_interval_off() {
        let health = fake(true);
        let (o, _) = upstream_with(Some(health.clone()), None);
        o.missing(RewriteReason::ConnectRefused);
        let task = tokio::spawn(o.at_rest());
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(health.checks.load(Ordering::SeqCst), 0);
        assert!(o.in_outage());
        task.abort();
    }

    /// An outage nobody is held in (its requests timed out) closes when the health path
    /// passes, with no request: `holdfast_upstream_up` is 1 again and the duration recorded.
    #[tokio::test(start_paused = true)]
    async fn an_outage_nobody_waits_in_closes_when_the_health_path_passes() {
        let health = fake(false);
        let (o, metrics) = upstream_with(Some(health.clone()), Some(Duration::from_secs(10)));
        o.missing(RewriteReason::ConnectRefused);
        assert_eq!(metrics.upstream_up.get(), 0);
        tokio::spawn(o.at_rest());

        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(health.checks.load(Ordering::SeqCst), 1, "the first at once");
        assert!(o.in_outage(), "no answer keeps the outage open");
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            health.checks.load(Ordering::SeqCst),
            2,
            "the next 9–11 s later"
        );
        assert!(o.in_outage(), "no answer keeps the outage open");
        assert_eq!(metrics.upstream_up.get(), 0);

        health.up.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(health.checks.load(Ordering::SeqCst), 3);
        assert!(!o.in_outage());
        assert_eq!(metrics.upstream_up.get(), 1);
        assert_eq!(
            o.shared.history.lock().unwrap().len(),
            1,
            "its duration kept"
        );
    }

    #[test]
    fn connects_at_rest_and_asks_the_health_path_only_in_an_outage_nobody_probes() {
        assert_eq!(next_step(false, false, false, false), AtRest::Connect);
        assert_eq!(next_step(true, false, false, false), AtRest::Health);
        // A prober is on it (requests are held): it decides, with real requests.
        assert_eq!(next_step(true, true, false, false), AtRest::Skip);
        // A pause watches the upstream itself, outage or not.
        assert_eq!(next_step(false, false, true, false), AtRest::Skip);
        assert_eq!(next_step(true, false, true, false), AtRest::Skip);
        // Shutting down: nothing opens or closes any more.
        assert_eq!(next_step(false, false, false, true), AtRest::Skip);
        assert_eq!(next_step(true, false, false, true), AtRest::Skip);
    }

    #[test]
    fn the_interval_is_spread_by_a_tenth_either_way() {
        let every = Duration::from_secs(10);
        assert_eq!(jittered(every, 0.0), Duration::from_secs(9));
        assert_eq!(jittered(every, 1.0), Duration::from_secs(11));
        assert_eq!(jittered(every, 0.5), every);
        assert_eq!(jittered(every, 7.0), Duration::from_secs(11), "clamped");
    }
}
