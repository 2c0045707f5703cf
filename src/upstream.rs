//! The upstream client: a pooled hyper-util client over a connector of our own.
//!
//! The connector exists for two reasons. First, it resolves the upstream's name afresh for every
//! new connection: a recreated container comes back at a new address, and a cached address would
//! keep the outage going after the backend is back. Second, it reports *why* a connection failed
//! ([`ConnectErrorKind`]) as a typed cause, so the classifier can tell "refused" from "DNS" from
//! "timed out" by walking the error chain instead of reading messages.
//!
//! Everything the connector reports happened before a byte of the request was written: a
//! [`ConnectError`] anywhere in a send error's chain proves the request never reached the
//! application.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::replay::ReplayBody;

/// The pooled client the proxy sends through.
pub type Client = HyperClient<Connector, ReplayBody>;

/// Builds the client. Pooled connections are reused (keep-alive) and expire after `idle`.
pub fn client(connect_timeout: Duration, pool_idle: Duration) -> Client {
    HyperClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(pool_idle)
        // A request on a pooled connection that the upstream closed before we wrote anything is
        // handed back by hyper and sent again on a new connection: it never reached the app.
        .retry_canceled_requests(true)
        .build(Connector::new(connect_timeout))
}

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
}

/// A failure to connect, keeping the underlying cause.
#[derive(Debug, thiserror::Error)]
#[error("connecting to the upstream failed ({kind:?})")]
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

/// Resolves and connects, once per new pooled connection.
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
            let host = uri
                .host()
                .ok_or_else(|| {
                    ConnectError::new(ConnectErrorKind::Other, io::Error::other("no host in URI"))
                })?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(80);
            // The whole of resolve + connect runs under one deadline, so a hanging resolver
            // counts as a timeout too.
            match tokio::time::timeout(timeout, connect(host, port)).await {
                Ok(result) => result,
                Err(_) => Err(ConnectError::new(
                    ConnectErrorKind::Timeout,
                    io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
                )),
            }
        })
    }
}

async fn connect(host: String, port: u16) -> Result<TokioIo<TcpStream>, ConnectError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| ConnectError::new(ConnectErrorKind::Dns, e))?
        .collect();
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
                return Ok(TokioIo::new(stream));
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
