//! The event streams of bridged requests, translated event by event: the answer to a 2026-07-28
//! client's request (src/proxy/forward/bridged.rs) gets the client's id and the 2026 result
//! fields, progress passes, what a 2026 client must not see is dropped
//! ([`crate::bridge::wire::event_to_modern`]); a `subscriptions/listen` stream standing in for a
//! 2025 client's GET stream (src/proxy/forward/modern.rs) loses what only a 2026 client reads
//! ([`crate::bridge::modern::listen_event`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::body::ProxyBody;
use crate::bridge::rounds::{Parked, Rounds};
use crate::bridge::wire::{self, Ask, EventOut, Sent};
use crate::bridge::{Bridge, CancelOnDrop, Principal};
use crate::errors::BoxError;
use crate::sse;

pub use crate::bridge::MAX_EVENT;

pin_project_lite::pin_project! {
    /// An SSE answer to a bridged request, rewritten event by event.
    #[project = TranslatedProj]
    pub struct Translated {
        #[pin]
        inner: ProxyBody,
        parser: sse::Parser,
        reading: Reading,
        // Cancels the request if the stream is dropped before its answer went by.
        cancel: Option<CancelOnDrop>,
        // Where the rest of the stream is parked when the server asks the client for input;
        // none where no input round can be (a listen, a call of no round's method).
        park: Option<Park>,
        // Events read before, still to translate (a resumed round's).
        pending: Vec<sse::Event>,
        // Trailers that arrived, sent after the last event.
        trailers: Option<Frame<Bytes>>,
        done: bool,
    }
}

/// What a translated stream is.
pub enum Reading {
    /// The answer to a 2026-07-28 client's request, sent as `Sent`.
    Answer(Sent),
    /// A `subscriptions/listen` stream for a 2025 client's GET.
    Listen,
}

/// What parking an input round takes (src/bridge/rounds.rs).
pub struct Park {
    pub bridge: Arc<Bridge>,
    pub principal: Principal,
    /// The call's head: the server's request is answered with it.
    pub head: http::Request<()>,
    pub peer: std::net::SocketAddr,
    /// How long a round waits for its client's retry.
    pub wait: Duration,
}

impl Translated {
    pub fn new(inner: ProxyBody, reading: Reading, cancel: Option<CancelOnDrop>) -> Translated {
        Translated {
            inner,
            parser: sse::Parser::new(MAX_EVENT),
            reading,
            cancel,
            park: None,
            pending: Vec::new(),
            trailers: None,
            done: false,
        }
    }

    /// Parks the stream at the server's first request for input, per `park`.
    pub fn parking(mut self, park: Park) -> Translated {
        self.park = Some(park);
        self
    }

    /// The rest of a parked round's stream, answering its client's retry `client_id`.
    pub fn resume(parked: Parked, client_id: serde_json::Value, park: Park) -> Translated {
        let sent = Sent {
            client_id,
            ..parked.sent
        };
        Translated {
            inner: parked.body,
            parser: parked.parser,
            reading: Reading::Answer(sent),
            cancel: parked.cancel,
            park: Some(park),
            pending: parked.after,
            trailers: None,
            done: false,
        }
    }
}

/// Writes `event` (its data as `data` lines, its id and type kept) to `out`.
pub(super) fn write_event(out: &mut BytesMut, event: &sse::Event, data: &[u8]) {
    if event.event != "message" {
        out.put_slice(b"event: ");
        out.put_slice(event.event.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(id) = &event.id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    if event.has_data {
        for line in data.split(|&b| b == b'\n') {
            out.put_slice(b"data: ");
            out.put_slice(line);
            out.put_u8(b'\n');
        }
    }
    out.put_u8(b'\n');
}

/// What translating some events came to.
#[derive(Default)]
struct Translation {
    out: BytesMut,
    /// The request's answer was among them.
    answered: bool,
    /// The server asked for input: the round, and the events after it (left untranslated).
    asked: Option<(Ask, Vec<sse::Event>)>,
}

/// The translation of `events`; a request for input stops it when `parks` (what follows is
/// left for the round's retry), else it is dropped.
fn translate(events: Vec<sse::Event>, reading: &Reading, parks: bool) -> Translation {
    let mut done = Translation::default();
    for event in events {
        if let Some((_, after)) = done.asked.as_mut() {
            after.push(event);
            continue;
        }
        if event.cut {
            tracing::warn!(
                limit = MAX_EVENT,
                "bridge: an event longer than the limit was dropped from a translated stream"
            );
            continue;
        }
        let data = event.data.as_bytes();
        let translated = match reading {
            Reading::Answer(asked) => wire::event_to_modern(data, asked),
            Reading::Listen => crate::bridge::modern::listen_event(data),
        };
        match translated {
            EventOut::Pass => write_event(&mut done.out, &event, data),
            EventOut::Drop => {}
            EventOut::Answer(answer) => {
                done.answered = true;
                write_event(&mut done.out, &event, &answer);
            }
            EventOut::Ask(ask) if parks => done.asked = Some((ask, Vec::new())),
            EventOut::Ask(ask) => {
                tracing::debug!(method = ask.method, "bridge: a server's request dropped");
            }
        }
    }
    done
}

impl Body for Translated {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            let events = if this.pending.is_empty() {
                match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => this.parser.events(&data),
                        Err(trailers) => {
                            *this.trailers = Some(trailers);
                            *this.done = true;
                            continue;
                        }
                    },
                    // An event cut off by the end is no event (the reader never completes it).
                    // The server ended the stream: nothing is left running to cancel.
                    None => {
                        if let Some(cancel) = this.cancel.as_mut() {
                            cancel.answered();
                        }
                        *this.done = true;
                        continue;
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                }
            } else {
                std::mem::take(this.pending)
            };
            let mut done = translate(events, this.reading, this.park.is_some());
            if let (true, Some(cancel)) = (done.answered, this.cancel.as_mut()) {
                cancel.answered();
            }
            if let Some((ask, after)) = done.asked.take() {
                park(&mut this, ask, after, &mut done.out);
            }
            if !done.out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(done.out.freeze()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Ends the client's stream with an input round asking `ask`, written to `out`, and parks the
/// rest of the upstream stream (`after` first) until the client calls again.
fn park(this: &mut TranslatedProj<'_>, ask: Ask, after: Vec<sse::Event>, out: &mut BytesMut) {
    let (Some(park), Reading::Answer(sent)) = (this.park.take(), &*this.reading) else {
        return;
    };
    let handle = Rounds::handle();
    let answer = wire::input_required(&sent.client_id, &ask, &handle);
    out.put_slice(&sse::data_event(&answer));
    let empty = http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync();
    let parked = Parked {
        body: std::mem::replace(this.inner.as_mut().get_mut(), empty),
        parser: std::mem::replace(this.parser, sse::Parser::new(MAX_EVENT)),
        after,
        ask,
        sent: sent.clone(),
        head: park.head,
        peer: park.peer,
        cancel: this.cancel.take(),
        principal: park.principal,
        until: Instant::now() + park.wait,
    };
    tracing::debug!(method = parked.ask.method, "bridge: an input round parked");
    let (bridge, until) = (park.bridge.clone(), parked.until);
    park.bridge.rounds().park(handle.clone(), parked);
    // Let go at its time even if no other round comes by to sweep it.
    tokio::spawn(async move {
        tokio::time::sleep_until(until.into()).await;
        bridge.rounds().expire(&handle);
    });
    *this.done = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> Sent {
        Sent {
            upstream_id: 4,
            client_id: serde_json::json!(1),
            method: "tools/call".into(),
            log_level: None,
        }
    }

    #[tokio::test]
    async fn events_cut_anywhere_come_out_translated_whole() {
        let stream = concat!(
            "event: message\nid: a\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\r\n\r\n",
        );
        // Every cut of the stream into two frames reads alike.
        for cut in 0..stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            let inner = Frames(vec![Bytes::copy_from_slice(b), Bytes::copy_from_slice(a)]);
            let bridge = crate::bridge::Bridge::new(
                &crate::config::Bridge::default(),
                prometheus_client::metrics::gauge::Gauge::default(),
            );
            let cancel = bridge.cancel_on_drop(crate::bridge::Cancel {
                head: http::Request::new(()),
                upstream_id: 4,
                peer: ([127, 0, 0, 1], 1).into(),
            });
            let body = Translated::new(
                ProxyBody::new(inner),
                Reading::Answer(asked()),
                Some(cancel),
            );
            let out = body.collect().await.unwrap().to_bytes();
            assert_eq!(
                std::str::from_utf8(&out).unwrap(),
                concat!(
                    "id: a\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n",
                    "data: {\"id\":1,\"jsonrpc\":\"2.0\",\"result\":{\"resultType\":\"complete\"}}\n\n",
                ),
                "cut at {cut}"
            );
        }
    }

    /// A body of these frames, the last first.
    struct Frames(Vec<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop().map(|b| Ok(Frame::data(b))))
        }
    }
}
