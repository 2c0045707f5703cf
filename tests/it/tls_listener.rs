//! TLS in: the listener speaks TLS with ALPN (h2, http/1.1), streams SSE unbuffered, reloads a
//! changed certificate for new connections while old ones keep streaming, asks for client
//! certificates, and counts failed handshakes.
//!
//! Every certificate is made with rcgen (`support::tls`), in a directory of its own per test. The
//! test client is tokio-rustls with the same ring provider as holdfast.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use holdfast::config::RawConfig;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::KeyPair;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::sse::{event, push, sse_upstream, Events};
use crate::support::http::{response, Upstream};
use crate::support::process::{serving, Running};
use crate::support::proxy::{metric_value, raw_config, Holdfast};
use crate::support::tls::{listener_files, series, Ca, Dir, Leaf};
use crate::support::within;

// --- A TLS client ----------------------------------------------------------------------------

/// How the test client talks to holdfast's TLS listener.
fn client_tls(trusted: &Ca, identity: Option<&Leaf>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(holdfast::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(trusted.roots());
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(vec![leaf.der()], leaf.key_der())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Every connection shows the certificate served now, not one remembered by a resumed session.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// A request sender over one connection, HTTP/1.1 or HTTP/2 as ALPN decided.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One TLS connection to holdfast.
struct TlsConn {
    addr: SocketAddr,
    sender: Sender,
    /// The protocol ALPN picked.
    alpn: Option<Vec<u8>>,
    /// The certificate holdfast served.
    served: CertificateDer<'static>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl TlsConn {
    /// Connects and shakes hands (TLS, then HTTP as ALPN decided).
    async fn open(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<TlsConn, BoxError> {
        TlsConn::open_as(addr, config, false).await
    }

    /// Connects and shakes hands, then speaks HTTP/2 whatever ALPN said when `h2` (a client that
    /// starts with the HTTP/2 preface).
    async fn open_as(
        addr: SocketAddr,
        config: Arc<ClientConfig>,
        h2: bool,
    ) -> Result<TlsConn, BoxError> {
        let tcp = TcpStream::connect(addr).await?;
        let tls = TlsConnector::from(config)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        let session = tls.get_ref().1;
        let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
        let served = session.peer_certificates().unwrap()[0].clone().into_owned();
        let io = TokioIo::new(tls);
        let sender = if h2 || alpn.as_deref() == Some(b"h2") {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(TlsConn {
            addr,
            sender,
            alpn,
            served,
        })
    }

    /// Sends a request for `path` (origin form and Host on HTTP/1.1, `:authority` on HTTP/2).
    async fn send(
        &mut self,
        req: http::request::Builder,
        path: &str,
    ) -> hyper::Result<Response<Incoming>> {
        let authority = format!("localhost:{}", self.addr.port());
        match &mut self.sender {
            Sender::H1(s) => {
                let req = req
                    .uri(path)
                    .header("host", authority)
                    .body(Full::default())
                    .unwrap();
                s.send_request(req).await
            }
            Sender::H2(s) => {
                let req = req
                    .uri(format!("https://{authority}{path}"))
                    .body(Full::default())
                    .unwrap();
                s.send_request(req).await
            }
        }
    }

    async fn get(&mut self, path: &str) -> hyper::Result<Response<Incoming>> {
        self.send(Request::get(path), path).await
    }
}

/// GET `path` on a new connection: status and body, or the error.
async fn get_once(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    path: &str,
) -> Result<(StatusCode, Version, String), BoxError> {
    let mut conn = TlsConn::open(addr, config).await?;
    let resp = conn.get(path).await?;
    let (status, version) = (resp.status(), resp.version());
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, version, String::from_utf8(body.to_vec())?))
}

// --- holdfast with TLS -----------------------------------------------------------------------

/// A raw configuration in front of `upstream` whose listener speaks TLS with `cert`/`key`.
fn tls_config(upstream: &str, (cert, key): (String, String)) -> RawConfig {
    let mut raw = raw_config(upstream);
    raw.tls.cert = Some(cert);
    raw.tls.key = Some(key);
    raw
}

/// An upstream that answers 200 with the X-Forwarded-Proto it saw.
async fn proto_echo() -> Upstream {
    Upstream::start(|seen| async move {
        let proto = seen
            .headers
            .get("x-forwarded-proto")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        response(200, &[("content-type", "text/plain")], proto)
    })
    .await
}

const H1: &[&[u8]] = &[b"http/1.1"];
const H2: &[&[u8]] = &[b"h2"];

const HANDSHAKE_FAILURES: &str = "holdfast_tls_handshake_failures_total";
const EXPIRY: &str = "holdfast_tls_cert_expiry_timestamp_seconds";

// --- Inbound ---------------------------------------------------------------------------------

#[tokio::test]
async fn h1_and_h2_over_tls_are_chosen_by_alpn() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let upstream = proto_echo().await;
    let holdfast =
        Holdfast::start_with(tls_config(&upstream.url(), listener_files(&dir, &ca))).await;

    for (alpn, version) in [(H1, Version::HTTP_11), (H2, Version::HTTP_2)] {
        let (status, got_version, body) =
            within(get_once(holdfast.addr, client_tls(&ca, None, alpn), "/mcp"))
                .await
                .unwrap();
        assert_eq!(status, 200);
        assert_eq!(got_version, version, "ALPN {alpn:?}");
        assert_eq!(
            body, "https",
            "X-Forwarded-Proto says what the client spoke"
        );
    }

    // A client that offers no ALPN at all gets HTTP/1.1.
    let mut conn = within(TlsConn::open(holdfast.addr, client_tls(&ca, None, &[])))
        .await
        .unwrap();
    assert_eq!(conn.alpn, None);
    let resp = within(conn.get("/mcp")).await.unwrap();
    assert_eq!(
        (resp.status(), resp.version()),
        (StatusCode::OK, Version::HTTP_11)
    );
    drop((resp, conn));
    // ... or HTTP/2 when it starts with the HTTP/2 preface.
    let mut conn = within(TlsConn::open_as(
        holdfast.addr,
        client_tls(&ca, None, &[]),
        true,
    ))
    .await
    .unwrap();
    assert_eq!(conn.alpn, None);
    let resp = within(conn.get("/mcp")).await.unwrap();
    assert_eq!(
        (resp.status(), resp.version()),
        (StatusCode::OK, Version::HTTP_2)
    );
    // Open connections count by protocol and transport; earlier ones may not have closed yet.
    let tls = |protocol: &str| {
        format!(r#"holdfast_client_connections{{protocol="{protocol}",transport="tls"}}"#)
    };
    holdfast.metric_until(&tls("http2"), |v| v >= 1.0).await;
    drop((resp, conn));
    holdfast.metric_until(&tls("http1"), |v| v == 0.0).await;
    holdfast.metric_until(&tls("http2"), |v| v == 0.0).await;

    // The admin listener stays plain HTTP.
    assert!(holdfast.metrics().await.contains(HANDSHAKE_FAILURES));
}

/// Events cross the TLS listener one at a time: each is read at the client before the upstream
/// sends the next.
#[tokio::test]
async fn sse_over_tls_flows_frame_by_frame() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast =
        Holdfast::start_with(tls_config(&upstream.url(), listener_files(&dir, &ca))).await;

    for alpn in [H1, H2] {
        let mut conn = within(TlsConn::open(holdfast.addr, client_tls(&ca, None, alpn)))
            .await
            .unwrap();
        let resp = within(conn.send(
            Request::get("/mcp").header("accept", "text/event-stream"),
            "/mcp",
        ))
        .await
        .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-accel-buffering"], "no");
        let tx = within(streams.recv()).await.unwrap();
        let mut events = Events::new(resp);
        for n in 1..=3 {
            push(&tx, n).await;
            assert_eq!(events.next().await, event(n), "ALPN {alpn:?}");
        }
        drop(tx);
        events.end().await.expect("a clean end");
    }
}

#[tokio::test]
async fn a_swapped_certificate_reaches_new_connections_while_an_old_stream_continues() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let first = ca.server_until((2031, 5, 17));
    let (cert, key) = first.write(&dir, "listener");
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = tls_config(&upstream.url(), (cert, key));
    raw.tls.reload_interval_secs = 0.05;
    let holdfast = Holdfast::start_with(raw).await;
    assert_eq!(holdfast.metric(EXPIRY).await, 1_936_742_400.0, "2031-05-17");

    // A stream opened on the first certificate.
    let config = client_tls(&ca, None, H1);
    let mut old = within(TlsConn::open(holdfast.addr, config.clone()))
        .await
        .unwrap();
    assert_eq!(old.served, first.der());
    let resp = within(old.send(
        Request::get("/mcp").header("accept", "text/event-stream"),
        "/mcp",
    ))
    .await
    .unwrap();
    let tx = within(streams.recv()).await.unwrap();
    let mut events = Events::new(resp);
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));

    // The files are replaced, as a Secret update or a renewal does.
    let second = ca.server_until((2032, 2, 29));
    second.write(&dir, "listener");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let conn = within(TlsConn::open(holdfast.addr, config.clone()))
            .await
            .unwrap();
        if conn.served == second.der() {
            break;
        }
        assert_eq!(conn.served, first.der(), "only the two certificates exist");
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holdfast.metric(EXPIRY).await, 1_961_625_600.0, "2032-02-29");

    // The old connection and its stream go on.
    push(&tx, 2).await;
    assert_eq!(events.next().await, event(2));
    drop(tx);
    events.end().await.expect("a clean end");
}

/// A changed certificate file that does not load (a key of another certificate) keeps the
/// current certificate and logs an error; the reloader goes on looking. The real binary, for
/// its log: the error line is the event that says the reloader looked at the broken file. (That
/// it is said once however many looks follow is src/tls's unit test, on a paused clock.)
#[tokio::test]
async fn a_certificate_file_that_does_not_load_is_logged_once_and_the_old_one_kept() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let first = ca.server_until((2031, 5, 17));
    let (cert, key) = first.write(&dir, "listener");
    let upstream = proto_echo().await;
    let mut proxy = Running::start(
        serving(&upstream.url(), &["--tls-cert", &cert, "--tls-key", &key])
            .env("HOLDFAST_TLS__RELOAD_INTERVAL_SECS", "0.05"),
    );
    let (listen, admin) = proxy.addresses();
    let config = client_tls(&ca, None, H1);

    let good_key = std::fs::read_to_string(&key).unwrap();
    dir.write(
        "listener.key",
        &KeyPair::generate().unwrap().serialize_pem(),
    );
    let line = proxy.wait_for_line("do not load");
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("still serving the previous certificate"),
        "{line}"
    );
    let conn = within(TlsConn::open(listen, config.clone())).await.unwrap();
    assert_eq!(conn.served, first.der());
    let metrics = crate::support::http::get_metrics(&format!("http://{admin}/metrics")).await;
    assert_eq!(
        metric_value(metrics.text(), EXPIRY),
        1_936_742_400.0,
        "2031-05-17, unchanged"
    );
    // The key back: the reloader kept looking, and loads the pair again.
    dir.write("listener.key", &good_key);
    proxy.wait_for_line("TLS certificate reloaded");
    let conn = within(TlsConn::open(listen, config)).await.unwrap();
    assert_eq!(conn.served, first.der());
    let (_, lines) = proxy.terminate();
    // At least the looks between the error and the reload, none of which said it again.
    let errors = lines.iter().filter(|l| l.contains("do not load")).count();
    assert_eq!(errors, 1, "{lines:#?}");
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let (dir, ca, clients, strangers) = (
        Dir::new(),
        Ca::new("listener CA"),
        Ca::new("client CA"),
        Ca::new("another CA"),
    );
    let upstream = proto_echo().await;
    let mut raw = tls_config(&upstream.url(), listener_files(&dir, &ca));
    raw.tls.client_ca = Some(dir.write("clients.crt", &clients.pem()));
    let holdfast = Holdfast::start_with(raw).await;

    let known = clients.client();
    let (status, _, _) = within(get_once(
        holdfast.addr,
        client_tls(&ca, Some(&known), H1),
        "/mcp",
    ))
    .await
    .unwrap();
    assert_eq!(status, 200);

    // With TLS 1.3 the client learns of the refusal at its first read, after its handshake.
    let no_cert = within(get_once(holdfast.addr, client_tls(&ca, None, H1), "/mcp")).await;
    assert!(no_cert.is_err(), "{no_cert:?}");
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "no_certificate"), |v| v == 1.0)
        .await;

    let unknown = strangers.client();
    let refused = within(get_once(
        holdfast.addr,
        client_tls(&ca, Some(&unknown), H1),
        "/mcp",
    ))
    .await;
    assert!(refused.is_err(), "{refused:?}");
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "bad_certificate"), |v| v == 1.0)
        .await;
}

#[tokio::test]
async fn failed_handshakes_are_counted_by_reason() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let upstream = proto_echo().await;
    let holdfast =
        Holdfast::start_with(tls_config(&upstream.url(), listener_files(&dir, &ca))).await;
    for reason in ["protocol", "rejected_by_client", "closed", "timeout"] {
        assert_eq!(
            holdfast.metric(&series(HANDSHAKE_FAILURES, reason)).await,
            0.0,
            "{reason} starts at 0"
        );
    }

    // Plain HTTP on the TLS port.
    let mut plain = TcpStream::connect(holdfast.addr).await.unwrap();
    plain
        .write_all(b"GET /mcp HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = within(plain.read_to_end(&mut rest)).await;
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "protocol"), |v| v == 1.0)
        .await;

    // A client that does not trust holdfast's certificate.
    let other = Ca::new("another CA");
    let distrust = within(get_once(
        holdfast.addr,
        client_tls(&other, None, H1),
        "/mcp",
    ))
    .await;
    assert!(distrust.is_err());
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "rejected_by_client"), |v| {
            v == 1.0
        })
        .await;

    // A connection closed without a word (a TCP health check).
    drop(TcpStream::connect(holdfast.addr).await.unwrap());
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "closed"), |v| v == 1.0)
        .await;
}

/// A connection that opens and says nothing is closed once the handshake's time is up
/// (`limits.header_read_timeout_secs`), counted as `timeout`.
#[tokio::test]
async fn a_handshake_that_never_starts_times_out() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let upstream = proto_echo().await;
    let mut raw = tls_config(&upstream.url(), listener_files(&dir, &ca));
    raw.limits.header_read_timeout_secs = 0.3;
    let holdfast = Holdfast::start_with(raw).await;
    let mut silent = TcpStream::connect(holdfast.addr).await.unwrap();
    let mut rest = Vec::new();
    let closed = within(silent.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "closed without a word: {closed:?} {rest:?}"
    );
    holdfast
        .metric_until(&series(HANDSHAKE_FAILURES, "timeout"), |v| v == 1.0)
        .await;
    assert_eq!(
        holdfast.metric(&series(HANDSHAKE_FAILURES, "closed")).await,
        0.0
    );
}
