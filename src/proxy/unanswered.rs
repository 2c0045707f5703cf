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
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::answer::Peeked;
use crate::classify::{FailReason, RewriteReason};
use crate::errors::BoxError;
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
    if event.cut {
        return true;
    }
    if !event.has_data || event.event != "message" {
        return false;
    }
    crate::jsonrpc::one(event.data.as_bytes())
        .is_some_and(|m| m.kind() == crate::jsonrpc::Kind::Response)
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
    match until_first(&mut reader, &mut read, &mut peek.rest, wait).await {
        Err(err) => First::Broken(err),
        Ok(true) => {
            peek.complete = Some(read.freeze());
            ended(reader)
        }
        Ok(false) => {
            peek.prefix = Some(read.freeze());
            First::Passes((!reader.settled()).then_some(reader))
        }
    }
}

/// Reads `body` into `reader` (and `read`) until an event was read, the body ended (true), or
/// `wait` passed.
async fn until_first<B>(
    reader: &mut Reader,
    read: &mut BytesMut,
    body: &mut B,
    wait: Duration,
) -> Result<bool, BoxError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if reader.events > 0 {
            return Ok(false);
        }
        if body.is_end_stream() {
            return Ok(true);
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Ok(false),
            Ok(None) => return Ok(true),
            Ok(Some(Err(err))) => return Err(err.into()),
            Ok(Some(Ok(frame))) => {
                // Trailers on an event stream are dropped, as a peeked body's are.
                if let Ok(data) = frame.into_data() {
                    reader.feed(&data);
                    read.extend_from_slice(&data);
                }
            }
        }
    }
}

fn ended(reader: Reader) -> First {
    if reader.settled() {
        First::Passes(None)
    } else {
        First::Unanswered
    }
}

/// What is done, once, when a passed stream ends unanswered (before its event is added).
pub(super) type Noticed = Box<dyn FnOnce() + Send>;

pin_project_lite::pin_project! {
    /// A passed event stream, watched for an end without the answer (see the module's doc).
    pub(super) struct Watched<B> {
        #[pin]
        inner: B,
        // Present while the stream is not settled.
        reader: Option<Reader>,
        // The request's id, and what to do, for the event added at an unanswered end.
        tail: Option<(crate::jsonrpc::Id, Noticed)>,
        // The request id holdfast passed on or made, quoted in that event's data.
        request: Option<http::HeaderValue>,
        // The inner body ended (and the event, if any, was added).
        finished: bool,
    }
}

impl<B> Watched<B> {
    pub(super) fn new(
        inner: B,
        reader: Reader,
        id: crate::jsonrpc::Id,
        request: Option<http::HeaderValue>,
        noticed: Noticed,
    ) -> Self {
        Watched {
            inner,
            reader: Some(reader),
            tail: Some((id, noticed)),
            request,
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
                    (Some(reader), Some((id, noticed))) if reader.parser.at_boundary() => {
                        noticed();
                        let event = crate::respond::unanswered_event(&id, this.request.as_ref());
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

/// The id of the JSON-RPC request whose answer the upstream's head announces as an event
/// stream (`is_sse`): a POST of one request (its body kept whole), answered 2xx, with events
/// holdfast can read. A compressed stream (a front proxy's gzip: nginx with `gzip_types
/// text/event-stream`) is not watched: its events cannot be read here, so an answered stream
/// would look unanswered, and no event could be added to it.
pub(super) fn awaited_id(
    method: &http::Method,
    head: &http::response::Parts,
    is_sse: bool,
    handle: &crate::replay::BodyHandle,
) -> Option<crate::jsonrpc::Id> {
    if method != http::Method::POST || !head.status.is_success() || !is_sse {
        return None;
    }
    let coded = head
        .headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .any(|coding| !coding.as_bytes().eq_ignore_ascii_case(b"identity"));
    if coded {
        return None;
    }
    handle
        .with_complete_body(crate::jsonrpc::request_id)
        .flatten()
}

impl super::answer::Answers {
    /// A passed answer whose event stream has not yet carried the answer to request `id`: its
    /// body watched, and no `Content-Length` (an event may be added at its end). An unanswered
    /// end is counted and logged, and opens the upstream's outage: the server is going away, so
    /// what comes next is held instead of being sent into it.
    pub(super) fn watch_unanswered(
        &self,
        resp: http::Response<super::body::ProxyBody>,
        reader: Reader,
        id: crate::jsonrpc::Id,
    ) -> http::Response<super::body::ProxyBody> {
        let (mut parts, body) = resp.into_parts();
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let (metrics, upstream) = (self.metrics.clone(), self.hold.upstream().clone());
        // The stream ends after the request's future did: its id is taken along for the log.
        let request = crate::telemetry::request_id();
        let quoted = request.clone();
        let noticed: Noticed = Box::new(move || {
            metrics
                .upstream_failures
                .get_or_create(&FailReason::Unanswered.into())
                .inc();
            crate::telemetry::in_request(request, || {
                tracing::warn!(
                    reason = FailReason::Unanswered.as_str(),
                    "the upstream ended an event stream without answering its request \
                     (shutting down?); the client gets a JSON-RPC error instead of waiting for \
                     its timeout"
                )
            });
            upstream.missing(RewriteReason::Unanswered);
        });
        let body = Watched::new(body, reader, id, quoted, noticed).boxed_unsync();
        http::Response::from_parts(parts, body)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::sync::mpsc;

    use super::*;

    /// A body the test feeds frame by frame; dropping the sender ends it, an `Err` breaks it.
    struct Feed(mpsc::UnboundedReceiver<Result<&'static str, ()>>);

    impl Body for Feed {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|next| {
                next.map(|chunk| {
                    chunk
                        .map(|c| Frame::data(Bytes::from_static(c.as_bytes())))
                        .map_err(|()| BoxError::from("broken"))
                })
            })
        }
    }

    fn feed(
        chunks: &[&'static str],
        end: bool,
    ) -> (Feed, mpsc::UnboundedSender<Result<&'static str, ()>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        for chunk in chunks {
            tx.send(Ok(*chunk)).unwrap();
        }
        if end {
            // The receiver ends once the last sender is gone: hand out a clone to keep.
            let keep = tx.clone();
            drop(tx);
            return (Feed(rx), keep);
        }
        (Feed(rx), tx)
    }

    const RESULT: &str =
        "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\r\n\r\n";
    const PROGRESS: &str = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\
                            \"params\":{\"progress\":1}}\n\n";

    fn reader_of(stream: &str) -> Reader {
        let mut reader = Reader::new();
        reader.feed(stream.as_bytes());
        reader
    }

    #[test]
    fn a_response_or_an_event_id_settles_a_stream_and_nothing_else_does() {
        assert!(reader_of(RESULT).answered);
        assert!(
            reader_of("data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":1}}\r\r").answered
        );
        // A notification, a server's own request, a comment, a priming event's empty data.
        let request = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"sampling/createMessage\",\"params\":{\"result\":1}}\n\n";
        for stream in [
            PROGRESS,
            request,
            ": ping\n\n",
            "event: other\ndata: {\"result\":1}\n\n",
        ] {
            let reader = reader_of(stream);
            assert!(!reader.settled(), "{stream:?}");
            assert_eq!(
                reader.events,
                usize::from(!stream.starts_with(':')),
                "{stream:?}"
            );
        }
        // A priming event: the client can resume, so the server may end the stream.
        let priming = reader_of("id: 0\nretry: 3000\ndata:\n\n");
        assert!(priming.resumable && !priming.answered);
        // An event too large to read whole is taken as the answer.
        let large = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"p\":\"{}\"}}\n\n",
            "a".repeat(DATA_CAP)
        );
        assert!(reader_of(&large).answered);
    }

    #[tokio::test]
    async fn until_first_stops_at_the_first_event_the_end_or_the_wait() {
        tokio::time::pause();
        let wait = Duration::from_secs(1);
        // The first event, even in two frames: the rest stays unread.
        let (mut body, _tx) = feed(
            &[
                "data: {\"jsonrpc\":",
                "\"2.0\",\"id\":7,\"result\":{}}\n\n",
                PROGRESS,
            ],
            false,
        );
        let (mut reader, mut read) = (Reader::new(), BytesMut::new());
        assert!(!until_first(&mut reader, &mut read, &mut body, wait)
            .await
            .unwrap());
        assert!(reader.answered);
        assert_eq!(
            body.0.len(),
            1,
            "the frame after the first event is not read"
        );
        // An end with no event: a head, then nothing (the Python SDK in its shutdown window).
        let (mut body, tx) = feed(&[], false);
        drop(tx);
        let (mut reader, mut read) = (Reader::new(), BytesMut::new());
        assert!(until_first(&mut reader, &mut read, &mut body, wait)
            .await
            .unwrap());
        assert!(!reader.settled());
        // Nothing for the whole wait: the stream passes, unsettled, with what it sent so far.
        let (mut body, _tx) = feed(&[": ping\n\n"], false);
        let (mut reader, mut read) = (Reader::new(), BytesMut::new());
        let started = tokio::time::Instant::now();
        assert!(!until_first(&mut reader, &mut read, &mut body, wait)
            .await
            .unwrap());
        // (The paused clock's timer wheel rounds up to its next millisecond.)
        let waited = started.elapsed();
        assert!(
            waited >= wait && waited <= wait + Duration::from_millis(1),
            "{waited:?}"
        );
        assert_eq!(&read[..], b": ping\n\n");
        // Broken before its first event.
        let (mut body, tx) = feed(&[": ping\n\n"], false);
        tx.send(Err(())).unwrap();
        let (mut reader, mut read) = (Reader::new(), BytesMut::new());
        assert!(until_first(&mut reader, &mut read, &mut body, wait)
            .await
            .is_err());
    }

    /// Runs `chunks` through a [`Watched`] body; what the client reads and how often the
    /// unanswered end was noticed.
    async fn watched(chunks: &[&'static str]) -> (String, usize) {
        let (body, tx) = feed(chunks, false);
        drop(tx);
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let noticed: Noticed = Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let watched = Watched::new(
            body,
            Reader::new(),
            crate::jsonrpc::request_id(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap(),
            Some(http::HeaderValue::from_static("req-7")),
            noticed,
        );
        assert!(!watched.is_end_stream());
        assert_eq!(watched.size_hint().exact(), None, "an event may be added");
        let bytes = watched.collect().await.unwrap().to_bytes();
        (
            String::from_utf8(bytes.to_vec()).unwrap(),
            count.load(Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn a_watched_stream_that_ends_unanswered_gets_a_json_rpc_error_with_the_request_id() {
        let (text, noticed) = watched(&[PROGRESS]).await;
        assert_eq!(noticed, 1);
        let added = text
            .strip_prefix(PROGRESS)
            .expect("the server's events pass first");
        let mut events = sse::Parser::new(1 << 20).events(added.as_bytes());
        assert_eq!(events.len(), 1, "{added:?}");
        let error: serde_json::Value = serde_json::from_str(&events.remove(0).data).unwrap();
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["code"], crate::respond::JSONRPC_UNANSWERED);
        assert_eq!(error["error"]["data"]["reason"], "unanswered");
        // The request id, quoted as holdfast's own 503 and 502 quote it.
        assert_eq!(error["error"]["data"]["requestId"], "req-7");
    }

    #[tokio::test]
    async fn a_watched_stream_that_answered_resumable_or_was_cut_mid_event_passes_as_it_is() {
        for chunks in [
            &[PROGRESS, RESULT][..],
            &["id: 0\ndata:\n\n", PROGRESS][..],
            &[PROGRESS, "data: {\"jsonrpc\""][..],
        ] {
            let (text, noticed) = watched(chunks).await;
            assert_eq!(text, chunks.concat());
            assert_eq!(noticed, 0, "{chunks:?}");
        }
    }
}
