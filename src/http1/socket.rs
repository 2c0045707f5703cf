//! Every TCP socket holdfast writes to, written to the way a socket costs least.
//!
//! Writers hand a socket their parts in one vectored write: holdfast's HTTP/1 writer a head
//! with its body, hyper's HTTP/2 its frames, rustls a client's or upstream's sealed records.
//! tokio makes every vectored write a `writev`, which goes through the kernel's file layer (the
//! iovec array copied in and checked, `vfs_writev`, `sock_write_iter`) where a plain write is a
//! `send`; for a few small parts the copy into one buffer costs less than that layer.
//! [`Socket`] decides, and is the one place that does: a client's connection, plain or under
//! its TLS session (`http1::conn::Io`), and both kinds of upstream connection (holdfast's own
//! HTTP/1 client's, `upstream::h1::Conn`, and hyper-util's, `upstream::connector::UpstreamIo`).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::read::{sealed, Readable};

/// A TCP socket whose vectored writes are made as cheap plain ones where they can be.
#[derive(Debug)]
pub struct Socket(TcpStream);

impl Socket {
    /// A connected socket (accepted from a client, or connected to the upstream).
    pub fn new(tcp: TcpStream) -> Self {
        Socket(tcp)
    }

    /// The socket itself.
    pub fn tcp(&self) -> &TcpStream {
        &self.0
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_write_parts(cx, &mut self.get_mut().0, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl sealed::Sealed for Socket {}

impl Readable for Socket {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read_ready(cx)
    }
}

/// Writes what it can of `parts`, in order, the way that costs least: one part with a plain
/// write; a few small ones (at most [`GATHERED`] bytes in all: a head with a JSON-RPC body, a
/// TLS record or two) copied into one buffer and written with a plain write; larger ones in one
/// vectored write. Measured (`benches/alternate.sh`, 14 rounds, a 1 KiB POST): 0.93 x the
/// system time and 0.94 x the CPU per proxied request of a `writev` for each. `Ok(0)` if every
/// part is empty. Generic only for its tests: [`Socket`] calls it with its `TcpStream`, whose
/// vectored writes are `writev`s.
fn poll_write_parts<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    parts: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let mut filled = parts.iter().filter(|p| !p.is_empty());
    let Some(first) = filled.next() else {
        return Poll::Ready(Ok(0));
    };
    if filled.next().is_none() {
        return Pin::new(io).poll_write(cx, first);
    }
    if parts.iter().map(|p| p.len()).sum::<usize>() <= GATHERED {
        poll_write_gathered(cx, io, parts)
    } else {
        Pin::new(io).poll_write_vectored(cx, parts)
    }
}

/// The most bytes of several parts [`poll_write_parts`] copies to write them as one.
const GATHERED: usize = 4096;

thread_local! {
    /// The buffer parts are gathered in, one per thread (it is filled and written in one call).
    static GATHER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Writes `parts` as one buffer. The thread's buffer is taken out while it is written, not
/// borrowed: nothing can find it in use, whatever the writer does.
fn poll_write_gathered<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    parts: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let mut buf = GATHER.take();
    buf.clear();
    for part in parts {
        buf.extend_from_slice(part);
    }
    let written = Pin::new(io).poll_write(cx, &buf);
    GATHER.set(buf);
    written
}

#[cfg(test)]
mod tests;
