//! Connecting to the upstream: TCP (and TLS for `https://`), with typed failures.
//!
//! The connector exists for three reasons. First, it resolves the upstream's name afresh for
//! every new connection: a recreated container comes back at a new address, and a cached address
//! would keep the outage going after the backend is back. Second, it reports *why* a connection
//! failed ([`ConnectErrorKind`]) as a typed cause, so the classifier can tell "refused" from "DNS"
//! from "timed out" from "certificate not trusted" by walking the error chain instead of reading
//! messages. Third, for an `https://` upstream it runs the TLS handshake (rustls), with SNI and
//! verification against the upstream URL's host, and tells hyper by ALPN whether the connection
//! speaks HTTP/2.
//!
//! Everything the connector reports happened before a byte of the request was written: a
//! [`ConnectError`] anywhere in a send error's chain proves the request never reached the
//! application.
//!
//! Two connectors share the TCP part: [`UpstreamConnector`] (TCP, then TLS for https) is what the
//! client sends through; [`Connector`] is the bare TCP connect that the hold prober uses to ask
//! "does anything listen again?". The probe deliberately stops at TCP: a listening socket is all
//! it has to show, and the oldest held request, sent through [`UpstreamConnector`], then proves
//! the rest, TLS included.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use prometheus_client::metrics::gauge::Gauge;

use super::open::Open;
use crate::http1::socket::Socket;

/// Why a connection to the upstream could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectErrorKind {
    /// Nothing listens on the port.
    Refused,
    /// The TCP handshake did not finish in time.
    Timeout,
    /// The name did not resolve.
    Dns,
    /// No route to the host or network.
    Unreachable,
    /// Anything else that happened before the connection existed.
    Other,
    /// The TLS handshake failed on a certificate or the protocol (not on I/O): the upstream's
    /// certificate is not trusted or not for its name, it refused ours, or nothing is shared.
    Tls,
}

impl ConnectErrorKind {
    fn what(self) -> &'static str {
        match self {
            ConnectErrorKind::Tls => "the TLS handshake with the upstream failed",
            _ => "connecting to the upstream failed",
        }
    }
}

/// A failure to connect, keeping the underlying cause.
#[derive(Debug, thiserror::Error)]
#[error("{} ({kind:?})", kind.what())]
pub struct ConnectError {
    kind: ConnectErrorKind,
    #[source]
    source: io::Error,
}

impl ConnectError {
    /// Wraps `source` as a connect failure of `kind`.
    pub fn new(kind: ConnectErrorKind, source: io::Error) -> Self {
        Self { kind, source }
    }

    /// What kind of failure.
    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }

    fn from_io(source: io::Error) -> Self {
        let kind = match source.kind() {
            io::ErrorKind::ConnectionRefused => ConnectErrorKind::Refused,
            io::ErrorKind::TimedOut => ConnectErrorKind::Timeout,
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                ConnectErrorKind::Unreachable
            }
            _ => ConnectErrorKind::Other,
        };
        Self { kind, source }
    }
}

/// The bare TCP connect: resolve, then connect, under one deadline. The hold prober's probe.
#[derive(Clone, Debug)]
pub struct Connector {
    connect_timeout: Duration,
}

impl Connector {
    /// A connector whose resolve + connect is bounded by `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self { connect_timeout }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let (host, port) = host_and_port(&uri)?;
            within(timeout, connect(&Resolver::System, &host, port))
                .await
                .map(TokioIo::new)
        })
    }
}

/// How the upstream's name becomes addresses. Asked again for every connection, never cached.
#[derive(Clone, Default)]
pub(crate) enum Resolver {
    /// The system's resolver (`getaddrinfo`, on tokio's blocking pool): /etc/hosts, then DNS
    /// (Docker's embedded server, a cluster's CoreDNS).
    #[default]
    System,
    /// Answers the tests change between connections, as a DNS server's answer changes when a
    /// container is recreated at a new address.
    #[cfg(test)]
    Table(std::sync::Arc<Lookup>),
}

/// A test's resolver: name and port to addresses.
#[cfg(test)]
pub(crate) type Lookup = dyn Fn(&str, u16) -> Vec<SocketAddr> + Send + Sync;

impl Resolver {
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
        match self {
            Resolver::System => Ok(tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| ConnectError::new(ConnectErrorKind::Dns, e))?
                .collect()),
            #[cfg(test)]
            Resolver::Table(answer) => Ok(answer(host, port)),
        }
    }
}

/// What the client connects through: TCP, then TLS for an `https://` upstream, with the whole
/// of resolve + connect + handshake under `connect_timeout`.
#[derive(Clone)]
pub struct UpstreamConnector {
    connect_timeout: Duration,
    /// Present for an `https://` upstream.
    tls: Option<tokio_rustls::TlsConnector>,
    resolver: Resolver,
    /// Counts the connections made while they are open (`holdfast_upstream_connections`).
    open: Option<Gauge>,
}

impl UpstreamConnector {
    /// Connects within `connect_timeout` (resolve, TCP and TLS together); TLS when `tls` is
    /// given (an `https://` upstream).
    pub fn new(
        connect_timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Self {
        Self {
            connect_timeout,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            resolver: Resolver::System,
            open: None,
        }
    }

    /// The same connector, counting each connection it makes in `open` while it lives.
    pub fn counting(self, open: Gauge) -> Self {
        Self {
            open: Some(open),
            ..self
        }
    }

    /// The count of one connection just made.
    pub fn opened(&self) -> Open {
        Open::new(self.open.as_ref())
    }

    /// The same connector, resolving through `resolver`.
    #[cfg(test)]
    pub(crate) fn with_resolver(self, resolver: Resolver) -> Self {
        Self { resolver, ..self }
    }
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = UpstreamIo;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let timeout = self.connect_timeout;
        let tls = self.tls.clone();
        let resolver = self.resolver.clone();
        let open = self.open.clone();
        Box::pin(async move {
            let (host, port) = host_and_port(&uri)?;
            within(timeout, async move {
                // Written through `Socket`, as every socket holdfast writes to is.
                let socket = Socket::new(connect(&resolver, &host, port).await?);
                let open = Open::new(open.as_ref());
                let Some(tls) = tls else {
                    return Ok(UpstreamIo {
                        io: TokioIo::new(Either::Left(socket)),
                        _open: open,
                    });
                };
                // SNI and certificate verification use the upstream URL's host, never anything a
                // client sent (the Host header is the client's to choose).
                let name = ServerName::try_from(host).map_err(|e| {
                    ConnectError::new(
                        ConnectErrorKind::Tls,
                        io::Error::new(io::ErrorKind::InvalidInput, e),
                    )
                })?;
                let stream = tls
                    .connect(name, socket)
                    .await
                    .map_err(ConnectError::from_handshake)?;
                Ok(UpstreamIo {
                    io: TokioIo::new(Either::Right(Box::new(stream))),
                    _open: open,
                })
            })
            .await
        })
    }
}

impl UpstreamConnector {
    /// A plain TCP connection to `uri`'s host and port within the connect timeout: what
    /// holdfast's own HTTP/1 path sends on (an `http://` upstream).
    pub async fn connect_tcp(&self, uri: &Uri) -> Result<TcpStream, ConnectError> {
        let (host, port) = host_and_port(uri)?;
        within(self.connect_timeout, connect(&self.resolver, &host, port)).await
    }
}

impl std::fmt::Debug for UpstreamConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnector")
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ConnectError {
    /// A failed TLS handshake: a rustls error (certificate, alert, protocol) is [`Tls`]; an I/O
    /// failure during the handshake (reset, EOF: the server went away) is a connection failure
    /// like any other, and the request was still never sent.
    ///
    /// [`Tls`]: ConnectErrorKind::Tls
    fn from_handshake(source: io::Error) -> Self {
        let is_tls = source
            .get_ref()
            .is_some_and(|inner| inner.is::<rustls::Error>());
        if is_tls {
            Self::new(ConnectErrorKind::Tls, source)
        } else {
            Self::from_io(source)
        }
    }
}

/// A connection to the upstream: plain for `http://` (`Left`), TLS for `https://` (`Right`,
/// boxed: a TLS session is large and the plain one is common). tokio-util's `Either` passes
/// reads and writes to the one it holds; a type of holdfast's own only because hyper-util asks
/// it what the connection negotiated ([`Connection`]).
#[derive(Debug)]
pub struct UpstreamIo {
    io: TokioIo<Either<Socket, Box<TlsStream<Socket>>>>,
    /// Counts it in `holdfast_upstream_connections` while it is open.
    _open: Open,
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self.io.inner() {
            Either::Left(_) => Connected::new(),
            Either::Right(tls) => {
                // hyper-util's client switches this connection (and its pool slot) to HTTP/2
                // when the server picked `h2` by ALPN.
                if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                    Connected::new().negotiated_h2()
                } else {
                    Connected::new()
                }
            }
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

/// The host (without IPv6 brackets) and port to connect to; the port defaults by scheme.
fn host_and_port(uri: &Uri) -> Result<(String, u16), ConnectError> {
    let host = uri
        .host()
        .ok_or_else(|| {
            ConnectError::new(ConnectErrorKind::Other, io::Error::other("no host in URI"))
        })?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let default_port = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
        443
    } else {
        80
    };
    Ok((host, uri.port_u16().unwrap_or(default_port)))
}

/// Runs `connecting` under `timeout`. The whole of resolve + connect (+ handshake) shares one
/// deadline, so a hanging resolver or a server that never finishes the handshake counts as a
/// timeout too.
async fn within<T>(
    timeout: Duration,
    connecting: impl Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(result) => result,
        Err(_) => Err(ConnectError::new(
            ConnectErrorKind::Timeout,
            io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        )),
    }
}

async fn connect(resolver: &Resolver, host: &str, port: u16) -> Result<TcpStream, ConnectError> {
    let addrs = resolver.resolve(host, port).await?;
    if addrs.is_empty() {
        return Err(ConnectError::new(
            ConnectErrorKind::Dns,
            io::Error::new(io::ErrorKind::NotFound, format!("{host} has no addresses")),
        ));
    }
    // Try each address in turn; report the last failure (they are usually all the same kind).
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                // MCP messages are small and latency-bound.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = Some(ConnectError::from_io(e)),
        }
    }
    Err(last.expect("at least one address was tried"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service;

    #[tokio::test]
    async fn refused_is_typed() {
        // Bind then drop to find a port with nothing listening.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut c = Connector {
            connect_timeout: Duration::from_secs(5),
        };
        let err = c
            .call(format!("http://{addr}").parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ConnectErrorKind::Refused);
    }

    #[tokio::test]
    async fn unresolvable_name_is_dns() {
        let mut c = Connector {
            connect_timeout: Duration::from_secs(5),
        };
        // `.invalid` is reserved (RFC 6761) and never resolves.
        let err = c
            .call("http://holdfast-test.invalid:80".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ConnectErrorKind::Dns);
    }
}
