use super::*;
use crate::http1::trickle::Trickle;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `parts` with [`poll_write_parts`] to a writer that takes everything, until all are
/// taken: the writer, with the shape of each write.
fn written(parts: &[&[u8]]) -> Trickle {
    let mut w = Trickle::new(usize::MAX);
    let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let mut slices = &mut slices[..];
    let mut cx = Context::from_waker(std::task::Waker::noop());
    while slices.iter().any(|s| !s.is_empty()) {
        let Poll::Ready(Ok(n)) = poll_write_parts(&mut cx, &mut w, slices) else {
            panic!("a write that takes everything failed or waited");
        };
        IoSlice::advance_slices(&mut slices, n);
    }
    w
}

/// One part, or a head and a small body, leave in one plain write (a `send`, not a `writev`),
/// the parts copied together; parts too large to copy leave in one vectored write; empty parts
/// are not counted. The bytes are the same every way.
#[test]
fn small_parts_are_written_in_one_plain_write_large_ones_vectored() {
    let head = b"POST /mcp HTTP/1.1\r\ncontent-length: 1024\r\n\r\n".to_vec();
    let body = vec![b'x'; 1024];
    let message = [&head[..], &body[..]].concat();

    let w = written(&[&message]);
    assert_eq!(w.calls, [1], "one part, one plain write");

    let w = written(&[&head, b"", &body, b""]);
    assert_eq!(w.out, message);
    assert_eq!(w.calls, [1], "head and body copied into one plain write");

    let w = written(&[b"", &message, b""]);
    assert_eq!(w.calls, [1], "one part among empty ones, one plain write");

    // The most that is copied, and one byte more.
    let head = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    for (body_len, want) in [(GATHERED - head.len(), 1), (GATHERED - head.len() + 1, 2)] {
        let body = vec![b'y'; body_len];
        let w = written(&[&head, &body]);
        assert_eq!(w.out, [&head[..], &body[..]].concat());
        assert_eq!(w.calls, [want], "{body_len} bytes of body");
    }

    let mut w = Trickle::new(usize::MAX);
    let nothing = [IoSlice::new(b""), IoSlice::new(b"")];
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let n = poll_write_parts(&mut cx, &mut w, &nothing);
    assert!(matches!(n, Poll::Ready(Ok(0))));
    assert!(w.calls.is_empty(), "nothing to write, no write");
}

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
            let n =
                std::future::poll_fn(|cx| Pin::new(&mut socket).poll_write_vectored(cx, slices))
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

/// A TLS client that stops reading (a slow SSE reader): small messages, each handed to the
/// session in two parts as holdfast's writer hands them, fill the socket; the session queues
/// sealed records, and the next write hands the socket several records at once, which it
/// gathers. Every message arrives once the client reads again.
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
                    let poll = Pin::new(&mut tls).poll_write_vectored(cx, parts);
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
