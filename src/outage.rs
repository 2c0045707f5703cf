//! The upstream's health as the proxy sees it: when an outage opened, how long it lasted, and
//! whether route-missing answers have gone on past the horizon.
//!
//! An outage opens with the first "backend missing" verdict and closes with the first answer
//! from the application. Both ends are logged once (the close with duration and how many
//! requests were answered 503), and `holdfast_upstream_up` follows it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::RewriteReason;
use crate::metrics::Metrics;

/// Shared health state of the one upstream.
pub struct Health {
    /// Fast path: requests check this before taking the lock.
    in_outage: AtomicBool,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

struct State {
    /// The last time the application answered (or the start, before any answer).
    last_healthy: Instant,
    outage: Option<Outage>,
}

struct Outage {
    started: Instant,
    reason: RewriteReason,
    /// Requests answered 503 during this outage.
    rewritten: u64,
    /// The horizon warning was logged for this outage.
    horizon_warned: bool,
}

impl Health {
    /// A healthy start: the horizon counts from now.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            in_outage: AtomicBool::new(false),
            state: Mutex::new(State {
                last_healthy: Instant::now(),
                outage: None,
            }),
            metrics,
        }
    }

    /// The application answered: close any open outage.
    pub fn answered(&self) {
        let now = Instant::now();
        if !self.in_outage.load(Ordering::Acquire) {
            // Hot path: no outage; only refresh the timestamp.
            self.state.lock().expect("health lock").last_healthy = now;
            return;
        }
        let mut state = self.state.lock().expect("health lock");
        state.last_healthy = now;
        if let Some(outage) = state.outage.take() {
            self.in_outage.store(false, Ordering::Release);
            self.metrics.upstream_up.set(1);
            tracing::info!(
                duration_ms = now.duration_since(outage.started).as_millis() as u64,
                answered_503 = outage.rewritten,
                first_reason = outage.reason.as_str(),
                "upstream outage ended"
            );
        }
    }

    /// A request met a missing backend and was answered 503.
    pub fn missing(&self, reason: RewriteReason) {
        let mut state = self.state.lock().expect("health lock");
        let outage = state.outage.get_or_insert_with(|| {
            self.in_outage.store(true, Ordering::Release);
            self.metrics.upstream_up.set(0);
            tracing::warn!(reason = reason.as_str(), "upstream outage started");
            Outage {
                started: Instant::now(),
                reason,
                rewritten: 0,
                horizon_warned: false,
            }
        });
        outage.rewritten += 1;
    }

    /// Whether the last application answer is older than `horizon`.
    pub fn beyond_horizon(&self, horizon: Duration) -> bool {
        let state = self.state.lock().expect("health lock");
        Instant::now().saturating_duration_since(state.last_healthy) > horizon
    }

    /// A route-missing 404 passed through because of the horizon: warn once per outage.
    pub fn horizon_exceeded(&self, horizon: Duration, upstream: &str) {
        let mut state = self.state.lock().expect("health lock");
        let first = match &mut state.outage {
            Some(o) => !std::mem::replace(&mut o.horizon_warned, true),
            None => {
                // No outage is open (the router said 404 from the first request on): open one
                // so the warning is not repeated for every request.
                state.outage = Some(Outage {
                    started: Instant::now(),
                    reason: RewriteReason::RouteMissing404,
                    rewritten: 0,
                    horizon_warned: true,
                });
                self.in_outage.store(true, Ordering::Release);
                self.metrics.upstream_up.set(0);
                true
            }
        };
        if first {
            tracing::warn!(
                horizon_secs = horizon.as_secs_f64(),
                upstream,
                "the router has answered 404 for longer than the horizon; passing its 404s \
                 through. Check the upstream URL and the router's configuration"
            );
        }
    }

    /// Whether an outage is open.
    pub fn in_outage(&self) -> bool {
        self.in_outage.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[tokio::test(start_paused = true)]
    async fn outage_opens_closes_and_tracks_horizon() {
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let h = Health::new(metrics.clone());
        let horizon = Duration::from_secs(120);
        assert!(!h.in_outage());
        assert_eq!(metrics.upstream_up.get(), 1);

        h.missing(RewriteReason::ConnectRefused);
        assert!(h.in_outage());
        assert_eq!(metrics.upstream_up.get(), 0);
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(!h.beyond_horizon(horizon));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(h.beyond_horizon(horizon));

        h.answered();
        assert!(!h.in_outage());
        assert_eq!(metrics.upstream_up.get(), 1);
        assert!(!h.beyond_horizon(horizon), "an answer resets the horizon");
    }

    #[tokio::test(start_paused = true)]
    async fn horizon_counts_from_start_without_any_answer() {
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let h = Health::new(metrics.clone());
        tokio::time::advance(Duration::from_secs(121)).await;
        assert!(h.beyond_horizon(Duration::from_secs(120)));
        h.horizon_exceeded(Duration::from_secs(120), "http://x");
        assert!(h.in_outage());
        assert_eq!(metrics.upstream_up.get(), 0);
    }
}
