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

pub mod connector;
pub mod pool;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub use connector::{ConnectError, ConnectErrorKind, Connector, UpstreamConnector, UpstreamIo};
use pool::Pool;

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
    },
    /// `https://`: hyper-util's client (HTTP/1.1, or HTTP/2 by ALPN). Boxed: it is large, and
    /// the plain variant is the common one.
    Pooled(Box<HyperClient<UpstreamConnector, ReplayBody>>),
}

impl Client {
    /// A client for the upstream at `base` whose connections are made within `connect_timeout`
    /// and closed after `pool_idle` idle. With `tls` (an `https://` upstream) connections are TLS and may speak
    /// HTTP/2; plain ones speak HTTP/1.1.
    pub fn new(
        base: Uri,
        connect_timeout: Duration,
        pool_idle: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Client {
        let inner = match tls {
            None => Inner::Http1 {
                base,
                connector: UpstreamConnector::new(connect_timeout, None),
                pool: Pool::new(pool_idle),
            },
            Some(tls) => Inner::Pooled(Box::new(
                HyperClient::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(pool_idle)
                    // A request on a pooled connection that the upstream closed before anything
                    // was written is handed back by hyper and sent on a new connection.
                    .retry_canceled_requests(true)
                    .build(UpstreamConnector::new(connect_timeout, Some(tls))),
            )),
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
            } => send_http1(base, connector, pool, req).await,
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
    mut req: Request<ReplayBody>,
) -> Result<Response<UpstreamBody>, SendError> {
    origin_form(req.uri_mut());
    // A connection may take the next request only once this one's body is written too: an
    // upstream may answer before reading it all (a 404 for a forgotten session does), and the
    // next request must not wait behind a slow client's upload.
    let uploaded = req.body().completion();
    loop {
        let (mut sender, pooled) = match pool.checkout() {
            Some(sender) => (sender, true),
            // Boxed: a new connection is the rare case, and its future is large.
            None => (Box::pin(connect(connector, base)).await?, false),
        };
        // A pooled connection became idle when its last response ended; hyper may still be
        // finishing that exchange, so wait until it takes a new request (or turns out closed).
        if pooled && sender.ready().await.is_err() {
            continue;
        }
        match sender.try_send_request(req).await {
            Ok(resp) => {
                let (head, body) = resp.into_parts();
                return Ok(Response::from_parts(
                    head,
                    UpstreamBody::pooled(body, sender, pool, uploaded),
                ));
            }
            Err(mut failed) => match failed.take_message() {
                Some(back) if pooled => req = back,
                _ => return Err(SendError::Exchange(failed.into_error())),
            },
        }
    }
}

/// A new HTTP/1 connection, driven by its own task.
async fn connect(
    connector: &UpstreamConnector,
    uri: &Uri,
) -> Result<SendRequest<ReplayBody>, SendError> {
    use tower_service::Service;
    let io = connector
        .clone()
        .call(uri.clone())
        .await
        .map_err(SendError::Connect)?;
    let (sender, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(SendError::Exchange)?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "upstream connection ended with an error");
        }
    });
    Ok(sender)
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
    sender: SendRequest<ReplayBody>,
    pool: Arc<Pool>,
    /// Whether the request's body has been read to its end.
    uploaded: Completion,
}

impl UpstreamBody {
    fn unpooled(inner: Incoming) -> Self {
        UpstreamBody { inner, back: None }
    }

    fn pooled(
        inner: Incoming,
        sender: SendRequest<ReplayBody>,
        pool: &Arc<Pool>,
        uploaded: Completion,
    ) -> Self {
        let mut back = Some(Checkin {
            sender,
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
        sender,
        pool,
        uploaded,
    }) = back.take()
    {
        if uploaded.is_complete() {
            pool.checkin(sender);
        }
    }
}
