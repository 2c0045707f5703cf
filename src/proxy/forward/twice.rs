//! Requests safe to run twice (a read-only method, an idempotent tool): which they are, and each
//! resend counted and said. When they go again is their life's to decide ([`crate::proxy::life`]).

use http::header::HOST;

use crate::proxy::life::{Resend, ResendWhy};
use crate::proxy::{Proxy, Target};
use crate::replay::BodyHandle;

impl Proxy {
    /// Counts and says one resend of a request safe to run twice after an ambiguous failure.
    pub(super) fn count_resend(&self, resend: Resend) {
        self.metrics
            .safe_retries
            .get_or_create(&resend.kind.into())
            .inc();
        let what = match resend.why {
            ResendWhy::OnceMore => "it goes once more",
            ResendWhy::HeldUntilBack => "held until the upstream is back",
            ResendWhy::RouterAnswered => "a router answered for the backend: held until it is back",
            // Said already, as the stream's unanswered end.
            ResendWhy::Unanswered => return,
        };
        tracing::info!(
            kind = resend.kind.as_str(),
            breaks = resend.breaks,
            "the upstream failed after a request safe to run twice may have reached it: {what}"
        );
    }

    /// Why the request is safe to run twice, if it is and its body was kept whole.
    pub(super) fn safe_to_repeat(
        &self,
        handle: &BodyHandle,
        target: &Target,
    ) -> Option<crate::idempotent::SafeKind> {
        if !self.idempotency.enabled() || !handle.is_replayable() {
            return None;
        }
        let headers = &target.headers;
        let host = headers.get(HOST);
        handle
            .with_complete_body(|body| self.idempotency.judge(host, headers, body))
            .flatten()
    }
}
