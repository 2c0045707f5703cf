//! What happens to a request safe to run twice (a read-only method, an idempotent tool) when the
//! upstream fails after it may have reached the application: it goes once more, or is held
//! until the upstream is back, where any other request gets its 502 or 503.

use http::header::HOST;
use http::StatusCode;

use super::{Exchange, Next};
use crate::classify::{FailReason, Missing, RewriteReason};
use crate::proxy::attempts::AfterBreak;
use crate::proxy::Proxy;

impl Proxy {
    /// The upstream broke after the request may have reached the application (a reset, a close
    /// before the answer; `status`: the head, when one came). What comes next is
    /// [`Attempts::broke`]'s: a request safe to run twice goes once more at once (a one-off: one
    /// worker's crash, a keep-alive race); if it breaks again the server is dying or restarting
    /// under it, so it is held like a request that never reached it (the upstream-wide outage
    /// opens, reason `upstream_reset`) and goes once the server is back; a 502 otherwise.
    pub(super) async fn broke(&self, ex: &mut Exchange, status: Option<StatusCode>) -> Next {
        let kind = self.safe_to_repeat(ex);
        match (ex.attempts.broke(kind.is_some(), self.hold.enabled()), kind) {
            (AfterBreak::SendNow, Some(kind)) => {
                ex.handle.supersede();
                self.count_resend(kind, ex.attempts.breaks(), "it goes once more");
                Next::Again
            }
            (AfterBreak::Hold, Some(kind)) => {
                self.count_resend(
                    kind,
                    ex.attempts.breaks(),
                    "held until the upstream is back",
                );
                let missing = Missing {
                    reason: RewriteReason::UpstreamReset,
                    never_reached_app: false,
                };
                Box::pin(self.hold_for(missing, true, ex)).await
            }
            _ => Next::Answer(self.failed(FailReason::UpstreamReset, ex.version, status)),
        }
    }

    /// Whether a request that failed after it may have reached the application goes once more
    /// at once ([`Attempts::once_more`]: safe to run twice, its body kept whole, the first
    /// time). The failed attempt's body is stopped first.
    pub(super) fn may_send_again(&self, ex: &mut Exchange) -> bool {
        let kind = self.safe_to_repeat(ex);
        match kind {
            Some(kind) if ex.attempts.once_more(true) => {
                ex.handle.supersede();
                self.count_resend(kind, ex.attempts.breaks(), "it goes once more");
                true
            }
            _ => false,
        }
    }

    /// Whether a request a router answered with a 5xx that may follow a request the backend
    /// read (a 502, a 504) is held all the same: it is safe to run twice, so waiting for the
    /// backend and sending it again costs nothing a refused connect would not. Counted and said
    /// as a resend.
    pub(super) fn held_anyway(&self, ex: &Exchange) -> bool {
        let Some(kind) = self.safe_to_repeat(ex) else {
            return false;
        };
        self.count_resend(
            kind,
            ex.attempts.breaks(),
            "a router answered for the backend: held until it is back",
        );
        true
    }

    /// Counts and says one resend of a request safe to run twice after an ambiguous failure.
    pub(super) fn count_resend(&self, kind: crate::idempotent::SafeKind, breaks: u8, what: &str) {
        self.metrics.safe_retries.get_or_create(&kind.into()).inc();
        tracing::info!(
            kind = kind.as_str(),
            breaks,
            "the upstream failed after a request safe to run twice may have reached it: {what}"
        );
    }

    /// Why the request is safe to run twice, if it is and its body was kept whole.
    pub(super) fn safe_to_repeat(&self, ex: &Exchange) -> Option<crate::idempotent::SafeKind> {
        if !self.idempotency.enabled() || !ex.handle.is_replayable() {
            return None;
        }
        let headers = &ex.target.headers;
        let host = headers.get(HOST);
        ex.handle
            .with_complete_body(|body| self.idempotency.judge(host, headers, body))
            .flatten()
    }
}
