//! A client's standalone event stream (the GET stream of a carried session), kept open while
//! the server behind it restarts.
//!
//! Without this, the server's restart ends the client's stream; the client reconnects with
//! backoff (the TypeScript SDK client twice, then never again) and misses whatever was sent
//! between, and a notification holdfast wants to deliver (a deploy's changed lists: see
//! [`crate::session::told`]) has no stream to go on. So when the server's stream ends (cleanly,
//! as uvicorn's graceful shutdown ends it, or broken, as a killed server's is) at an event
//! boundary, holdfast opens it again itself: the same GET through the proxy, held through the
//! gap and re-establishing the session like any request ([`super::Proxy::reopen`]), and goes on
//! relaying on the same client stream. Meanwhile it writes a comment every
//! [`KEEPALIVE`], so the client and every router between see a live stream.
//!
//! Event ids: the reopened stream is asked from after the last event id the client received
//! (`Last-Event-ID`), which the server honours if it still has the session and an event store;
//! on a re-established session the id means nothing and is dropped
//! ([`crate::session::Session::apply`]), and the client receives the new session's ids from
//! then on, which its own `Last-Event-ID` then means.
//!
//! The stream still ends: when it broke in the middle of an event (what the client holds of it
//! cannot be completed), at holdfast's idle timeout for streams, at holdfast's shutdown, when
//! the reopened GET is not answered with an event stream (a 503 at the end of a hold, a session
//! ended), and after three reopened streams in a row ended before sending anything. The client
//! then reconnects as it would have.
//!
//! Notifications the session has waiting ([`crate::session::Session::take_news`]) are written
//! between two events: at once when the stream is idle at a boundary, else after the event
//! being relayed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Version};
use http_body::{Body, Frame};

use super::body::{IdleTimeout, ProxyBody};
use super::{Proxy, Target};
use crate::errors::BoxError;
use crate::session::told;
use crate::session::{Session, LAST_EVENT_ID, MCP_SESSION_ID};

/// How often a comment is written while the server's stream is being reopened.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);

/// What is written while the server's stream is being reopened.
const COMMENT: &[u8] = b": holdfast: the server's stream ended; reopening it\n\n";

/// Reopened streams in a row that ended before sending anything, after which the client's
/// stream ends too (a server that closes every stream at once is not followed for ever).
const MAX_EMPTY: u8 = 3;

/// Longest event id remembered for `Last-Event-ID` (a longer one is not sent).
const MAX_ID: usize = 256;

type Reopening = Pin<Box<dyn Future<Output = Option<ProxyBody>> + Send>>;
type News = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How the stream is asked for again: through which proxy, with which request.
pub(super) struct Again {
    pub(super) proxy: Weak<Proxy>,
    /// The GET as it went upstream, with the client's own session id.
    pub(super) target: Box<Target>,
    pub(super) version: Version,
}

/// A standalone event stream kept open through the server's restarts.
pub(super) struct Kept {
    inner: Option<ProxyBody>,
    again: Again,
    session: Arc<Session>,
    /// What was relayed, read for where events end and their ids.
    events: crate::sse::Parser,
    last_id: Option<String>,
    reopening: Option<Reopening>,
    keepalive: Option<Pin<Box<tokio::time::Sleep>>>,
    news: News,
    /// Whether the current server stream sent anything.
    sent: bool,
    empty: u8,
    /// `holdfast_sse_streams_reopened_total`.
    reopened: prometheus_client::metrics::counter::Counter,
}

fn news_of(session: &Arc<Session>) -> News {
    let session = session.clone();
    Box::pin(async move { session.news().await })
}

impl Kept {
    pub(super) fn new(
        inner: ProxyBody,
        again: Again,
        session: Arc<Session>,
        reopened: prometheus_client::metrics::counter::Counter,
    ) -> Kept {
        Kept {
            inner: Some(inner),
            again,
            news: news_of(&session),
            session,
            events: crate::sse::Parser::new(MAX_ID),
            last_id: None,
            reopening: None,
            keepalive: None,
            sent: false,
            empty: 0,
            reopened,
        }
    }

    /// The server's stream ended (`error`: how, if it broke): whether to open it again.
    fn reopens(&mut self, error: Option<&BoxError>) -> bool {
        if error.is_some_and(|e| e.downcast_ref::<IdleTimeout>().is_some()) {
            return false;
        }
        self.empty = if self.sent { 0 } else { self.empty + 1 };
        self.events.at_boundary() && self.empty < MAX_EMPTY
    }

    /// Starts asking for the stream again.
    fn reopen(&mut self) {
        let mut target = (*self.again.target).clone();
        target
            .headers
            .insert(MCP_SESSION_ID, self.session.client_id().clone());
        match self.last_id.as_deref().map(HeaderValue::from_str) {
            Some(Ok(id)) => {
                target.headers.insert(LAST_EVENT_ID, id);
            }
            _ => {
                target.headers.remove(LAST_EVENT_ID);
            }
        }
        let (proxy, version) = (self.again.proxy.clone(), self.again.version);
        self.reopening = Some(Box::pin(async move {
            let proxy = proxy.upgrade()?;
            proxy.reopen(target, version).await
        }));
        self.sent = false;
        self.last_id = None;
    }

    /// The waiting notifications as events, if any.
    fn take_news(&mut self) -> Option<Bytes> {
        let bits = self.session.take_news();
        if bits == 0 {
            return None;
        }
        let mut out = BytesMut::new();
        for method in told::notifications(bits) {
            let message = serde_json::json!({ "jsonrpc": "2.0", "method": method });
            out.extend_from_slice(&crate::sse::data_event(message.to_string().as_bytes()));
        }
        Some(out.freeze())
    }

    /// Notes a relayed frame's bytes.
    fn relayed(&mut self, data: &[u8]) {
        self.sent = true;
        let last_id = &mut self.last_id;
        self.events.feed(data, |event| {
            if let Some(id) = event.id {
                *last_id = Some(id);
            }
        });
    }
}

impl Body for Kept {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            // Between two events, the notifications waiting go first.
            if this.events.at_boundary() && this.news.as_mut().poll(cx).is_ready() {
                this.news = news_of(&this.session);
                if let Some(events) = this.take_news() {
                    return Poll::Ready(Some(Ok(Frame::data(events))));
                }
                continue;
            }
            if let Some(inner) = this.inner.as_mut() {
                let ended = match Pin::new(inner).poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            this.relayed(data);
                        }
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    Poll::Ready(Some(Err(e))) => Some(e),
                    Poll::Ready(None) => None,
                };
                this.inner = None;
                if !this.reopens(ended.as_ref()) {
                    return Poll::Ready(ended.map(Err));
                }
                this.reopen();
            }
            let Some(reopening) = this.reopening.as_mut() else {
                return Poll::Ready(None);
            };
            match reopening.as_mut().poll(cx) {
                Poll::Ready(Some(body)) => {
                    this.reopening = None;
                    this.keepalive = None;
                    this.inner = Some(body);
                    this.reopened.inc();
                    continue;
                }
                // Not answered with a stream: the client's ends, and it reconnects itself.
                Poll::Ready(None) => {
                    this.reopening = None;
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            let keepalive = this
                .keepalive
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(KEEPALIVE)));
            if keepalive.as_mut().poll(cx).is_ready() {
                this.keepalive = None;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(COMMENT)))));
            }
            return Poll::Pending;
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }
}
