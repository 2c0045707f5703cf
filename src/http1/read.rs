//! Reading into a buffer that exists only while bytes are arriving.
//!
//! An idle connection (a keep-alive one between requests, an event stream between events) has
//! nothing to read, so it should hold nothing to read into. A read here first waits for the
//! socket to be readable, then allocates (or tops up) the buffer, then reads. What was read
//! leaves as `Bytes` split off the buffer; once the buffer is empty the caller drops it
//! ([`release`]), and the allocation goes with the last of those `Bytes`.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

/// A connection whose readiness can be awaited without a buffer.
pub trait Readable: AsyncRead + Unpin {
    /// Ready when a read would not block (or the socket has failed or closed).
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Readable for TcpStream {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

/// Reads what the socket has into `buf`, growing it by `size` when it is full: the number of
/// bytes read (0 at EOF).
pub fn poll_read_buf<R: Readable>(
    io: &mut R,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
    size: usize,
) -> Poll<io::Result<usize>> {
    if buf.capacity() == buf.len() {
        // Nothing is allocated before there is something to read.
        ready!(io.poll_readable(cx))?;
        buf.reserve(size.max(1));
    }
    let spare = buf.spare_capacity_mut();
    let mut read = ReadBuf::uninit(spare);
    // tokio's read clears the socket's readiness on a short read: the next read waits for
    // epoll instead of asking the kernel again only to hear EAGAIN.
    ready!(Pin::new(&mut *io).poll_read(cx, &mut read))?;
    let n = read.filled().len();
    // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

/// Drops the buffer's allocation when nothing is left in it (what was split off keeps its own
/// share): an idle connection holds no buffer.
pub fn release(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        *buf = BytesMut::new();
    }
}
