//! Time-based answers: the Retry-After of a 503 (from the outages seen so far) and the horizon
//! past which a router's 404 is no longer masked.

use super::*;

impl RouteOutage {
    /// Retry-After for a 503 of a request that waited `waited`: from observed outages (their
    /// median, minus the time already waited, within bounds) or the fixed value.
    pub fn retry_after(&self, waited: Duration) -> Duration {
        let settings = self.settings();
        let cfg = &settings.cfg;
        if !cfg.enabled || cfg.retry_after == RetryAfter::Fixed {
            return settings.retry_after;
        }
        let history = self.shared.history.lock().expect("history lock");
        let typical = if history.is_empty() {
            settings.retry_after
        } else {
            let mut sorted: Vec<Duration> = history.iter().copied().collect();
            sorted.sort();
            sorted[sorted.len() / 2]
        };
        // Round up: "retry in 0.4 s" is "retry in 1 s" in whole seconds.
        let remaining = typical.saturating_sub(waited);
        let secs =
            Duration::from_secs(remaining.as_secs() + u64::from(remaining.subsec_nanos() > 0));
        secs.clamp(cfg.retry_after_min, cfg.retry_after_max)
    }

    /// Whether the route has been missing for longer than `horizon`: an outage is open (or
    /// dormant) since longer than that (an application answer would have ended it). Counted
    /// from the outage's start, not from the last answer: a quiet route (no request all night)
    /// is not "missing" before a request finds it so.
    pub fn beyond_horizon(&self, horizon: Duration) -> bool {
        if !self.in_outage() {
            return false;
        }
        let Some(since) = self.lock().since() else {
            return false;
        };
        now().saturating_duration_since(since) > horizon
    }

    /// A route-missing 404 passed through because of the horizon. Warns once per outage and
    /// releases every held request: past the horizon they are to
    /// get the router's 404 at once, not wait for their turn as the probe.
    pub fn horizon_exceeded(&self, horizon: Duration, upstream: &str) {
        let mut m = self.lock();
        // Still an outage for the metrics and alerts (`holdfast_upstream_up` 0), and now a
        // route-missing one, whatever it started as: new requests are no longer held for it.
        let effects = m.horizon_exceeded(now(), self.shared.next_id());
        if self.apply(&m, effects).horizon_warning {
            tracing::warn!(
                horizon_secs = horizon.as_secs_f64(),
                upstream,
                "the router has answered 404 for longer than the horizon; passing its 404s \
                 through. Check the upstream URL and the router's configuration"
            );
        }
    }

    /// Whether a new request should wait before being sent: an outage is open and awake, and it
    /// is not a route-missing one past the horizon (whose 404s pass straight through).
    pub fn holds_before_dispatch(&self, horizon: Duration) -> bool {
        if !self.is_active() {
            return false;
        }
        let past_horizon = self.beyond_horizon(horizon);
        !(past_horizon && self.lock().last_reason() == Some(RewriteReason::RouteMissing404))
    }
}
