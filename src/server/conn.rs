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
use crate::http1::conn::{Io, READ_SIZE};
use crate::http1::read::poll_read_buf;
use crate::proxy::Proxy;
use crate::replay::ClientBody;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What every connection is served with.
#[derive(Clone)]
pub struct Served {
    /// The proxy requests go to.
    pub proxy: Arc<Proxy>,
    /// The HTTP/2 server's settings.
    pub h2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
    /// Limits of HTTP/1 connections.
    pub limits: Limits,
    /// True once a drain began.
    pub drain: watch::Receiver<bool>,
}

impl Served {
    /// Serves a plain connection: HTTP/2 if it opens with the preface, else HTTP/1.1. One that
    /// sends nothing within `limits.header_read_timeout_secs` (or is closed to make room, or
    /// meets a drain first) is closed.
    pub async fn plain(self, stream: TcpStream, peer: SocketAddr, registered: Arc<Registered>) {
        self.by_preface(Io::Tcp(stream), peer, registered).await
    }

    /// Serves a TLS connection by the protocol its client picked by ALPN, or, when it picked
    /// none, by its first bytes as a plain one.
    pub async fn tls(
        self,
        stream: TlsStream<TcpStream>,
        peer: SocketAddr,
        registered: Arc<Registered>,
    ) {
        match stream.get_ref().1.alpn_protocol() {
            Some(b"h2") => self.h2(TokioIo::new(stream), peer, registered).await,
            Some(_) => {
                let io = Io::Tls(Box::new(stream));
                self.h1(io, BytesMut::new(), peer, registered).await
            }
            None => {
                self.by_preface(Io::Tls(Box::new(stream)), peer, registered)
                    .await
            }
        }
    }

    /// HTTP/2 if the connection opens with the preface, else HTTP/1.1.
    async fn by_preface(mut self, mut io: Io, peer: SocketAddr, registered: Arc<Registered>) {
        let limit = self.limits.header_read_timeout;
        let detected = tokio::select! {
            detected = tokio::time::timeout(limit, detect(&mut io)) => detected.ok().flatten(),
            () = registered.closed() => None,
            Ok(()) = self.drain.changed() => None,
        };
        match detected {
            Some((true, read)) => {
                let io = Prefixed { read, io };
                self.h2(TokioIo::new(io), peer, registered).await
            }
            Some((false, read)) => self.h1(io, read, peer, registered).await,
            None => {}
        }
    }

    async fn h1(self, io: Io, read: BytesMut, peer: SocketAddr, registered: Arc<Registered>) {
        h1::Connection::new(
            io,
            read,
            self.proxy,
            peer,
            registered,
            self.drain,
            self.limits,
        )
        .serve()
        .await
    }

    /// hyper's HTTP/2: each stream's request goes to the proxy; the connection closes
    /// gracefully (GOAWAY) on a drain, and goes at once when closed to make room while idle.
    async fn h2<I>(mut self, io: TokioIo<I>, peer: SocketAddr, registered: Arc<Registered>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (proxy, in_service) = (self.proxy.clone(), registered.clone());
        let service = service_fn(move |req: http::Request<Incoming>| {
            let (proxy, registered) = (proxy.clone(), in_service.clone());
            async move {
                // Busy from the request's start to its response body's end.
                let busy = registered.begin();
                let resp = proxy.handle(req.map(ClientBody::H2), peer).await;
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

/// Reads a connection's first bytes until they show HTTP/2's preface (true) or not (false),
/// with what was read. `None` when the client closed first.
async fn detect(stream: &mut Io) -> Option<(bool, BytesMut)> {
    let mut read = BytesMut::new();
    loop {
        let n = std::future::poll_fn(|cx| poll_read_buf(stream, cx, &mut read, READ_SIZE))
            .await
            .ok()?;
        if n == 0 {
            return None;
        }
        let seen = read.len().min(PREFACE.len());
        if read[..seen] != PREFACE[..seen] {
            return Some((false, read));
        }
        if read.len() >= PREFACE.len() {
            return Some((true, read));
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
