//! Validating `[hold]`: the hold's bounds, its backoff, Retry-After and the health check.

use std::time::Duration;

use super::validate::Validator;
use super::{Hold, RawHold, RetryAfter};

impl Validator<'_> {
    /// Checks `[hold]`; `None` when a problem was recorded.
    pub(super) fn hold(&mut self, h: &RawHold) -> Option<Hold> {
        let hold_timeout = self.secs("hold.timeout_secs", h.timeout_secs);
        let check_interval = if h.check_interval_secs == 0.0 {
            Some(None)
        } else {
            self.secs("hold.check_interval_secs", h.check_interval_secs)
                .map(Some)
        };
        let retry_after_mode = match h.retry_after.as_str() {
            "observed" => Some(RetryAfter::Observed),
            "fixed" => Some(RetryAfter::Fixed),
            other => self.fail(
                "hold.retry_after",
                format!("expected `observed` or `fixed`, got `{other}`"),
            ),
        };
        if h.max_body_bytes > h.max_buffered_bytes {
            self.fail::<()>(
                "hold.max_body_bytes",
                format!(
                    "larger than hold.max_buffered_bytes ({}): no such body could ever be held",
                    h.max_buffered_bytes
                ),
            );
        }
        if h.max_requests == 0 {
            self.fail::<()>("hold.max_requests", "must be at least 1".into());
        }
        if h.backoff_initial_ms == 0 {
            self.fail::<()>("hold.backoff_initial_ms", "must be at least 1".into());
        }
        if h.backoff_max_ms < h.backoff_initial_ms {
            self.fail::<()>(
                "hold.backoff_max_ms",
                format!(
                    "must not be below hold.backoff_initial_ms ({})",
                    h.backoff_initial_ms
                ),
            );
        }
        if h.retry_after_min_secs == 0 {
            self.fail::<()>("hold.retry_after_min_secs", "must be at least 1".into());
        }
        let probe_path = match h.probe_path.as_str() {
            "" => Some(None),
            path => match http::uri::PathAndQuery::try_from(path) {
                Ok(pq) if path.starts_with('/') => Some(Some(pq)),
                _ => self.fail(
                    "hold.probe_path",
                    format!(
                        "must be empty (no health check) or a path starting with `/`; got {path:?}"
                    ),
                ),
            },
        };
        if h.retry_after_max_secs < h.retry_after_min_secs {
            self.fail::<()>(
                "hold.retry_after_max_secs",
                format!(
                    "must not be below hold.retry_after_min_secs ({})",
                    h.retry_after_min_secs
                ),
            );
        }

        Some(Hold {
            enabled: h.enabled,
            timeout: hold_timeout?,
            max_body_bytes: h.max_body_bytes,
            max_requests: h.max_requests,
            max_buffered_bytes: h.max_buffered_bytes,
            backoff_initial: Duration::from_millis(h.backoff_initial_ms),
            backoff_max: Duration::from_millis(h.backoff_max_ms),
            retry_after: retry_after_mode?,
            retry_after_min: Duration::from_secs(h.retry_after_min_secs),
            retry_after_max: Duration::from_secs(h.retry_after_max_secs),
            probe_path: probe_path?,
            check_interval: check_interval?,
        })
    }
}
