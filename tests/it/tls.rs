//! TLS in and out: the listener speaks TLS with ALPN (h2, http/1.1), streams SSE unbuffered,
//! reloads a changed certificate for new connections while old ones keep streaming, asks for
//! client certificates, and counts failed handshakes; an `https://` upstream is verified against
//! a CA bundle (a wrong one is a 502 naming TLS, never held), gets holdfast's client certificate,
//! speaks h2 when it offers it, and a refused TCP connection to it is still "backend missing".
//!
//! Every certificate is made here with rcgen, in a directory of its own per test. The TLS peers
//! are tokio-rustls with the same ring provider as holdfast.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use holdfast::config::{self, Config, RawConfig, RawFlags, RawTlsFlags, UpstreamVerify};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::sse::{event, push, sse_upstream, Events};
use crate::support::files::TempDir;
use crate::support::http::{response, Reserved, Upstream};
use crate::support::jail::jailed;
use crate::support::process::{finish, holdfast, serving, Running};
use crate::support::proxy::{metric_value, raw_config, Holdfast};
use crate::support::within;

// --- Certificates ----------------------------------------------------------------------------

/// A directory of PEM files for one test, removed when dropped.
struct Dir(TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(TempDir::new("tls"))
    }

    /// Writes `name` at once (a rename, as Kubernetes and certbot swap files) and returns its
    /// path as the configuration wants it.
    fn write(&self, name: &str, contents: &str) -> String {
        let path = self.0.path().join(name);
        let tmp = self.0.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.to_str().unwrap().to_string()
    }
}

/// A certificate authority.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    cert: rcgen::Certificate,
}

/// A certificate with its key.
struct Leaf {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { params, key, cert }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        roots
    }

    fn issue(&self, purpose: ExtendedKeyUsagePurpose, not_after: (i32, u8, u8)) -> Leaf {
        self.issue_for(&["localhost", "127.0.0.1"], purpose, not_after)
    }

    fn issue_for(
        &self,
        names: &[&str],
        purpose: ExtendedKeyUsagePurpose,
        not_after: (i32, u8, u8),
    ) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![purpose];
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = KeyPair::generate().unwrap();
        let cert = params
            .signed_by(&key, &Issuer::from_params(&self.params, &self.key))
            .unwrap();
        Leaf { cert, key }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    fn server(&self) -> Leaf {
        self.server_until((2040, 1, 1))
    }

    fn server_until(&self, not_after: (i32, u8, u8)) -> Leaf {
        self.issue(ExtendedKeyUsagePurpose::ServerAuth, not_after)
    }

    /// A client certificate.
    fn client(&self) -> Leaf {
        self.issue(ExtendedKeyUsagePurpose::ClientAuth, (2040, 1, 1))
    }
}

impl Leaf {
    fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }

    /// Writes `NAME.crt` and `NAME.key`; returns their paths.
    fn write(&self, dir: &Dir, name: &str) -> (String, String) {
        (
            dir.write(&format!("{name}.crt"), &self.cert.pem()),
            dir.write(&format!("{name}.key"), &self.key.serialize_pem()),
        )
    }
}

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

// --- A TLS upstream --------------------------------------------------------------------------

/// What the TLS upstream saw of one request.
#[derive(Debug, Clone)]
struct SeenTls {
    version: Version,
    /// The `Host` header.
    host: Option<String>,
    /// The request URI's authority (`:authority` on HTTP/2).
    authority: Option<String>,
    /// The SNI the client sent.
    sni: Option<String>,
    /// Whether the client presented a certificate.
    client_cert: bool,
}

/// An HTTPS upstream (HTTP/1.1 and HTTP/2) answering `200 hello over tls`.
struct TlsUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<SeenTls>>>,
    task: JoinHandle<()>,
}

impl TlsUpstream {
    async fn start(config: Arc<ServerConfig>) -> TlsUpstream {
        TlsUpstream::serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), config)
    }

    fn serve(listener: TcpListener, config: Arc<ServerConfig>) -> TlsUpstream {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let acceptor = TlsAcceptor::from(config);
        let seen2 = seen.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, seen) = (acceptor.clone(), seen2.clone());
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let session = tls.get_ref().1;
                    let sni = session.server_name().map(str::to_string);
                    let client_cert = session.peer_certificates().is_some();
                    let svc = service_fn(move |req: Request<Incoming>| {
                        seen.lock().unwrap().push(SeenTls {
                            version: req.version(),
                            host: req
                                .headers()
                                .get("host")
                                .map(|h| h.to_str().unwrap().to_string()),
                            authority: req.uri().authority().map(|a| a.to_string()),
                            sni: sni.clone(),
                            client_cert,
                        });
                        async move {
                            Ok::<_, std::convert::Infallible>(response(
                                200,
                                &[("content-type", "text/plain")],
                                "hello over tls",
                            ))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TlsUpstream { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    fn seen(&self) -> Vec<SeenTls> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The upstream's TLS: `leaf`, ALPN h2 and http/1.1, client certificates from `client_ca`
/// required when set, TLS 1.2 only when asked (so a refused client certificate fails the
/// handshake itself rather than the first read after it).
fn upstream_tls(leaf: &Leaf, client_ca: Option<&Ca>, tls12_only: bool) -> Arc<ServerConfig> {
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12_only {
        &[&rustls::version::TLS12]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let builder = ServerConfig::builder_with_provider(holdfast::tls::provider())
        .with_protocol_versions(versions)
        .unwrap();
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.roots()),
                holdfast::tls::provider(),
            )
            .build()
            .unwrap(),
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(vec![leaf.der()], leaf.key_der())
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

// --- holdfast with TLS -----------------------------------------------------------------------

/// holdfast's listener certificate files, from `ca`.
fn listener_files(dir: &Dir, ca: &Ca) -> (String, String) {
    ca.server().write(dir, "listener")
}

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

fn series(name: &str, reason: &str) -> String {
    format!("{name}{{reason=\"{reason}\"}}")
}

const HANDSHAKE_FAILURES: &str = "holdfast_tls_handshake_failures_total";
const UPSTREAM_FAILURES: &str = "holdfast_upstream_failures_total";
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

// --- Upstream --------------------------------------------------------------------------------

/// A raw configuration in front of `upstream` (https) trusting `ca`.
fn https_config(upstream: &str, dir: &Dir, ca: &Ca) -> RawConfig {
    let mut raw = raw_config(upstream);
    raw.client.ca = Some(dir.write("upstream-ca.crt", &ca.pem()));
    raw
}

#[tokio::test]
async fn an_https_upstream_is_verified_against_the_configured_ca() {
    let (dir, ca) = (Dir::new(), Ca::new("upstream CA"));
    let upstream = TlsUpstream::start(upstream_tls(&ca.server(), None, false)).await;
    let holdfast = Holdfast::start_with(https_config(&upstream.url(), &dir, &ca)).await;

    let got = within(crate::support::http::get(&holdfast.url("/mcp"))).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "hello over tls");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].sni.as_deref(),
        Some("localhost"),
        "SNI from the URL"
    );
    // Host is preserved, so the connection stays HTTP/1.1 even though the upstream offers h2.
    assert_eq!(seen[0].version, Version::HTTP_11);
    assert_eq!(
        seen[0].host.as_deref(),
        Some(holdfast.addr.to_string().as_str())
    );
    assert!(!seen[0].client_cert);
}

#[tokio::test]
async fn an_https_upstream_that_offers_h2_gets_h2_when_it_sees_its_own_authority() {
    let (dir, ca) = (Dir::new(), Ca::new("upstream CA"));
    let upstream = TlsUpstream::start(upstream_tls(&ca.server(), None, false)).await;
    let mut raw = https_config(&upstream.url(), &dir, &ca);
    raw.client.host_header = "upstream".into();
    let holdfast = Holdfast::start_with(raw).await;

    // Concurrent first requests race to connect; the first h2 connection serves them all.
    let mut calls = JoinSet::new();
    for _ in 0..20 {
        let url = holdfast.url("/mcp");
        calls.spawn(async move { crate::support::http::get(&url).await.status });
    }
    while let Some(status) = within(calls.join_next()).await {
        assert_eq!(status.unwrap(), 200);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 20);
    let authority = format!("localhost:{}", upstream.addr.port());
    for s in &seen {
        assert_eq!(s.version, Version::HTTP_2, "{s:?}");
        assert_eq!(s.authority.as_deref(), Some(authority.as_str()));
        assert!(
            s.host.is_none() || s.host.as_deref() == Some(authority.as_str()),
            "a Host header must not differ from :authority: {s:?}"
        );
    }
}

#[tokio::test]
async fn a_wrong_ca_is_a_502_naming_tls_and_is_never_held() {
    let (dir, ca, wrong) = (Dir::new(), Ca::new("upstream CA"), Ca::new("wrong CA"));
    let upstream = TlsUpstream::start(upstream_tls(&ca.server(), None, false)).await;
    let holdfast = Holdfast::start_with(https_config(&upstream.url(), &dir, &wrong)).await;

    let got = within(crate::support::http::post_json(
        &holdfast.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
    ))
    .await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("upstream_tls"));
    assert!(got.text().contains("TLS to the upstream failed"), "{got:?}");
    assert!(upstream.seen().is_empty(), "nothing got through");
    assert_eq!(
        holdfast
            .metric(&series(UPSTREAM_FAILURES, "upstream_tls"))
            .await,
        1.0
    );
    assert_eq!(holdfast.metric("holdfast_outages_total").await, 0.0);
    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 1.0);
}

/// Each way an upstream's TLS can be wrong is a 502 naming TLS, never held, with an error log
/// that names the problem. The real binary, for its log.
#[tokio::test]
async fn every_upstream_tls_problem_is_a_502_with_a_log_naming_it() {
    let (dir, ca) = (Dir::new(), Ca::new("upstream CA"));
    let ca_file = ca_file(&dir, &ca);
    let no_common_protocol = {
        let mut config = (*upstream_tls(&ca.server(), None, false)).clone();
        config.alpn_protocols = vec![b"x-not-http".to_vec()];
        Arc::new(config)
    };
    let cases: [(&str, Arc<ServerConfig>, &str); 4] = [
        (
            "untrusted",
            upstream_tls(&Ca::new("another CA").server(), None, false),
            "UnknownIssuer",
        ),
        (
            "not for its name",
            upstream_tls(
                &ca.issue_for(
                    &["other.example"],
                    ExtendedKeyUsagePurpose::ServerAuth,
                    (2040, 1, 1),
                ),
                None,
                false,
            ),
            "not valid for name \"localhost\"",
        ),
        (
            "expired",
            upstream_tls(&ca.server_until((2020, 1, 1)), None, false),
            "certificate expired",
        ),
        (
            "no common protocol",
            no_common_protocol,
            "NoApplicationProtocol",
        ),
    ];
    for (case, config, named) in cases {
        let upstream = TlsUpstream::start(config).await;
        let mut proxy =
            Running::start(serving(&upstream.url(), &[]).env("HOLDFAST_CLIENT__CA", &ca_file));
        let (listen, admin) = proxy.addresses();
        let got = within(crate::support::http::post_json(
            &format!("http://{listen}/mcp"),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
        ))
        .await;
        assert_eq!(got.status, 502, "{case}");
        assert_eq!(
            got.header("holdfast-reason"),
            Some("upstream_tls"),
            "{case}"
        );
        let line = proxy.wait_for_line("TLS to the upstream failed");
        let logged: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(logged["level"], "ERROR", "{case}: {line}");
        assert!(
            logged["error"].as_str().unwrap_or_default().contains(named),
            "{case}: the log names the problem: {line}"
        );
        let metrics = crate::support::http::get_metrics(&format!("http://{admin}/metrics")).await;
        let metrics = metrics.text();
        assert_eq!(
            metric_value(metrics, &series(UPSTREAM_FAILURES, "upstream_tls")),
            1.0,
            "{case}"
        );
        assert_eq!(
            metric_value(metrics, "holdfast_outages_total"),
            0.0,
            "{case}: never held"
        );
        assert!(upstream.seen().is_empty(), "{case}: nothing got through");
        let (status, _) = proxy.terminate();
        assert_eq!(status.code(), Some(0), "{case}");
    }
}

/// `client.insecure_skip_verify` is said loudly at start.
#[tokio::test]
async fn skipping_verification_logs_a_warning_at_start() {
    let upstream =
        TlsUpstream::start(upstream_tls(&Ca::new("unknown CA").server(), None, false)).await;
    let mut proxy = Running::start(
        serving(&upstream.url(), &[]).env("HOLDFAST_CLIENT__INSECURE_SKIP_VERIFY", "true"),
    );
    let line = proxy.wait_for_line("insecure_skip_verify");
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("NOT verified"), "{line}");
    let (listen, _) = proxy.addresses();
    let got = within(crate::support::http::get(&format!("http://{listen}/mcp"))).await;
    assert_eq!(got.status, 200);
}

/// With no `client.ca` and no system roots, holdfast refuses to start (status 2) and asks for
/// `client.ca`. rustls-native-certs reads only `SSL_CERT_FILE` / `SSL_CERT_DIR` when they are set.
#[test]
fn no_system_roots_refuses_to_start_and_asks_for_client_ca() {
    let dir = Dir::new();
    let empty_file = dir.write("empty.pem", "");
    let empty_dir = dir.0.path().join("no-certs");
    std::fs::create_dir(&empty_dir).unwrap();
    let mut cmd = holdfast(&["--upstream", "https://localhost:8443"]);
    cmd.env("SSL_CERT_FILE", &empty_file)
        .env("SSL_CERT_DIR", &empty_dir);
    let done = finish(cmd, "holdfast");
    assert_eq!(done.status.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("client.ca"), "{done:?}");
    assert!(
        done.stderr.contains("no system root certificates"),
        "{done:?}"
    );
}

#[tokio::test]
async fn skipping_verification_accepts_any_certificate() {
    let stranger = Ca::new("unknown CA");
    let upstream = TlsUpstream::start(upstream_tls(&stranger.server(), None, false)).await;
    let mut raw = raw_config(&upstream.url());
    raw.client.insecure_skip_verify = true;
    let holdfast = Holdfast::start_with(raw).await;
    let got = within(crate::support::http::get(&holdfast.url("/mcp"))).await;
    assert_eq!(got.status, 200);
}

#[tokio::test]
async fn holdfast_sends_its_client_certificate_to_an_upstream_that_requires_one() {
    let (dir, ca, clients) = (Dir::new(), Ca::new("upstream CA"), Ca::new("client CA"));
    // TLS 1.2 here: the refusal below then fails the handshake itself, deterministically.
    let upstream = TlsUpstream::start(upstream_tls(&ca.server(), Some(&clients), true)).await;

    let mut raw = https_config(&upstream.url(), &dir, &ca);
    let (cert, key) = clients.client().write(&dir, "holdfast-client");
    raw.client.cert = Some(cert);
    raw.client.key = Some(key);
    let with_cert = Holdfast::start_with(raw).await;
    let got = within(crate::support::http::get(&with_cert.url("/mcp"))).await;
    assert_eq!(got.status, 200);
    assert!(upstream.seen()[0].client_cert);

    let without = Holdfast::start_with(https_config(&upstream.url(), &dir, &ca)).await;
    let got = within(crate::support::http::get(&without.url("/mcp"))).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("upstream_tls"));
    assert_eq!(
        upstream.seen().len(),
        1,
        "the refused request never arrived"
    );
}

#[tokio::test]
async fn an_https_upstream_that_refuses_tcp_is_missing_not_a_tls_failure() {
    let (dir, ca) = (Dir::new(), Ca::new("upstream CA"));
    let port = Reserved::new();
    let url = format!("https://localhost:{}", port.addr.port());

    // Without holding: 503 at once, as for any refused connection.
    let mut raw = https_config(&url, &dir, &ca);
    raw.hold.enabled = false;
    let at_once = Holdfast::start_with(raw).await;
    let got = within(crate::support::http::get(&at_once.url("/mcp"))).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("connect_refused"));

    // With holding: held until the upstream listens again, then answered by it. The prober's
    // bare TCP connect sees the port open; the held request itself then goes through TLS.
    let holdfast = Holdfast::start_with(https_config(&url, &dir, &ca)).await;
    let url = holdfast.url("/mcp");
    let client = tokio::spawn(async move { crate::support::http::get(&url).await });
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    let upstream = TlsUpstream::serve(port.listen(), upstream_tls(&ca.server(), None, false));
    let got = within(client).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "hello over tls");
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(
        holdfast
            .metric(&series(UPSTREAM_FAILURES, "upstream_tls"))
            .await,
        0.0
    );
}

// --- Configuration ---------------------------------------------------------------------------

fn validate(raw: &RawConfig) -> Result<Config, config::ConfigError> {
    Config::from_raw(raw, &|_| "test".into())
}

/// The message of the problem reported for `key`.
fn problem(err: &config::ConfigError, key: &str) -> String {
    err.problems
        .iter()
        .find(|p| p.key == key)
        .unwrap_or_else(|| panic!("no problem for `{key}`: {err}"))
        .to_string()
}

#[test]
fn tls_flags_and_environment_reach_the_config() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let (cert, key) = listener_files(&dir, &ca);
    jailed(|jail| {
        let flags = RawFlags {
            upstream: Some("http://b:1".into()),
            tls: RawTlsFlags {
                cert: Some(cert.clone()),
                key: Some(key.clone()),
            },
            ..RawFlags::default()
        };
        let c = config::load(None, &flags).unwrap();
        let tls = c.tls.expect("TLS on");
        assert_eq!(tls.cert, Path::new(&cert));
        assert_eq!(tls.key, Path::new(&key));
        assert_eq!(tls.reload_interval, Duration::from_secs(5));
        assert!(tls.client_ca.is_none());

        jail.set_env("HOLDFAST_UPSTREAM", "https://b:8443");
        jail.set_env("HOLDFAST_TLS__CERT", &cert);
        jail.set_env("HOLDFAST_TLS__KEY", &key);
        jail.set_env("HOLDFAST_TLS__RELOAD_INTERVAL_SECS", "0.5");
        jail.set_env("HOLDFAST_CLIENT__CA", &cert);
        let c = config::load(None, &RawFlags::default()).unwrap();
        assert_eq!(c.tls.unwrap().reload_interval, Duration::from_millis(500));
        let up = c.upstream_tls.expect("https upstream");
        assert_eq!(up.verify, UpstreamVerify::Ca(PathBuf::from(&cert)));
        assert!(!up.offers_h2, "Host is preserved by default");

        // An empty value clears a path set below it.
        jail.set_env("HOLDFAST_TLS__CERT", "");
        jail.set_env("HOLDFAST_TLS__KEY", "");
        assert!(config::load(None, &RawFlags::default())
            .unwrap()
            .tls
            .is_none());

        // A bad file given as a flag names the flag.
        let flags = RawFlags {
            tls: RawTlsFlags {
                cert: Some(key.clone()),
                key: Some(key.clone()),
            },
            ..RawFlags::default()
        };
        let err = config::load(None, &flags).unwrap_err();
        let p = problem(&err, "tls.cert");
        assert!(
            p.contains("command-line flag") && p.contains("no certificate"),
            "{p}"
        );
        Ok(())
    });
}

#[test]
fn tls_settings_are_validated_all_at_once() {
    let (dir, ca) = (Dir::new(), Ca::new("CA"));
    let (cert, key) = listener_files(&dir, &ca);
    let other_key = dir.write("other.key", &KeyPair::generate().unwrap().serialize_pem());

    // Half a pair, and client.* keys on an http:// upstream.
    let mut raw = raw_config("http://b:1");
    raw.tls.cert = Some(cert.clone());
    raw.tls.reload_interval_secs = 0.0;
    raw.client.ca = Some(cert.clone());
    raw.client.insecure_skip_verify = true;
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.key").contains("needed"));
    assert!(problem(&err, "tls.reload_interval_secs").contains("positive"));
    assert!(problem(&err, "client.ca").contains("https://"));
    assert!(problem(&err, "client.insecure_skip_verify").contains("https://"));
    assert_eq!(err.problems.len(), 4, "{err}");

    // Files that do not load, each named under its key.
    let mut raw = raw_config("https://b:8443");
    raw.tls.cert = Some(cert.clone());
    raw.tls.key = Some(other_key.clone());
    raw.tls.client_ca = Some(dir.0.path().join("missing.crt").to_str().unwrap().into());
    raw.client.cert = Some(cert.clone());
    raw.client.ca = Some(key.clone());
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.key").contains("cannot be used"), "{err}");
    assert!(
        problem(&err, "tls.client_ca").contains("missing.crt"),
        "{err}"
    );
    assert!(
        problem(&err, "client.ca").contains("no certificate"),
        "{err}"
    );
    assert!(problem(&err, "client.key").contains("needed"), "{err}");
    assert_eq!(err.problems.len(), 4, "{err}");

    // Verifying against a CA and not verifying at all contradict each other.
    let mut raw = raw_config("https://b:8443");
    raw.client.ca = Some(ca_file(&dir, &ca));
    raw.client.insecure_skip_verify = true;
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "client.insecure_skip_verify").contains("contradicts"));

    // A client CA without a listener certificate.
    let mut raw = raw_config("http://b:1");
    raw.tls.client_ca = Some(ca_file(&dir, &ca));
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.client_ca").contains("tls.cert"));

    // A host that cannot be a TLS server name.
    let err = validate(&raw_config("https://mcp-.example:8443")).unwrap_err();
    assert!(problem(&err, "upstream").contains("server name"), "{err}");

    // And all is well with the right files.
    let mut raw = raw_config("https://b:8443");
    raw.tls.cert = Some(cert);
    raw.tls.key = Some(key);
    raw.tls.client_ca = Some(ca_file(&dir, &ca));
    raw.client.ca = Some(ca_file(&dir, &ca));
    raw.client.host_header = "upstream".into();
    let c = validate(&raw).unwrap();
    assert!(c.tls.unwrap().client_verifier.is_some());
    assert!(c.upstream_tls.unwrap().offers_h2);
}

fn ca_file(dir: &Dir, ca: &Ca) -> String {
    dir.write("ca.crt", &ca.pem())
}

#[test]
fn the_sample_file_documents_every_tls_key() {
    let text = crate::support::files::read_repo("config/holdfast.toml");
    // Optional paths are shown as `# key = "..."`: switch those on to see their sections.
    let switched: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest)
                if rest.split_once(" = ").is_some_and(|(k, _)| {
                    k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                }) =>
            {
                rest
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let value: toml::Value = toml::from_str(&switched).expect("TOML");
    for key in [
        "tls.cert",
        "tls.key",
        "tls.client_ca",
        "tls.reload_interval_secs",
        "client.ca",
        "client.cert",
        "client.key",
        "client.insecure_skip_verify",
    ] {
        let found = key.split('.').try_fold(&value, |v, k| v.get(k));
        assert!(
            found.is_some(),
            "config/holdfast.toml does not show `{key}`"
        );
        let env = format!("HOLDFAST_{}", key.replace('.', "__").to_ascii_uppercase());
        assert!(
            text.contains(&env),
            "config/holdfast.toml never names {env}"
        );
    }
    // The optional paths are examples, not settings: the sample leaves TLS off.
    let raw: RawConfig = toml::from_str(&text).unwrap();
    assert!(raw.tls.cert.is_none() && raw.client.ca.is_none());
}

/// An upstream that comes back with a certificate holdfast does not trust is *there*: every held
/// request gets its 502 at once, not one at a time as the probe.
#[tokio::test]
async fn an_upstream_back_with_an_untrusted_certificate_releases_everyone_at_once() {
    let (dir, ca, wrong) = (Dir::new(), Ca::new("upstream CA"), Ca::new("wrong CA"));
    let port = Reserved::new();
    let url = format!("https://localhost:{}", port.addr.port());
    // Probes at least 2 s apart (4 s, jittered down to half at most): released one at a time,
    // as probes, the three would be answered at least 4 s apart.
    const PROBE_GAP_MS: u64 = 4000;
    let mut raw = https_config(&url, &dir, &wrong);
    raw.hold.backoff_initial_ms = PROBE_GAP_MS;
    raw.hold.backoff_max_ms = PROBE_GAP_MS;
    let holdfast = Holdfast::start_with(raw).await;
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let url = holdfast.url("/mcp");
            tokio::spawn(async move {
                let got = crate::support::http::get(&url).await;
                (got, Instant::now())
            })
        })
        .collect();
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 3.0)
        .await;
    let _upstream = TlsUpstream::serve(port.listen(), upstream_tls(&ca.server(), None, false));
    let mut answered = Vec::new();
    for client in clients {
        let (got, at) = within(client).await.unwrap();
        assert_eq!(got.status, 502);
        assert_eq!(got.header("holdfast-reason"), Some("upstream_tls"));
        answered.push(at);
    }
    let spread = answered
        .iter()
        .max()
        .unwrap()
        .duration_since(*answered.iter().min().unwrap());
    assert!(
        spread < Duration::from_millis(PROBE_GAP_MS / 2),
        "answered {spread:?} apart: one probe at a time, not all at once"
    );
    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 1.0);
    assert_eq!(
        holdfast
            .metric(&series(UPSTREAM_FAILURES, "upstream_tls"))
            .await,
        3.0
    );
}
