//! The upstream side: connecting, pooling, sending.
//!
//! - [`connector`]: TCP (and TLS), resolving the name afresh for every connection, with typed
//!   failures that prove a request never left.
//! - [`pool`]: idle HTTP/1 connections of our own.
//! - [`open`]: open connections, counted while they live (`holdfast_upstream_connections`).
//! - here, [`Client`]: sends one request and hands back the response.
//!
//! A plain `http://` upstream (the sidecar's usual case) goes through our own HTTP/1 path
//! ([`h1`], on [`crate::http1`]): a pooled (or new) connection is taken first and the request
//! written second, in the request's own task, so a connection that fails before a byte of the
//! request went out hands it back whole, and it goes on another one; the response body is read
//! straight off the connection, which returns to the pool when the body ends. An `https://`
//! upstream keeps hyper-util's pooled client, which also speaks HTTP/2 when the upstream picks
//! `h2` by ALPN.
//!
//! On that HTTP/1 path the kernel is asked, twice, what it knows that the exchange does not
//! ([`tcp`]): whether a pooled connection was closed by the upstream before it carries a
//! request (then it is not used), and, when an exchange fails, whether the upstream's TCP
//! acknowledged any byte of the request. A request none of whose bytes were acknowledged, or
//! that a new connection failed before writing, fails with [`NeverRead`]: it provably never
//! reached the application, so it may be held and sent again.

pub mod connector;
mod failed;
pub mod h1;
pub mod open;
pub mod pool;
pub mod tcp;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::counter::Counter;

pub use connector::{ConnectError, ConnectErrorKind, Connector, UpstreamConnector, UpstreamIo};
pub use failed::{ClientBodyFault, FailedSend};
use h1::{Conn, Failure, Outgoing};
use pool::Pool;

use crate::replay::ReplayBody;

/// Why sending failed. Each variant keeps its cause; [`SendError::failed`] says what it means
/// for the request (never sent, or may have been).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made.
    #[error("connecting to the upstream failed")]
    Connect(#[source] ConnectError),
    /// The HTTP/1 exchange failed.
    #[error("the upstream exchange failed")]
    Exchange(#[source] crate::http1::Error),
    /// hyper-util's client (an `https://` upstream) failed.
    #[error("the upstream request failed")]
    Pooled(#[source] hyper_util::client::legacy::Error),
    /// The connection closed before the upstream read any byte of the request.
    #[error("the upstream exchange failed before the request was read")]
    NeverRead(#[source] NeverRead),
}

/// The upstream's connection closed before it read any byte of the request, as the kernel
/// shows: the application cannot have seen it.
#[derive(Debug, thiserror::Error)]
#[error("the upstream connection closed before the upstream read the request ({})", when.as_str())]
pub struct NeverRead {
    /// How it is known.
    pub when: Unread,
    #[source]
    source: crate::http1::Error,
}

/// How a request is known to have never been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// A new connection failed before anything was written on it, closed by the upstream (an
    /// accept-then-close port).
    BeforeRequest,
    /// Written, but the upstream's TCP acknowledged none of it: it had closed, or was killed,
    /// before the request arrived, and answered it with a reset.
    Unacknowledged,
}

impl Unread {
    /// For logs and the `when` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Unread::BeforeRequest => "before_request",
            Unread::Unacknowledged => "unacknowledged",
        }
    }
}

/// `holdfast_upstream_closed_connections_total{when}`, one counter per value, resolved once.
#[derive(Debug, Clone, Default)]
pub struct ClosedCounters {
    /// A pooled connection was closed by the upstream: the request took another one.
    pub idle: Counter,
    /// [`Unread::BeforeRequest`].
    pub before_request: Counter,
    /// [`Unread::Unacknowledged`].
    pub unacknowledged: Counter,
}

/// The client the proxy sends through.
pub struct Client {
    inner: Inner,
}

enum Inner {
    /// `http://`: our own HTTP/1 pool.
    Http1(Box<Http1>),
    /// `https://`: hyper-util's client (HTTP/1.1, or HTTP/2 by ALPN). Boxed: it is large, and
    /// the plain variant is the common one.
    Pooled(Box<HyperClient<UpstreamConnector, ReplayBody>>),
}

/// Our own HTTP/1 path to an `http://` upstream.
struct Http1 {
    /// The upstream's base URI: where every connection goes (one upstream per holdfast).
    base: Uri,
    /// `Host` for a request that has none (its authority).
    host: HeaderValue,
    connector: UpstreamConnector,
    pool: Arc<Pool<Conn>>,
    closed: ClosedCounters,
    limits: ResponseLimits,
}

/// What a client accepts from the upstream.
#[derive(Debug, Clone, Copy)]
pub struct ResponseLimits {
    /// Most header lines in a response head.
    pub max_headers: usize,
    /// Most bytes in a response head.
    pub max_head_bytes: usize,
}

impl Client {
    /// A client for the upstream at `base` whose connections are made within `connect_timeout`
    /// and closed after `pool_idle` idle. With `tls` (an `https://` upstream) connections are
    /// TLS and may speak HTTP/2; plain ones speak HTTP/1.1, and `closed` counts the ones found
    /// closed before they carried a request.
    pub fn new(
        base: Uri,
        connect_timeout: Duration,
        pool_idle: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
        closed: ClosedCounters,
        limits: ResponseLimits,
        open: prometheus_client::metrics::gauge::Gauge,
    ) -> Client {
        let inner = match tls {
            None => Inner::Http1(Box::new(Http1 {
                host: base
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                    .unwrap_or_else(|| HeaderValue::from_static("localhost")),
                base,
                connector: UpstreamConnector::new(connect_timeout, None).counting(open),
                pool: Pool::new(pool_idle, closed.idle.clone()),
                closed,
                limits,
            })),
            Some(tls) => Inner::Pooled(Box::new({
                let mut builder = HyperClient::builder(TokioExecutor::new());
                builder.http1_max_headers(limits.max_headers);
                builder
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(pool_idle)
                    // A request on a pooled connection that the upstream closed before anything
                    // was written is handed back by hyper and sent on a new connection.
                    .retry_canceled_requests(true)
                    .build(UpstreamConnector::new(connect_timeout, Some(tls)).counting(open))
            })),
        };
        Client { inner }
    }

    /// Sends `req` (absolute URI) and returns the response head with its streaming body.
    pub async fn request(
        &self,
        req: Request<ReplayBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        match &self.inner {
            Inner::Http1(h1) => {
                let (parts, body) = req.into_parts();
                h1.send(Head::of(&parts), body).await
            }
            Inner::Pooled(client) => pooled(client, req).await,
        }
    }

    /// Sends a request whose `head` stays with the caller (to be sent again if need be) as
    /// HTTP/1.1, or as HTTP/2 where an `https://` upstream picked it. The HTTP/1 path writes the
    /// head from the borrowed one; only hyper-util's client takes a copy.
    pub async fn send(
        &self,
        head: Head<'_>,
        body: ReplayBody,
    ) -> Result<Response<UpstreamBody>, SendError> {
        match &self.inner {
            Inner::Http1(h1) => h1.send(head, body).await,
            Inner::Pooled(client) => {
                let mut req = Request::new(body);
                *req.method_mut() = head.method.clone();
                *req.uri_mut() = head.uri.clone();
                *req.headers_mut() = head.headers.clone();
                // Boxed: hyper-util's future is several times the size of our own exchange's,
                // and every request's attempt would carry its room.
                Box::pin(pooled(client, req)).await
            }
        }
    }

    /// Idle pooled HTTP/1 connections now (0 for an `https://` upstream).
    pub fn idle_connections(&self) -> usize {
        match &self.inner {
            Inner::Http1(h1) => h1.pool.idle(),
            Inner::Pooled(_) => 0,
        }
    }
}

/// Sends through hyper-util's client (an `https://` upstream).
async fn pooled(
    client: &HyperClient<UpstreamConnector, ReplayBody>,
    req: Request<ReplayBody>,
) -> Result<Response<UpstreamBody>, SendError> {
    client
        .request(req)
        .await
        .map(|resp| resp.map(UpstreamBody::Pooled))
        .map_err(SendError::Pooled)
}

/// A request's method, URI (absolute) and headers, borrowed from where they are kept.
#[derive(Clone, Copy)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a Method,
    /// The absolute URI: its path and query are the request target.
    pub uri: &'a Uri,
    /// The header lines.
    pub headers: &'a HeaderMap,
}

impl<'a> Head<'a> {
    /// The head of a request's `parts`.
    pub fn of(parts: &'a http::request::Parts) -> Self {
        Head {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
        }
    }
}

impl Http1 {
    /// Sends on a pooled connection, or a new one. A connection that failed before any byte of
    /// the request was written hands it back, and the next one (eventually a new one) takes it:
    /// it never reached the application.
    async fn send(
        &self,
        head: Head<'_>,
        body: ReplayBody,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let mut out = Box::new(Outgoing::new(head, body, &self.host).map_err(SendError::Exchange)?);
        loop {
            let (conn, pooled) = match self.pool.checkout() {
                Some(conn) => (conn, true),
                // Boxed: a new connection is the rare case, and its future is large.
                None => (Box::pin(self.connect()).await?, false),
            };
            // The exchange is awaited here, not in a helper of its own: each async level keeps
            // its own slot for the request and the connection it moved on.
            match self.settle(h1::send(conn, out, self.limits).await, pooled) {
                Ok(resp) => return Ok(resp),
                Err(Retry::Again(back)) => out = back,
                Err(Retry::Failed(err)) => return Err(err),
            }
        }
    }

    /// The response of an exchange on one connection (`pooled` or new), or what the kernel
    /// knows of its failure.
    fn settle(
        &self,
        sent: Result<(http::response::Parts, h1::Body), Failure>,
        pooled: bool,
    ) -> Result<Response<UpstreamBody>, Retry> {
        match sent {
            Ok((head, mut body)) => {
                body.return_to(&self.pool);
                Ok(Response::from_parts(head, UpstreamBody::H1(body)))
            }
            Err(Failure::Unwritten { out: back, .. }) if pooled => {
                self.pool.found_closed();
                Err(Retry::Again(back))
            }
            Err(Failure::Unwritten { conn, error, .. }) => {
                // Unwritten, on a new connection the upstream closed or reset as soon as it
                // opened: a port that accepts before anything serves it. Never read. (An
                // upstream that spoke first, not HTTP, is no missing backend: a 502.)
                Err(Retry::Failed(if conn.check() == tcp::Liveness::Closed {
                    self.closed.before_request.inc();
                    never_read(Unread::BeforeRequest, error)
                } else {
                    SendError::Exchange(error)
                }))
            }
            Err(Failure::Failed { error, unread }) => Err(Retry::Failed(if unread {
                self.closed.unacknowledged.inc();
                never_read(Unread::Unacknowledged, error)
            } else {
                SendError::Exchange(error)
            })),
        }
    }

    /// A new connection.
    async fn connect(&self) -> Result<Conn, SendError> {
        let tcp = self
            .connector
            .connect_tcp(&self.base)
            .await
            .map_err(SendError::Connect)?;
        Ok(Conn::new(tcp, self.connector.opened()))
    }
}

/// Why one connection did not carry a request.
enum Retry {
    /// A pooled connection failed before any byte of the request was written: here it is,
    /// whole, for the next one (boxed: the rare case should not make every result large).
    Again(Box<Outgoing>),
    /// The request failed (perhaps proven unread: [`SendError::NeverRead`]).
    Failed(SendError),
}

fn never_read(when: Unread, source: crate::http1::Error) -> SendError {
    SendError::NeverRead(NeverRead { when, source })
}

/// An upstream response body: read off our own HTTP/1 connection, or hyper's (an `https://`
/// upstream).
pub enum UpstreamBody {
    /// Our own HTTP/1 path.
    H1(h1::Body),
    /// hyper-util's client.
    Pooled(Incoming),
}

/// Why reading a response body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// On our own HTTP/1 path.
    #[error(transparent)]
    H1(crate::http1::Error),
    /// On hyper's.
    #[error(transparent)]
    Hyper(hyper::Error),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpstreamBody::H1(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BodyError::H1))),
            UpstreamBody::Pooled(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BodyError::Hyper))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::H1(body) => body.is_end_stream(),
            UpstreamBody::Pooled(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::H1(body) => body.size_hint(),
            UpstreamBody::Pooled(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
