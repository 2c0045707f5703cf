//! An event stream that ends without the answer to the request it carries.
//!
//! A POST carrying a JSON-RPC request may be answered with `text/event-stream`: the server's
//! notifications and requests, then the response, then the end. A server that ends such a
//! stream cleanly before the response, without an event `id` the client could resume from with
//! `Last-Event-ID`, leaves its client waiting for an answer that never comes: the official
//! TypeScript and Java SDK clients wait out their request timeout (20-60 s) and report a failed
//! call.
//!
//! That is what a graceful shutdown does. The Python SDK's server under uvicorn, once it got
//! SIGTERM and until it closes its listener (up to 0.1 s), still reads requests on its open
//! connections; sse-starlette then ends every event stream at once, so a tool call arriving in
//! that window is answered `200 text/event-stream` with an empty body, and the tool still runs
//! after the stream ended, its result going nowhere.
//!
//! holdfast therefore reads the events of such a stream as they pass (never more than
//! [`DATA_CAP`] of one event's data), in two steps:
//! - [`first_event`]: before the answer's head goes to the client, up to [`FIRST_EVENT_WAIT`]
//!   for the stream's first event. A stream that ends before it, unanswered, is answered by the
//!   attempt loop as a request that may have run: held and sent again if it is safe to run twice,
//!   else a 502; and the server, going away, gets an outage of its own.
//! - [`Watched`]: a stream still open after that is passed, and if it then ends unanswered the
//!   client gets one more event, a JSON-RPC error with its request's id
//!   ([`crate::respond::unanswered_event`]), instead of the silence.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::answer::Peeked;
use super::body::BoxError;
use crate::classify::{FailReason, RewriteReason};
use crate::hold::Outages;
use crate::metrics::Metrics;
use crate::sse;

/// Longest the answer's head waits for its stream's first event. A server that ends its streams
/// while shutting down does so within milliseconds of the head; a slow tool's stream passes after
/// this wait and is watched while it streams.
pub(super) const FIRST_EVENT_WAIT: Duration = Duration::from_secs(1);

/// Most bytes of one event's data read to decide whether it is the answer. A larger event is
/// taken as the answer (no notification is that large) and the stream is no longer watched.
pub(super) const DATA_CAP: usize = 64 * 1024;

/// What a stream has said so far, read event by event.
pub(super) struct Reader {
    parser: sse::Parser,
    /// An event carried a JSON-RPC response (or was too large to tell).
    answered: bool,
    /// An event carried an `id`: the client can resume the stream with `Last-Event-ID`, and
    /// the server may end it at any time (the 2025-11-25 polling pattern).
    resumable: bool,
    /// Events read.
    events: usize,
}

impl Reader {
    pub(super) fn new() -> Self {
        Reader {
            parser: sse::Parser::new(DATA_CAP),
            answered: false,
            resumable: false,
            events: 0,
        }
    }

    /// Reads `bytes` of the stream.
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let (answered, resumable, events) =
            (&mut self.answered, &mut self.resumable, &mut self.events);
        self.parser.feed(bytes, |event| {
            *events += 1;
            *resumable |= event.id.is_some();
            *answered |= is_response(&event);
        });
    }

    /// Nothing the stream says from now on matters: it carried the answer, or it can be resumed.
    pub(super) fn settled(&self) -> bool {
        self.answered || self.resumable
    }
}

/// Whether an event carries a JSON-RPC response (a result or an error; not a request or a
/// notification, which have a `method`). The only response a POST's stream carries is its
/// request's (MCP's Streamable HTTP transport), so its id is not compared.
fn is_response(event: &sse::Event) -> bool {
    #[derive(serde::Deserialize)]
    struct Message {
        method: Option<serde::de::IgnoredAny>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    if event.cut {
        return true;
    }
    if !event.has_data || event.event != "message" {
        return false;
    }
    serde_json::from_str::<Message>(&event.data)
        .is_ok_and(|m| m.method.is_none() && (m.result.is_some() || m.error.is_some()))
}

/// How a stream began.
pub(super) enum First {
    /// It ended, cleanly, without the answer and without an event id.
    Unanswered,
    /// It broke before its first event: nothing of it reached the client.
    Broken(BoxError),
    /// It passes; while it is not settled, the reader goes on watching it.
    Passes(Option<Reader>),
}

/// Reads `peek`'s stream up to its first event, its end, or `wait`, whichever comes first. What
/// was read stays in `peek` (its prefix, or the whole body when it ended) to be passed on.
pub(super) async fn first_event(peek: &mut Peeked, wait: Duration) -> First {
    let mut reader = Reader::new();
    if let Some(complete) = &peek.complete {
        reader.feed(complete);
        return ended(reader);
    }
    let mut read = BytesMut::new();
    if let Some(prefix) = peek.prefix.take() {
        reader.feed(&prefix);
        read.extend_from_slice(&prefix);
    }
    let deadline = tokio::time::Instant::now() + wait;
    let ended_now = loop {
        if reader.events > 0 {
            break false;
        }
        if peek.rest.is_end_stream() {
            break true;
        }
        match tokio::time::timeout_at(deadline, peek.rest.frame()).await {
            Err(_) => break false,
            Ok(None) => break true,
            Ok(Some(Err(err))) => return First::Broken(Box::new(err)),
            Ok(Some(Ok(frame))) => {
                // Trailers on an event stream are dropped, as a peeked body's are.
                if let Ok(data) = frame.into_data() {
                    reader.feed(&data);
                    read.extend_from_slice(&data);
                }
            }
        }
    };
    if ended_now {
        peek.complete = Some(read.freeze());
        return ended(reader);
    }
    peek.prefix = Some(read.freeze());
    First::Passes((!reader.settled()).then_some(reader))
}

fn ended(reader: Reader) -> First {
    if reader.settled() {
        First::Passes(None)
    } else {
        First::Unanswered
    }
}

/// What holdfast does when a passed stream ends unanswered: counts it, says so, and opens the
/// upstream's outage (the server is going away: what comes next is held, not sent into it).
pub(super) struct OnUnanswered {
    pub(super) metrics: Arc<Metrics>,
    pub(super) upstream: Arc<Outages>,
}

impl OnUnanswered {
    fn noticed(&self) {
        self.metrics
            .upstream_failures
            .get_or_create(&FailReason::Unanswered.into())
            .inc();
        tracing::warn!(
            reason = FailReason::Unanswered.as_str(),
            "the upstream ended an event stream without answering its request (shutting down?); \
             the client gets a JSON-RPC error instead of waiting for its timeout"
        );
        self.upstream.missing(RewriteReason::Unanswered);
    }
}

pin_project_lite::pin_project! {
    /// A passed event stream, watched for an end without the answer (see the module's doc).
    pub(super) struct Watched<B> {
        #[pin]
        inner: B,
        // Present while the stream is not settled.
        reader: Option<Reader>,
        // The request's id, and what to do, for the event added at an unanswered end.
        tail: Option<(serde_json::Value, OnUnanswered)>,
        // The inner body ended (and the event, if any, was added).
        finished: bool,
    }
}

impl<B> Watched<B> {
    pub(super) fn new(inner: B, reader: Reader, id: serde_json::Value, on: OnUnanswered) -> Self {
        Watched {
            inner,
            reader: Some(reader),
            tail: Some((id, on)),
            finished: false,
        }
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes, Error = BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.finished {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(reader), Some(data)) = (this.reader.as_mut(), frame.data_ref()) {
                    reader.feed(data);
                    if reader.settled() {
                        *this.reader = None;
                        *this.tail = None;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                *this.finished = true;
                let reader = this.reader.take();
                let tail = this.tail.take();
                match (reader, tail) {
                    // A stream cut mid-event is left as it is: the client drops the partial
                    // event, and an event added after it would be read as its end.
                    (Some(reader), Some((id, on))) if reader.parser.at_boundary() => {
                        on.noticed();
                        let event = crate::respond::unanswered_event(&id);
                        Poll::Ready(Some(Ok(Frame::data(event))))
                    }
                    _ => Poll::Ready(None),
                }
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || (self.tail.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        if self.tail.is_none() {
            return inner;
        }
        // An event may still be added: no exact length.
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower());
        hint
    }
}

impl super::Proxy {
    /// A passed answer whose event stream has not yet carried the answer to request `id`: its
    /// body watched, and no `Content-Length` (an event may be added at its end).
    pub(super) fn watch_unanswered(
        &self,
        resp: http::Response<super::body::ProxyBody>,
        reader: Reader,
        id: serde_json::Value,
    ) -> http::Response<super::body::ProxyBody> {
        let (mut parts, body) = resp.into_parts();
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let on = OnUnanswered {
            metrics: self.metrics.clone(),
            upstream: self.hold.upstream().clone(),
        };
        let body = Watched::new(body, reader, id, on).boxed_unsync();
        http::Response::from_parts(parts, body)
    }
}
