//! The answer to a 2026-07-28 client's `subscriptions/listen` on a 2025 session
//! (src/proxy/forward/listen.rs): its acknowledgement first, then what its session's GET stream
//! sends that it asked for ([`crate::bridge::listen::notification`]), as SSE. The stream ends
//! when the GET stream does (abruptly: the client listens again, as the spec says), or, when
//! nothing could be asked of the server, right after the acknowledgement with the listen's
//! result (gracefully).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use serde_json::Value;

use crate::bridge::feed::Reader;
use crate::bridge::listen::{self, Filter};
use crate::errors::BoxError;

/// A listen's event stream.
pub struct Listening {
    /// The acknowledgement, until sent.
    first: Option<Bytes>,
    /// The session's GET stream, or `None` when there is nothing to read (the listen then ends
    /// with its result after the acknowledgement).
    reader: Option<Reader>,
    filter: Filter,
    /// The listen request's id: its subscriptionId.
    id: Value,
    done: bool,
}

impl Listening {
    pub fn new(id: Value, honoured: Filter, reader: Option<Reader>) -> Listening {
        Listening {
            first: Some(crate::sse::data_event(&listen::acknowledgement(
                &id, &honoured,
            ))),
            reader,
            filter: honoured,
            id,
            done: false,
        }
    }
}

impl Body for Listening {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        let Some(reader) = this.reader.as_mut() else {
            this.done = true;
            let end = crate::sse::data_event(&listen::ended(&this.id));
            return Poll::Ready(Some(Ok(Frame::data(end))));
        };
        loop {
            match std::task::ready!(reader.events.poll_recv(cx)) {
                Some(data) => {
                    if let Some(out) = listen::notification(&data, &this.filter, &this.id) {
                        return Poll::Ready(Some(Ok(Frame::data(crate::sse::data_event(&out)))));
                    }
                }
                None => {
                    this.done = true;
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn with_nothing_to_read_the_listen_is_acknowledged_and_ends_with_its_result() {
        let body = Listening::new(serde_json::json!("listen-1"), Filter::default(), None);
        let out = body.collect().await.unwrap().to_bytes();
        let events: Vec<Value> = std::str::from_utf8(&out)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
            .collect();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            events[0]["method"],
            "notifications/subscriptions/acknowledged"
        );
        assert_eq!(events[1]["id"], "listen-1");
        assert_eq!(events[1]["result"]["resultType"], "complete");
    }
}
