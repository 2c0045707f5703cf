//! The upstream side: connecting, pooling, sending.
//!
//! - [`connector`]: TCP (and TLS), resolving the name afresh for every connection, with typed
//!   failures that prove a request never left.
//! - [`pool`]: idle HTTP/1 connections of our own.
//! - here, [`Client`]: sends one request and hands back the response.
//!
//! A plain `http://` upstream (the sidecar's usual case) goes through our own HTTP/1 path on
//! `hyper::client::conn::http1`: a pooled (or new) connection is taken first and the request sent
//! second, so a pooled connection that turns out closed hands the request back untouched (hyper's
//! `try_send_request`), and it goes on a new connection; and a connection returns to the pool when
//! its response body ends, with no task spawned per response to wait for that. An `https://`
//! upstream keeps hyper-util's pooled client, which also speaks HTTP/2 when the upstream picks
//! `h2` by ALPN.
//!
//! On that HTTP/1 path the kernel is asked, twice, what it knows that hyper does not ([`tcp`]):
//! whether a pooled connection was closed by the upstream before it carries a request (then it
//! is not used), and, when an exchange fails, whether the upstream's TCP acknowledged any byte of
//! the request. A request none of whose bytes were acknowledged, or that hyper handed back
//! unwritten from a new connection, fails with [`NeverRead`]: it provably never reached the
//! application, so it may be held and sent again.

pub mod connector;
pub mod pool;
pub mod tcp;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::counter::Counter;

pub use connector::{ConnectError, ConnectErrorKind, Connector, UpstreamConnector, UpstreamIo};
use pool::{Conn, Pool};

use crate::replay::{Completion, ReplayBody};

/// Why sending failed. Each variant keeps its cause: the classifier walks the chain to a
/// [`ConnectError`] (never sent) or a `hyper::Error` (may have been sent).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made.
    #[error("connecting to the upstream failed")]
    Connect(#[source] ConnectError),
    /// The HTTP/1 exchange failed.
    #[error("the upstream exchange failed")]
    Exchange(#[source] hyper::Error),
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
    source: hyper::Error,
}

/// How a request is known to have never been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// A new connection closed before hyper wrote anything on it (an accept-then-close port).
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
    Http1 {
        /// The upstream's base URI: where every connection goes (one upstream per holdfast).
        base: Uri,
        connector: UpstreamConnector,
        pool: Arc<Pool>,
        closed: ClosedCounters,
        /// Most header lines in a response head, when not hyper's default.
        max_headers: Option<usize>,
    },
    /// `https://`: hyper-util's client (HTTP/1.1, or HTTP/2 by ALPN). Boxed: it is large, and
    /// the plain variant is the common one.
    Pooled(Box<HyperClient<UpstreamConnector, ReplayBody>>),
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
        max_headers: Option<usize>,
    ) -> Client {
        let inner = match tls {
            None => Inner::Http1 {
                base,
                connector: UpstreamConnector::new(connect_timeout, None),
                pool: Pool::new(pool_idle, closed.idle.clone()),
                closed,
                max_headers,
            },
            Some(tls) => Inner::Pooled(Box::new({
                let mut builder = HyperClient::builder(TokioExecutor::new());
                if let Some(max) = max_headers {
                    builder.http1_max_headers(max);
                }
                builder
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(pool_idle)
                    // A request on a pooled connection that the upstream closed before anything
                    // was written is handed back by hyper and sent on a new connection.
                    .retry_canceled_requests(true)
                    .build(UpstreamConnector::new(connect_timeout, Some(tls)))
            })),
        };
        Client { inner }
    }

    /// Sends `req` (absolute URI, `Host` set) and returns the response head with its streaming
    /// body.
    pub async fn request(
        &self,
        req: Request<ReplayBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        match &self.inner {
            Inner::Http1 {
                base,
                connector,
                pool,
                closed,
                max_headers,
            } => send_http1(base, connector, pool, closed, *max_headers, req).await,
            Inner::Pooled(client) => client
                .request(req)
                .await
                .map(|resp| resp.map(UpstreamBody::unpooled))
                .map_err(SendError::Pooled),
        }
    }

    /// Idle pooled HTTP/1 connections now (0 for an `https://` upstream).
    pub fn idle_connections(&self) -> usize {
        match &self.inner {
            Inner::Http1 { pool, .. } => pool.idle(),
            Inner::Pooled(_) => 0,
        }
    }
}

/// Sends on a pooled connection, or a new one. A pooled connection that closed before the request
/// was written hands it back, and the next one (eventually a new one) takes it: it never reached
/// the application.
async fn send_http1(
    base: &Uri,
    connector: &UpstreamConnector,
    pool: &Arc<Pool>,
    closed: &ClosedCounters,
    max_headers: Option<usize>,
    mut req: Request<ReplayBody>,
) -> Result<Response<UpstreamBody>, SendError> {
    origin_form(req.uri_mut());
    // A connection may take the next request only once this one's body is written too: an
    // upstream may answer before reading it all (a 404 for a forgotten session does), and the
    // next request must not wait behind a slow client's upload.
    let uploaded = req.body().completion();
    loop {
        let (mut conn, pooled) = match pool.checkout() {
            Some(conn) => (conn, true),
            // Boxed: a new connection is the rare case, and its future is large.
            None => (
                Box::pin(connect(connector, base, max_headers)).await?,
                false,
            ),
        };
        // A pooled connection became idle when its last response ended; hyper may still be
        // finishing that exchange, so wait until it takes a new request (or turns out closed).
        if pooled && conn.sender.ready().await.is_err() {
            pool.found_closed();
            continue;
        }
        match send_on(conn, pooled, closed, req).await {
            Ok((resp, conn)) => {
                let (head, body) = resp.into_parts();
                return Ok(Response::from_parts(
                    head,
                    UpstreamBody::pooled(body, conn, pool, uploaded),
                ));
            }
            Err(Failed::Back(back)) => {
                pool.found_closed();
                req = *back;
            }
            Err(Failed::Error(err)) => return Err(err),
        }
    }
}

/// Why one connection did not carry a request.
enum Failed {
    /// A pooled connection closed before hyper wrote the request: here it is, untouched (boxed:
    /// the rare case should not make every result large).
    Back(Box<Request<ReplayBody>>),
    /// The request failed (perhaps proven unread: [`SendError::NeverRead`]).
    Error(SendError),
}

/// Sends `req` on one connection, and tells what the kernel knows when that fails.
async fn send_on(
    mut conn: Conn,
    pooled: bool,
    closed: &ClosedCounters,
    req: Request<ReplayBody>,
) -> Result<(Response<Incoming>, Conn), Failed> {
    let mark = conn.tcp.written();
    match conn.sender.try_send_request(req).await {
        Ok(resp) => Ok((resp, conn)),
        Err(mut failed) => match failed.take_message() {
            Some(back) if pooled => Err(Failed::Back(Box::new(back))),
            // Unwritten, from a connection the upstream closed or reset as soon as it opened: a
            // port that accepts before anything serves it. Never read; the caller decides what
            // next. (An upstream that spoke first, not HTTP, is no missing backend: a 502.)
            Some(_) if conn.tcp.check() == tcp::Idle::Closed => {
                closed.before_request.inc();
                Err(Failed::Error(never_read(
                    Unread::BeforeRequest,
                    failed.into_error(),
                )))
            }
            Some(_) => Err(Failed::Error(SendError::Exchange(failed.into_error()))),
            None => {
                let err = failed.into_error();
                Err(Failed::Error(if unacknowledged(&err, &conn, mark) {
                    closed.unacknowledged.inc();
                    never_read(Unread::Unacknowledged, err)
                } else {
                    SendError::Exchange(err)
                }))
            }
        },
    }
}

fn never_read(when: Unread, source: hyper::Error) -> SendError {
    SendError::NeverRead(NeverRead { when, source })
}

/// Whether a request whose exchange failed is proven unread. Never for a parse error, a
/// timeout or the client's own body failing. Then either no byte of it reached the socket, or
/// the connection ended with the upstream's FIN (hyper saw EOF) and the upstream's TCP
/// acknowledged none of the bytes written for it. A FIN carries the acknowledgement of every
/// byte its sender's kernel had received, and a server cannot read a byte its kernel never
/// received: so a FIN that acknowledges none of the request was sent before the request
/// arrived. A reset proves nothing: Linux does not read the acknowledgement on a RST, and a
/// server that read the request and then aborted (`SO_LINGER` 0, closing with bytes unread)
/// sends one while its acknowledgement may still be delayed.
fn unacknowledged(err: &hyper::Error, conn: &Conn, mark: u64) -> bool {
    if err.is_parse() || err.is_user() || err.is_timeout() {
        return false;
    }
    if conn.tcp.written() == mark {
        return true;
    }
    err.is_incomplete_message() && conn.tcp.acknowledged_since(mark) == Some(false)
}

/// A new HTTP/1 connection, driven by its own task.
async fn connect(
    connector: &UpstreamConnector,
    uri: &Uri,
    max_headers: Option<usize>,
) -> Result<Conn, SendError> {
    use tower_service::Service;
    let io = connector
        .clone()
        .call(uri.clone())
        .await
        .map_err(SendError::Connect)?;
    let tcp = io
        .tcp_handle()
        .expect("the HTTP/1 path connects to http:// upstreams only");
    let mut builder = http1::Builder::new();
    // Only a count other than hyper's default is set: setting one costs a heap allocation
    // per response (hyper's header buffer leaves the stack).
    if let Some(max) = max_headers {
        builder.max_headers(max);
    }
    let (sender, conn) = builder.handshake(io).await.map_err(SendError::Exchange)?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "upstream connection ended with an error");
        }
    });
    Ok(Conn { sender, tcp })
}

/// The request line's target: `/path?query`, as HTTP/1.1 sends it to an origin server.
fn origin_form(uri: &mut Uri) {
    let mut parts = std::mem::take(uri).into_parts();
    parts.scheme = None;
    parts.authority = None;
    *uri = Uri::from_parts(parts).unwrap_or_default();
}

pin_project_lite::pin_project! {
    /// An upstream response body. When it ends, its HTTP/1 connection goes back to the pool; a
    /// body that fails or is dropped before its end takes its connection with it (hyper closes
    /// it: its state is unknown).
    pub struct UpstreamBody {
        #[pin]
        inner: Incoming,
        back: Option<Checkin>,
    }
}

struct Checkin {
    conn: Conn,
    pool: Arc<Pool>,
    /// Whether the request's body has been read to its end.
    uploaded: Completion,
}

impl UpstreamBody {
    fn unpooled(inner: Incoming) -> Self {
        UpstreamBody { inner, back: None }
    }

    fn pooled(inner: Incoming, conn: Conn, pool: &Arc<Pool>, uploaded: Completion) -> Self {
        let mut back = Some(Checkin {
            conn,
            pool: pool.clone(),
            uploaded,
        });
        if inner.is_end_stream() {
            // No body (a 202, a HEAD, `Content-Length: 0`): the connection is free now.
            check_in(&mut back);
        }
        UpstreamBody { inner, back }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Err(_)) => *this.back = None,
            None => check_in(this.back),
            Some(Ok(_)) if inner.is_end_stream() => check_in(this.back),
            Some(Ok(_)) => {}
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

/// Returns the connection to the pool, if its request body was read to the end; otherwise it is
/// dropped, and hyper closes it once the upload is over.
fn check_in(back: &mut Option<Checkin>) {
    if let Some(Checkin {
        conn,
        pool,
        uploaded,
    }) = back.take()
    {
        if uploaded.is_complete() {
            pool.checkin(conn);
        }
    }
}

#[cfg(test)]
mod tests;
