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
//! cannot be completed), when the session ended (its client's DELETE), at holdfast's idle timeout
//! for streams, at holdfast's shutdown, when
//! the reopened GET is not answered with an event stream (a 503 at the end of a hold, a session
//! ended), and after three reopened streams in a row ended before sending anything. The client
//! then reconnects as it would have.
//!
//! Notifications the session has waiting ([`crate::session::Session::take_news`]) are written
//! between two events: at once when the stream is idle at a boundary, else after the event
//! being relayed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
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
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What is written while the server's stream is being reopened.
const COMMENT: &[u8] = b": holdfast: the server's stream ended; reopening it\n\n";

/// Reopened streams in a row that ended before sending anything, after which the client's
/// stream ends too (a server that closes every stream at once is not followed for ever).
const MAX_EMPTY: u8 = 3;

/// Longest event id remembered for `Last-Event-ID` (a longer one is not sent).
const MAX_ID: usize = 256;

type Reopening = Pin<Box<dyn Future<Output = Option<ProxyBody>> + Send>>;
type News = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How the stream is asked for again: through which proxy (the one the stream began with, as
/// every request keeps its own through a reload; `None`: never, in tests), with which request.
pub(super) struct Again {
    pub(super) proxy: Option<Arc<Proxy>>,
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
        // A session ended (its client's DELETE) has no stream to reopen: the server ended it.
        if self.session.is_ended()
            || error.is_some_and(|e| e.downcast_ref::<IdleTimeout>().is_some())
        {
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
        self.reopening = Some(Box::pin(
            async move { proxy?.reopen(target, version).await },
        ));
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{HeaderMap, Method, Uri};
    use http_body_util::channel::{Channel, Sender};
    use http_body_util::BodyExt;

    use super::*;
    use crate::config::{OnChange, SessionKey, SessionKeys, Sessions};
    use crate::session::told::{List, Offer};
    use crate::session::{Recorded, Table};

    /// A tracked session, as one an initialize opened.
    fn session() -> Arc<Session> {
        let mut key = [7; 32];
        key[31] = 8;
        let settings = Sessions {
            resume: true,
            max_tracked: 4,
            max_initialize_bytes: 1000,
            max_recorded_bytes: 10_000,
            idle_timeout: Duration::from_secs(60),
            keys: SessionKeys {
                file: Some("/keys".into()),
                keys: vec![SessionKey(key)],
                deployment: String::new(),
            },
            token_max_age: Duration::from_secs(3600),
            store: None,
            store_tls: None,
            key_file_warning: None,
            on_change: OnChange::default(),
        };
        let table = Table::new(settings, Default::default());
        let body = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
        let uri: Uri = "/mcp".parse().unwrap();
        let Recorded::Tracked(id) = table.record(
            HeaderValue::from_static("up-1"),
            Bytes::from_static(body),
            &uri,
            None,
        ) else {
            panic!("tracked");
        };
        table.lookup(&id).expect("the session")
    }

    /// A kept stream over a body the test feeds, that cannot be reopened (no proxy).
    fn kept(session: &Arc<Session>) -> (Sender<Bytes, BoxError>, Kept) {
        let (tx, body) = Channel::<Bytes, BoxError>::new(4);
        let again = Again {
            proxy: None,
            target: Box::new(Target {
                method: Method::GET,
                uri: "/mcp".parse().unwrap(),
                headers: HeaderMap::new(),
                client: "/mcp".parse().unwrap(),
                client_host: None,
            }),
            version: Version::HTTP_11,
        };
        let kept = Kept::new(
            body.boxed_unsync(),
            again,
            session.clone(),
            Default::default(),
        );
        (tx, kept)
    }

    /// The client learns that the tools changed.
    fn tools_changed(session: &Session) {
        let offer = Offer::of(&serde_json::json!({"capabilities": {}})).unwrap();
        session.told_now(offer, &[], &[List::Tools]);
    }

    async fn next(kept: &mut Kept) -> Option<Result<Bytes, String>> {
        let frame = tokio::time::timeout(Duration::from_secs(5), kept.frame())
            .await
            .expect("a frame in time")?;
        Some(
            frame
                .map(|f| f.into_data().expect("data"))
                .map_err(|e| e.to_string()),
        )
    }

    const TOLD: &str =
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n";

    #[tokio::test]
    async fn news_goes_between_two_events_never_inside_one() {
        let session = session();
        let (mut tx, mut kept) = kept(&session);
        tx.send_data(Bytes::from_static(b"id: 1\ndata: par"))
            .await
            .unwrap();
        assert_eq!(
            next(&mut kept).await,
            Some(Ok(Bytes::from_static(b"id: 1\ndata: par")))
        );
        tools_changed(&session);
        tx.send_data(Bytes::from_static(b"t\n\n")).await.unwrap();
        // The event being relayed is finished first.
        assert_eq!(
            next(&mut kept).await,
            Some(Ok(Bytes::from_static(b"t\n\n")))
        );
        assert_eq!(next(&mut kept).await, Some(Ok(Bytes::from(TOLD))));
        // Taken once.
        assert_eq!(session.take_news(), 0);
    }

    #[tokio::test]
    async fn news_waiting_before_the_stream_opened_comes_first() {
        let session = session();
        tools_changed(&session);
        let (_tx, mut kept) = kept(&session);
        assert_eq!(next(&mut kept).await, Some(Ok(Bytes::from(TOLD))));
    }

    #[tokio::test]
    async fn a_stream_cut_inside_an_event_ends_with_its_error() {
        let session = session();
        let (mut tx, mut kept) = kept(&session);
        tx.send_data(Bytes::from_static(b"data: half"))
            .await
            .unwrap();
        assert!(next(&mut kept).await.unwrap().is_ok());
        tx.abort("reset".into());
        assert_eq!(next(&mut kept).await, Some(Err("reset".into())));
    }

    #[tokio::test]
    async fn an_idle_timeout_is_not_reopened() {
        let session = session();
        let (tx, mut kept) = kept(&session);
        tx.abort(Box::new(IdleTimeout(Duration::from_secs(1))));
        let ended = next(&mut kept).await.expect("the error");
        assert!(ended.unwrap_err().contains("idle"));
    }

    #[tokio::test]
    async fn a_stream_that_cannot_be_reopened_ends_cleanly() {
        let session = session();
        let (mut tx, mut kept) = kept(&session);
        tx.send_data(Bytes::from_static(b"data: whole\n\n"))
            .await
            .unwrap();
        assert!(next(&mut kept).await.unwrap().is_ok());
        drop(tx);
        // At a boundary it would be reopened; with no proxy to reopen it through, it ends.
        assert_eq!(next(&mut kept).await, None);
    }

    #[test]
    fn an_ended_sessions_stream_is_not_reopened() {
        let session = session();
        let (_tx, mut kept) = kept(&session);
        kept.sent = true;
        assert!(kept.reopens(None));
        session.end();
        kept.sent = true;
        assert!(!kept.reopens(None));
    }

    #[test]
    fn three_empty_streams_in_a_row_are_not_followed() {
        let session = session();
        let (_tx, mut kept) = kept(&session);
        // What `reopen` does between two streams.
        let mut ended = |sent: bool| {
            kept.sent = sent;
            kept.reopens(None)
        };
        assert!(ended(true), "a stream that sent something");
        assert!(ended(false) && ended(false), "two empty ones");
        assert!(!ended(false), "the third empty one in a row");
    }
}
