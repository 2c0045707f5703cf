//! A writer for tests: it takes at most `step` bytes per write, plain or vectored (as a socket
//! does), and records the shape of each write.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

/// See the module.
pub struct Trickle {
    /// What was written.
    pub out: Vec<u8>,
    step: usize,
    /// The parts handed over by each write: `1` for a plain one.
    pub calls: Vec<usize>,
}

impl Trickle {
    /// A writer that takes at most `step` bytes per write.
    pub fn new(step: usize) -> Self {
        Trickle {
            out: Vec::new(),
            step,
            calls: Vec::new(),
        }
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.calls.push(1);
        let n = buf.len().min(self.step);
        self.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.calls.push(bufs.len());
        let mut room = self.step;
        for buf in bufs {
            let n = buf.len().min(room);
            self.out.extend_from_slice(&buf[..n]);
            room -= n;
        }
        Poll::Ready(Ok(self.step - room))
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
