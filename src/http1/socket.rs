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
    /// A freshly accepted client socket, before its TLS handshake.
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
    use crate::http1::encode::poll_write_parts;
    use std::io::IoSlice;
    use std::sync::Arc;
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

    /// Client and server configs for a self-signed `localhost`.
    fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    /// A TLS client that stops reading (a slow SSE reader): small gathered messages fill the
    /// socket, the session queues sealed records, and the next write hands the socket several
    /// records at once, which it gathers inside the outer gathered write. Every message arrives
    /// once the client reads again.
    #[tokio::test]
    async fn a_tls_session_queueing_records_behind_a_slow_reader_loses_nothing() {
        let (server_config, client_config) = tls_configs();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (blocked_tx, blocked_rx) = tokio::sync::oneshot::channel::<()>();
        const EVENTS: usize = 20_000;
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
            let mut tls = acceptor.accept(Socket::new(tcp)).await.unwrap();
            let mut blocked = Some(blocked_tx);
            for n in 0..EVENTS {
                let event = format!("data: {n}\n\n");
                let mut parts = [IoSlice::new(b"event: e\n"), IoSlice::new(event.as_bytes())];
                let mut parts = &mut parts[..];
                while !parts.is_empty() {
                    let written = std::future::poll_fn(|cx| {
                        let poll = poll_write_parts(cx, &mut tls, parts);
                        if poll.is_pending() {
                            // The socket is full: the client may read now.
                            if let Some(tx) = blocked.take() {
                                let _ = tx.send(());
                            }
                        }
                        poll
                    })
                    .await
                    .unwrap();
                    IoSlice::advance_slices(&mut parts, written);
                }
            }
            tls.shutdown().await.unwrap();
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(client_config);
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = connector.connect(name, tcp).await.unwrap();
        blocked_rx.await.expect("the server's writes never waited");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        server.await.unwrap();
        let want: String = (0..EVENTS)
            .map(|n| format!("event: e\ndata: {n}\n\n"))
            .collect();
        assert!(
            got == want.as_bytes(),
            "{} bytes of {}",
            got.len(),
            want.len()
        );
    }
}
