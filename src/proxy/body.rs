//! Bodies that stream through the proxy.
//!
//! Nothing here collects a body. [`Timed`] forwards a response body frame by frame under an
//! *idle* timeout that every frame resets, never a total deadline, so an SSE stream may live for
//! hours. (The request side is in [`crate::replay`].)

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::{Instant, Sleep};

use super::ending::EndAt;
use super::in_flight::Flight;
use crate::errors::BoxError;
use crate::metrics::{Abort, AbortLabel};

/// The body type the proxy answers with: an upstream stream or a synthetic response.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A response body stalled (no frame within the idle timeout).
#[derive(Debug, thiserror::Error)]
#[error("the upstream response body was idle for {0:?}")]
pub struct IdleTimeout(pub Duration);

fn deadline(idle: Duration) -> Instant {
    // `Duration::MAX` means "no timeout"; keep the addition from overflowing.
    Instant::now()
        .checked_add(idle)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}

pin_project_lite::pin_project! {
    /// A response body forwarded under an idle timeout, optionally after bytes already read
    /// (a peeked body), with a guard dropped when the stream ends (e.g. the SSE gauge).
    pub struct Timed<B> {
        prefix: Option<Bytes>,
        #[pin]
        inner: B,
        idle: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
        guard: Option<Box<dyn Send>>,
        // Not boxed with `guard`: every forwarded response has one, and a box is an allocation.
        flight: Option<Flight>,
        aborts: Option<Family<AbortLabel, Counter>>,
        // An event stream ends cleanly when holdfast's shutdown reaches this phase.
        ending: Option<Box<EndAt>>,
    }
}

impl<B> Timed<B> {
    /// Forwards `inner` after `prefix`, failing when no frame arrives for `idle`.
    pub fn new(prefix: Option<Bytes>, inner: B, idle: Duration) -> Self {
        Self {
            prefix: prefix.filter(|p| !p.is_empty()),
            inner,
            idle,
            sleep: None,
            guard: None,
            flight: None,
            aborts: None,
            ending: None,
        }
    }

    /// Ends the body cleanly (its last frame, no error) when `at` is due: an event stream at
    /// holdfast's shutdown.
    pub fn ending_at(mut self, at: EndAt) -> Self {
        self.ending = Some(Box::new(at));
        self
    }

    /// Counts aborted responses (`holdfast_response_aborts_total`) in `family`.
    pub fn counting_aborts(mut self, family: &Family<AbortLabel, Counter>) -> Self {
        self.aborts = Some(family.clone());
        self
    }

    /// Keeps the request in flight (for a pause's drain) exactly as long as the body.
    pub fn in_flight(mut self, flight: Option<Flight>) -> Self {
        self.flight = flight;
        self
    }

    /// Keeps `guard` alive exactly as long as the body.
    pub fn with_guard(mut self, guard: impl Send + 'static) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }
}

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.sleep = None;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                *this.guard = None;
                *this.flight = None;
                count_abort(this.aborts, Abort::upstream_error);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                *this.guard = None;
                *this.flight = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.ending.as_mut().is_some_and(|e| e.poll_due(cx)) {
                    // holdfast is shutting down: a clean end, which the client can resume from.
                    *this.guard = None;
                    *this.flight = None;
                    return Poll::Ready(None);
                }
                let idle = *this.idle;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline(idle))));
                ready!(sleep.as_mut().poll(cx));
                *this.guard = None;
                *this.flight = None;
                count_abort(this.aborts, Abort::idle_timeout);
                Poll::Ready(Some(Err(Box::new(IdleTimeout(idle)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(p) = &self.prefix else {
            return inner;
        };
        let n = p.len() as u64;
        // Built from an unbounded hint: SizeHint asserts lower <= upper at every step.
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + n);
        if let Some(u) = inner.upper() {
            hint.set_upper(u + n);
        }
        hint
    }
}

fn count_abort(family: &Option<Family<AbortLabel, Counter>>, reason: Abort) {
    if let Some(f) = family {
        f.get_or_create(&AbortLabel { reason }).inc();
    }
}

/// Largest `tools/list` answer read for annotations; a larger one streams through unread.
pub const MAX_LEARN_BYTES: usize = 1024 * 1024;

pin_project_lite::pin_project! {
    /// A `tools/list` answer on its way to the client: forwarded frame by frame as ever, with a
    /// copy (at most [`MAX_LEARN_BYTES`], within the learning budget shared by every answer in
    /// flight) read for tool annotations once it holds the answer, before its last frame goes
    /// on.
    pub struct Learn {
        #[pin]
        inner: ProxyBody,
        copy: Option<LearnCopy>,
        is_sse: bool,
    }
}

/// The copy of a `tools/list` answer, and its share of the learning budget, given back when
/// the copy is read or dropped.
struct LearnCopy {
    bytes: bytes::BytesMut,
    /// An event stream's events as they arrive (`None` for a JSON answer), to see its answer.
    events: Option<crate::sse::Parser>,
    /// The answer is complete: an event carrying a JSON-RPC response has arrived.
    answered: bool,
    idempotency: std::sync::Arc<crate::idempotent::Idempotency>,
    /// The Host the request went to: whose tools these are.
    host: Option<http::HeaderValue>,
}

impl Drop for LearnCopy {
    fn drop(&mut self) {
        self.idempotency.release_learning(self.bytes.len());
    }
}

impl LearnCopy {
    /// Appends `data`, or gives up (false) past the size cap or the shared budget.
    fn push(&mut self, data: &[u8]) -> bool {
        if self.bytes.len() + data.len() > MAX_LEARN_BYTES
            || !self.idempotency.reserve_learning(data.len())
        {
            tracing::debug!("a tools/list answer is too large to read for annotations now");
            return false;
        }
        self.bytes.extend_from_slice(data);
        if let Some(events) = self.events.as_mut() {
            let answered = &mut self.answered;
            events.feed(data, |event| {
                *answered |= crate::jsonrpc::one(event.data.as_bytes())
                    .is_some_and(|m| m.kind() == crate::jsonrpc::Kind::Response);
            });
        }
        true
    }

    fn learn(self, is_sse: bool) {
        self.idempotency
            .learn_from(self.host.as_ref(), is_sse, &self.bytes);
    }
}

impl Learn {
    /// Reads `inner` (an SSE stream when `is_sse`), the answer of the server behind `host`,
    /// for what it teaches `idempotency`.
    pub fn new(
        inner: ProxyBody,
        is_sse: bool,
        idempotency: std::sync::Arc<crate::idempotent::Idempotency>,
        host: Option<http::HeaderValue>,
    ) -> Self {
        Self {
            inner,
            copy: Some(LearnCopy {
                bytes: bytes::BytesMut::new(),
                events: is_sse.then(|| crate::sse::Parser::new(MAX_LEARN_BYTES)),
                answered: false,
                idempotency,
                host,
            }),
            is_sse,
        }
    }
}

impl Body for Learn {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let (Some(copy), Some(data)) = (this.copy.as_mut(), frame.data_ref()) {
                    if !copy.push(data) {
                        *this.copy = None;
                    }
                }
                // Learned before this frame goes on: a client that lists the tools and calls one
                // at once must find it learned. A JSON answer has ended (hyper may not poll again
                // once the body says so); an event stream may stay open after the event that
                // answers, so it is learned as soon as that event is complete.
                let answered =
                    inner.is_end_stream() || this.copy.as_ref().is_some_and(|c| c.answered);
                if answered {
                    if let Some(copy) = this.copy.take() {
                        copy.learn(*this.is_sse);
                    }
                }
            }
            // A broken answer teaches nothing.
            Some(Err(_)) => *this.copy = None,
            None => {
                if let Some(copy) = this.copy.take() {
                    copy.learn(*this.is_sse);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
