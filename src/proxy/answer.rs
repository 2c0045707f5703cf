//! What the client gets: an upstream answer passed through, a 503 for a missing backend, a 502
//! for a failure after the request may have reached the application.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH};
use http::{Response, StatusCode, Version};
use http_body_util::BodyExt;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Duration;

use super::body::{ProxyBody, Timed};
use super::ending::Phase;
use super::in_flight::Flight;
use super::{headers, Note, BODY_ID_WAIT};
use crate::classify::{FailReason, RewriteReason};
use crate::hold::{OutageRoutes, RouteOutage, Ticket};
use crate::metrics::{Metrics, ReasonLabel, RewriteAction};
use crate::replay::BodyHandle;
use crate::respond;
use crate::upstream::{ClientBodyFault, UpstreamBody};

use super::headers::X_ACCEL_BUFFERING;

/// A response head with its (peeked) body.
pub(super) type Answer = (http::response::Parts, Peeked);

/// A response body after a peek.
pub(super) struct Peeked {
    /// The complete body when it was read to its end.
    pub(super) complete: Option<Bytes>,
    /// Bytes read before giving up on a too-large body.
    pub(super) prefix: Option<Bytes>,
    /// The unread rest.
    pub(super) rest: UpstreamBody,
}

/// What builds the client's answer: a passed one streamed under the idle timeout, counted and
/// ended by holdfast's shutdown; holdfast's own (503, 502, 400), counted.
pub(super) struct Answers {
    pub(super) metrics: Arc<Metrics>,
    /// `streams.idle_timeout_secs`.
    pub(super) stream_idle: Duration,
    /// holdfast's own shutdown, which ends passed event streams.
    pub(super) ending: Arc<super::ending::Ending>,
    /// Learns tool annotations from the `tools/list` answers passed.
    pub(super) idempotency: Arc<crate::idempotent::Idempotency>,
    /// The outages: an event stream that ends unanswered opens the upstream's.
    pub(super) hold: Arc<OutageRoutes>,
}

impl Answers {
    /// Answers 503 + Retry-After for a missing backend: at once, or after a hold that ended
    /// without a release.
    pub(super) async fn unavailable(
        &self,
        reason: RewriteReason,
        outages: &RouteOutage,
        ticket: &Ticket,
        handle: &BodyHandle,
    ) -> (Response<ProxyBody>, Note) {
        self.metrics
            .rewrites
            .get_or_create(&ReasonLabel::new(reason, RewriteAction::answered_503))
            .inc();
        outages.answering_503();
        let retry_after = outages.retry_after(ticket.waited());
        let body = handle.read_whole(BODY_ID_WAIT).await;
        (
            respond::unavailable(reason, retry_after, body.as_deref()),
            Note {
                upstream_status: None,
                action: super::Action::Rewritten,
            },
        )
    }

    pub(super) fn failed(
        &self,
        reason: FailReason,
        version: Version,
        upstream_status: Option<StatusCode>,
    ) -> (Response<ProxyBody>, Note) {
        self.metrics
            .upstream_failures
            .get_or_create(&reason.into())
            .inc();
        match reason {
            // Already logged as an error, with its cause, where the cause was at hand.
            FailReason::UpstreamTls => {}
            _ => tracing::warn!(
                reason = reason.as_str(),
                "upstream failed after the request may have reached it; answering 502"
            ),
        }
        (
            respond::bad_gateway(reason, version),
            Note {
                upstream_status,
                action: super::Action::Failed,
            },
        )
    }

    /// The client broke its request body once the upload had begun: a 400 (408 for a stall),
    /// counted as the client's, never as the upstream's failure.
    pub(super) fn client_body_failed(
        &self,
        fault: ClientBodyFault,
        version: Version,
    ) -> (Response<ProxyBody>, Note) {
        self.metrics
            .client_body_failures
            .get_or_create(&fault.into())
            .inc();
        // A client that went away is not worth a warning: nobody reads this answer.
        tracing::debug!(?fault, "the client's request body failed");
        (
            respond::client_body(fault, version),
            Note {
                upstream_status: None,
                action: super::Action::ClientBody,
            },
        )
    }

    /// Passes an upstream response through (`is_sse`: its `Content-Type` is an event stream, as
    /// the caller found): hop-by-hop headers removed, body streamed under the
    /// idle timeout, SSE marked unbuffered and counted while it lives; a `tools/list` answer
    /// (`learn`: the Host of the server that answered it) read for tool annotations on its way.
    /// `sse`: the answer is an event stream, which ends cleanly when holdfast's shutdown
    /// reaches that phase ([`super::ending`]).
    pub(super) fn pass(
        &self,
        head: &mut http::response::Parts,
        sse: Option<Phase>,
        peek: Peeked,
        learn: Option<Option<HeaderValue>>,
        flight: Option<Flight>,
    ) -> Response<ProxyBody> {
        // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3): hyper read the body by
        // its chunks, and a stale Content-Length passed on would cut it short for the client.
        if head.headers.contains_key(http::header::TRANSFER_ENCODING) {
            head.headers.remove(CONTENT_LENGTH);
        }
        headers::strip_hop_by_hop(&mut head.headers);
        let prefix = peek.complete.or(peek.prefix);
        let is_sse = sse.is_some();
        if let (true, Some(f)) = (is_sse, &flight) {
            f.streaming();
        }
        let timed = Timed::new(prefix, peek.rest, self.stream_idle)
            .counting_aborts(&self.metrics.response_aborts)
            .in_flight(flight);
        // The request stays in flight (for a pause's drain) as long as its body streams.
        let body = if is_sse {
            head.headers
                .entry(X_ACCEL_BUFFERING)
                .or_insert(HeaderValue::from_static("no"));
            let ends = sse.map_or(Phase::Over, |phase| phase);
            timed
                .with_guard(SseGuard::new(&self.metrics.sse_streams_active))
                .ending_at(self.ending.watch(ends))
                .boxed_unsync()
        } else {
            timed.boxed_unsync()
        };
        let body = match learn {
            Some(host) => {
                super::body::Learn::new(body, is_sse, self.idempotency.clone(), host).boxed_unsync()
            }
            None => body,
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.headers_mut() = std::mem::take(&mut head.headers);
        resp
    }
}

/// Counts one live SSE stream in `holdfast_sse_streams_active`.
struct SseGuard(Gauge);

impl SseGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        SseGuard(gauge.clone())
    }
}

impl Drop for SseGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The client went away while its request was held: nothing was sent, and nobody reads this.
/// Not a 502 (no upstream failed), not counted as one, and counted as a 499, not a 400.
pub(super) fn client_gone(version: Version) -> (Response<ProxyBody>, Note) {
    (
        respond::bad_request("the client went away while its request was held", version),
        Note {
            upstream_status: None,
            action: super::Action::Cancelled,
        },
    )
}
