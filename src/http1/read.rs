//! Reading into a buffer that exists only while bytes are arriving.
//!
//! An idle connection (a keep-alive one between requests, an event stream between events) has
//! nothing to read, so it should hold nothing to read into. A read here first waits for the
//! socket to be readable, then allocates (or tops up) the buffer, then reads. What was read
//! leaves as `Bytes` split off the buffer; once the buffer is empty the caller lets go of it
//! ([`release`]), and the allocation goes with the last of those `Bytes`.
//!
//! Letting go means handing it to a small per-thread stash of spare buffers, which the next
//! read on any connection of that thread takes: the memory of the connections that are idle is
//! in the stash (a few buffers per thread), not in each of them, and a busy proxy does not
//! allocate and free a buffer per read.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

pub(crate) mod sealed {
    /// Only this crate's connections are [`super::Readable`]: [`super::poll_read_buf`] trusts
    /// their reads with a buffer's uninitialised room. (Each connection type says so where it
    /// is defined: `conn::Io` in conn.rs.)
    pub trait Sealed {}
    impl Sealed for tokio::net::TcpStream {}
}

/// A connection whose readiness can be awaited without a buffer. Sealed: implemented by this
/// crate's connection types only.
pub trait Readable: AsyncRead + Unpin + sealed::Sealed {
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
        // Nothing is taken before there is something to read.
        ready!(io.poll_readable(cx))?;
        if buf.capacity() == 0 {
            *buf = take();
        }
        buf.reserve(size.max(1));
    }
    let spare = buf.spare_capacity_mut();
    let mut read = ReadBuf::uninit(spare);
    let start = read.filled().as_ptr();
    // tokio's read clears the socket's readiness on a short read: the next read waits for
    // epoll instead of asking the kernel again only to hear EAGAIN.
    ready!(Pin::new(&mut *io).poll_read(cx, &mut read))?;
    // A reader that put another buffer in the `ReadBuf` would have filled that one, not ours
    // (tokio-util's `poll_read_buf` checks the same).
    assert_eq!(
        start,
        read.filled().as_ptr(),
        "the reader swapped the read buffer"
    );
    let n = read.filled().len();
    // SAFETY: `read` still points at `buf`'s spare capacity (checked above), and a `ReadBuf`
    // counts as filled only bytes that were initialised: the first `n` bytes of that spare
    // capacity now are.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

/// Lets go of the buffer when nothing is left in it (what was split off keeps its own share of
/// the allocation): an idle plain connection holds no buffer (a TLS one still has rustls's).
/// Its spare room goes to the stash.
pub fn release(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        let mut spare = std::mem::take(buf);
        // Unshared (everything split off it is gone), its whole allocation is spare again;
        // shared, only its own spare room counts.
        if spare.try_reclaim(STASHED) {
            STASH.with(|stash| {
                let mut stash = stash.borrow_mut();
                if stash.len() < STASH_MAX {
                    stash.push(spare);
                }
            });
        }
    }
}

/// Spare room a buffer must have to be stashed.
const STASHED: usize = 4096;

/// Most buffers stashed per thread.
const STASH_MAX: usize = 16;

thread_local! {
    static STASH: std::cell::RefCell<Vec<BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A stashed buffer, or a new empty one.
fn take() -> BytesMut {
    STASH
        .with(|stash| stash.borrow_mut().pop())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that fills a buffer of its own instead of the one it is given: what the check
    /// before `set_len` is for.
    struct Swapper;

    impl sealed::Sealed for Swapper {}

    impl Readable for Swapper {
        fn poll_readable(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Swapper {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let other: &'static mut [u8] = Box::leak(vec![7u8; 64].into_boxed_slice());
            *buf = ReadBuf::new(other);
            buf.advance(64);
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    #[should_panic(expected = "the reader swapped the read buffer")]
    fn a_reader_that_swaps_the_buffer_is_caught_before_set_len() {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut buf = BytesMut::new();
        let _ = poll_read_buf(&mut Swapper, &mut cx, &mut buf, 64);
    }
}
