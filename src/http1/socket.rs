//! The TCP socket under a client's TLS session, written to the way a socket costs least.
//!
//! rustls hands its sealed records to the socket as a vectored write, mostly one record at a
//! time, and tokio makes every vectored write a `writev`; [`Socket`] passes them through
//! [`super::encode::poll_write_parts`] instead, so that one record goes out with a `send` (and
//! a few small ones gathered into one), as holdfast's own plain writes do.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::encode::poll_write_parts;

/// A TCP socket whose vectored writes are made as cheap plain ones where they can be.
#[derive(Debug)]
pub struct Socket(TcpStream);

impl Socket {
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
        bufs: &[io::IoSlice<'_>],
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Vectored writes arrive whole and in order, gathered (small) or passed on (large), with
    /// empty parts among them; a write of nothing but empty parts writes nothing.
    #[tokio::test]
    async fn vectored_writes_arrive_whole_and_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let mut socket = Socket::new(accepted.unwrap().0);
        let mut peer = client.unwrap();

        let big = vec![b'b'; 8192];
        let mut sent = Vec::new();
        for parts in [
            vec![&b"one record"[..]],
            vec![&b"head "[..], &b""[..], &b"and body"[..]],
            vec![&b"a head before "[..], &big[..], &b" and after"[..]],
        ] {
            let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let mut slices = &mut slices[..];
            while !slices.is_empty() {
                let n = std::future::poll_fn(|cx| {
                    Pin::new(&mut socket).poll_write_vectored(cx, slices)
                })
                .await
                .unwrap();
                assert!(n > 0);
                IoSlice::advance_slices(&mut slices, n);
            }
            sent.extend(parts.concat());
        }
        let nothing = [IoSlice::new(&[]), IoSlice::new(&[])];
        let n = std::future::poll_fn(|cx| Pin::new(&mut socket).poll_write_vectored(cx, &nothing));
        assert_eq!(n.await.unwrap(), 0);
        socket.shutdown().await.unwrap();

        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }
}
