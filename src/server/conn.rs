//! One client connection after it was accepted (and its TLS handshake done): HTTP/2 (hyper's) or
//! HTTP/1.1 (holdfast's own, [`super::h1`]), served until it ends.
//!
//! A plain connection says which by its first bytes: HTTP/2 with prior knowledge (h2c) opens
//! with the connection preface, anything else is HTTP/1. A TLS connection said so by ALPN.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

use super::h1::{self, Limits};
use super::idle::{Registered, Tracked};
use crate::http1::conn::Io;
use crate::http1::socket::Socket;
use crate::metrics::{ClientConnections, Protocol, Transport};
use crate::proxy::current::Current;
use crate::replay::ClientBody;

/// What every connection is served with.
#[derive(Clone)]
pub struct Served {
    /// Where requests go: the proxy now (a reload replaces it).
    pub current: Arc<Current>,
    /// The HTTP/2 server's settings.
    pub h2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
    /// Limits of HTTP/1 connections.
    pub limits: Limits,
    /// True once a drain began.
    pub drain: watch::Receiver<bool>,
    /// Counts the connections open now, by protocol and transport.
    pub connections: ClientConnections,
}

impl Served {
    /// Serves a plain connection: HTTP/2 if it opens with the preface, else HTTP/1.1. One that
    /// sends nothing within `limits.header_read_timeout_secs` (or is closed to make room, or
    /// meets a drain first) is closed.
    pub async fn plain(self, stream: TcpStream, peer: SocketAddr, registered: Arc<Registered>) {
        self.h1_or_h2(Io::Left(Socket::new(stream)), true, peer, registered)
            .await
    }

    /// Serves a TLS connection by the protocol its client picked by ALPN, or, when it picked
    /// none, by its first bytes as a plain one.
    pub async fn tls(
        self,
        stream: TlsStream<Socket>,
        peer: SocketAddr,
        registered: Arc<Registered>,
    ) {
        let alpn = stream.get_ref().1.alpn_protocol();
        let (h2, may_be_http2) = (alpn == Some(b"h2"), alpn.is_none());
        if h2 {
            let io = TokioIo::new(stream);
            Box::pin(self.h2(io, Transport::tls, peer, registered)).await
        } else {
            let io = Io::Right(Box::new(stream));
            self.h1_or_h2(io, may_be_http2, peer, registered).await
        }
    }

    /// holdfast's HTTP/1.1 driver, which hands the connection back when `may_be_http2` and it
    /// opens with HTTP/2's preface. One future for both, so that an HTTP/1 connection's task
    /// carries no detection step of its own.
    async fn h1_or_h2(
        self,
        io: Io,
        may_be_http2: bool,
        peer: SocketAddr,
        registered: Arc<Registered>,
    ) {
        let transport = match io {
            Io::Left(_) => Transport::plain,
            Io::Right(_) => Transport::tls,
        };
        // HTTP/1 until it shows HTTP/2's preface (then counted as that instead).
        let open = self.connections.open(Protocol::http1, transport);
        let connection = h1::Connection::new(
            io,
            self.current.clone(),
            peer,
            registered.clone(),
            self.drain.clone(),
            self.limits,
            may_be_http2,
        );
        if let Some((io, read)) = connection.serve().await {
            drop(open);
            let io = Prefixed { read, io };
            // Boxed: an HTTP/2 connection's state is large, and every HTTP/1 connection's task
            // (most MCP clients speak HTTP/1.1) would otherwise be as large.
            Box::pin(self.h2(TokioIo::new(io), transport, peer, registered)).await
        }
    }

    /// hyper's HTTP/2: each stream's request goes to the proxy; the connection closes
    /// gracefully (GOAWAY) on a drain, and goes at once when closed to make room while idle.
    async fn h2<I>(
        mut self,
        io: TokioIo<I>,
        transport: Transport,
        peer: SocketAddr,
        registered: Arc<Registered>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let _open = self.connections.open(Protocol::http2, transport);
        let (current, in_service) = (self.current.clone(), registered.clone());
        let service = service_fn(move |req: http::Request<Incoming>| {
            // Each stream's request goes to the proxy of the moment it began.
            let (proxy, registered) = (current.get(), in_service.clone());
            async move {
                // Busy from the request's start to its response body's end.
                let busy = registered.begin();
                // Boxed: hyper spawns each stream as a task of its own, and a task's future is
                // moved into the task, and its stage rewritten when it ends, whole (the proxy's
                // future is kilobytes; a box is a pointer).
                let resp = Box::pin(proxy.handle(req.map(ClientBody::H2), peer)).await;
                Ok::<_, Infallible>(resp.map(|body| Tracked::new(body, busy)))
            }
        });
        let conn = self.h2.serve_connection(io, service);
        tokio::pin!(conn);
        let mut draining = false;
        loop {
            tokio::select! {
                served = &mut conn => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "client connection ended with an error");
                    }
                    return;
                }
                Ok(()) = self.drain.changed(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                // Idle the longest at the connection limit: dropped, as a keep-alive timeout
                // would. HTTP/2 streams run on tasks of their own, so this check narrows the
                // window in which one begins but does not close it.
                () = registered.closed() => if registered.may_close() {
                    return;
                },
            }
        }
    }
}

/// A connection whose first bytes were already read: they are read again first.
struct Prefixed {
    read: BytesMut,
    io: Io,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.read.is_empty() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read[..n]);
            this.read.advance(n);
            if this.read.is_empty() {
                this.read = BytesMut::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
