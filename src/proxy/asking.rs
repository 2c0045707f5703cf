//! The answer to a 2025 client's call bridged to a 2026-07-28 server, when the server may ask
//! for input (src/bridge/asks.rs): the server's events pass as they come, until its answer is an
//! input round; from there the client's stream is what the task asking the client writes (its
//! questions, then the call's result).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use serde_json::Value;
use tokio::sync::mpsc;

use super::body::ProxyBody;
use crate::bridge::{asks, Asking, Bridge};
use crate::errors::BoxError;
use crate::sse;

/// Events a client's stream may be behind the task asking it.
const BACKLOG: usize = 16;

/// What starting to ask the client needs, but the server's round and the stream.
pub struct Start {
    pub bridge: Arc<Bridge>,
    pub head: http::Request<()>,
    pub sent: Bytes,
    pub client_id: Value,
    pub token: Vec<u8>,
    pub peer: std::net::SocketAddr,
}

impl Start {
    /// Hands the call to the task that asks the client, with the server's round `first`: the
    /// client's stream from here on.
    pub fn ask(self, first: Value) -> mpsc::Receiver<Bytes> {
        let (out, stream) = mpsc::channel(BACKLOG);
        let (client_id, refused) = (self.client_id.clone(), out.clone());
        let asking = Asking {
            head: self.head,
            sent: self.sent,
            client_id: self.client_id,
            first,
            token: self.token,
            out,
            peer: self.peer,
        };
        if !self.bridge.ask(asking) {
            let why = "holdfast has too many calls waiting for their clients' input; call again";
            let _ = refused.try_send(crate::sse::data_event(&asks::failed(&client_id, why)));
        }
        stream
    }
}

/// A 2025 client's stream for a call that may turn into input rounds.
pub struct Relayed {
    /// The server's event stream, while it is read.
    upstream: Option<(ProxyBody, sse::Parser)>,
    start: Option<Start>,
    /// What the task asking the client writes, once it was handed the call.
    asking: Option<mpsc::Receiver<Bytes>>,
}

impl Relayed {
    /// The server's event stream `upstream`, watched for an input round.
    pub fn watching(upstream: ProxyBody, start: Start) -> Relayed {
        Relayed {
            upstream: Some((upstream, sse::Parser::new(crate::bridge::MAX_EVENT))),
            start: Some(start),
            asking: None,
        }
    }

    /// A stream a task writes from the start (the task asking the client; the listens of a
    /// client's GET stream).
    pub fn written(stream: mpsc::Receiver<Bytes>) -> Relayed {
        Relayed {
            upstream: None,
            start: None,
            asking: Some(stream),
        }
    }
}

/// A 2025 client's call's answer, ended at once when the client cancels the call
/// (`notifications/cancelled`): dropping the server's stream is how a 2026-07-28 server learns
/// of it.
pub struct Cancellable {
    inner: Option<ProxyBody>,
    cancelled: crate::bridge::local::Cancelled,
    _entry: crate::bridge::local::CallEntry,
}

impl Cancellable {
    pub fn new(
        inner: ProxyBody,
        cancelled: crate::bridge::local::Cancelled,
        entry: crate::bridge::local::CallEntry,
    ) -> Cancellable {
        Cancellable {
            inner: Some(inner),
            cancelled,
            _entry: entry,
        }
    }
}

impl Body for Cancellable {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.inner.is_some() && this.cancelled.poll_cancelled(cx).is_ready() {
            tracing::debug!("bridge: a call cancelled by its client; its stream closed");
            this.inner = None;
        }
        match this.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

/// Sends what `body` carries to `to`, until either ends.
pub async fn pump<B: Body<Data = Bytes>>(body: B, to: mpsc::Sender<Bytes>) {
    let mut body = std::pin::pin!(body);
    loop {
        tokio::select! {
            frame = http_body_util::BodyExt::frame(&mut body) => {
                let Some(Ok(frame)) = frame else { break };
                let Ok(data) = frame.into_data() else { continue };
                if to.send(data).await.is_err() {
                    break;
                }
            }
            () = to.closed() => break,
        }
    }
}

/// The input round a message is the answer of, if it is one: the server's result.
pub fn round_answer(data: &[u8]) -> Option<Value> {
    let message: Value = serde_json::from_slice(data).ok()?;
    if message.get("method").is_some() || message.get("id").is_none() {
        return None;
    }
    let result = message.get("result")?;
    asks::round_of(result).map(|_| result.clone())
}

impl Body for Relayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(asking) = this.asking.as_mut() {
                return asking.poll_recv(cx).map(|e| e.map(|e| Ok(Frame::data(e))));
            }
            let Some((upstream, parser)) = this.upstream.as_mut() else {
                return Poll::Ready(None);
            };
            let frame = match std::task::ready!(Pin::new(upstream).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.upstream = None;
                    return Poll::Ready(None);
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let mut out = BytesMut::new();
            for ev in parser.events(&data) {
                if !ev.has_data || ev.cut {
                    continue;
                }
                if let Some(first) = round_answer(ev.data.as_bytes()) {
                    if let Some(start) = this.start.take() {
                        this.asking = Some(start.ask(first));
                        this.upstream = None;
                        break;
                    }
                }
                super::bridged::write_event(&mut out, &ev, ev.data.as_bytes());
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.upstream.is_none() && self.asking.is_none()
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
    async fn a_streamed_input_round_hands_the_call_on_and_the_events_before_it_pass() {
        let bridge = Arc::new(Bridge::new(
            &crate::config::Bridge::default(),
            prometheus_client::metrics::gauge::Gauge::default(),
        ));
        let mut asked = bridge.take_asking().expect("once");
        let stream = concat!(
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"resultType\":\"input_required\",",
            "\"inputRequests\":{\"k\":{\"method\":\"roots/list\"}},\"requestState\":\"s\"}}\n\n",
        );
        let upstream = http_body_util::Full::new(Bytes::from_static(stream.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync();
        let start = Start {
            bridge: bridge.clone(),
            head: http::Request::new(()),
            sent: Bytes::from_static(b"{}"),
            client_id: serde_json::json!(5),
            token: b"t".to_vec(),
            peer: ([127, 0, 0, 1], 1).into(),
        };
        let mut body = Relayed::watching(upstream, start);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(
            std::str::from_utf8(&first)
                .unwrap()
                .contains("notifications/progress"),
            "{first:?}"
        );
        let asking = asked.recv().await.expect("the call handed on");
        assert_eq!(asking.first["requestState"], "s");
        assert_eq!(asking.token, b"t");
        asking
            .out
            .send(Bytes::from_static(b"data: end\n\n"))
            .await
            .unwrap();
        drop(asking);
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"data: end\n\n", "the rest is the asking task's");
    }
}
