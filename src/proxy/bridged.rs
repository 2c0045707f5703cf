//! The event streams of bridged requests, translated event by event: the answer to a 2026-07-28
//! client's request (src/proxy/forward/bridged.rs) gets the client's id and the 2026 result
//! fields, progress passes, what a 2026 client must not see is dropped
//! ([`crate::bridge::wire::event_to_modern`]); a `subscriptions/listen` stream standing in for a
//! 2025 client's GET stream (src/proxy/forward/modern.rs) loses what only a 2026 client reads
//! ([`crate::bridge::modern::listen_event`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::body::ProxyBody;
use crate::bridge::wire::{self, EventOut, Sent};
use crate::bridge::CancelOnDrop;
use crate::errors::BoxError;
use crate::sse;

pub use crate::bridge::MAX_EVENT;

pin_project_lite::pin_project! {
    /// An SSE answer to a bridged request, rewritten event by event.
    pub struct Translated {
        #[pin]
        inner: ProxyBody,
        parser: sse::Parser,
        reading: Reading,
        // Cancels the request if the stream is dropped before its answer went by.
        cancel: Option<CancelOnDrop>,
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

impl Translated {
    pub fn new(inner: ProxyBody, reading: Reading, cancel: Option<CancelOnDrop>) -> Translated {
        Translated {
            inner,
            parser: sse::Parser::new(MAX_EVENT),
            reading,
            cancel,
            trailers: None,
            done: false,
        }
    }
}

/// Writes `event` (its data as `data` lines, its id and type kept) to `out`.
fn write_event(out: &mut BytesMut, event: &sse::Event, data: &[u8]) {
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

/// The translation of the events `bytes` complete; `answered` once the request's answer was one.
fn translate(
    parser: &mut sse::Parser,
    reading: &Reading,
    bytes: &[u8],
    answered: &mut bool,
) -> BytesMut {
    let mut out = BytesMut::new();
    parser.feed(bytes, |event| {
        if event.cut {
            tracing::warn!(
                limit = MAX_EVENT,
                "bridge: an event longer than the limit was dropped from a translated stream"
            );
            return;
        }
        let data = event.data.as_bytes();
        let translated = match reading {
            Reading::Answer(asked) => wire::event_to_modern(data, asked),
            Reading::Listen => crate::bridge::modern::listen_event(data),
        };
        match translated {
            EventOut::Pass => write_event(&mut out, &event, data),
            EventOut::Drop => {}
            EventOut::Answer(answer) => {
                *answered = true;
                write_event(&mut out, &event, &answer);
            }
        }
    });
    out
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
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let mut answered = false;
                        let out = translate(this.parser, this.reading, &data, &mut answered);
                        if let (true, Some(cancel)) = (answered, this.cancel.as_mut()) {
                            cancel.answered();
                        }
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                        }
                    }
                    Err(trailers) => {
                        *this.trailers = Some(trailers);
                        *this.done = true;
                    }
                },
                // An event cut off by the end is no event (the reader never completes it). The
                // server ended the stream: nothing is left running to cancel.
                None => {
                    if let Some(cancel) = this.cancel.as_mut() {
                        cancel.answered();
                    }
                    *this.done = true;
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

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
