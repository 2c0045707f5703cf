//! TLS out: an `https://` upstream is verified against a CA bundle (a wrong one is a 502 naming
//! TLS, never held), gets holdfast's client certificate, speaks h2 when it offers it, and a
//! refused TCP connection to it is still "backend missing".
//!
//! Every certificate is made with rcgen (`support::tls`), in a directory of its own per test. The
//! TLS upstream is tokio-rustls with the same ring provider as holdfast.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::config::RawConfig;
use http::{Request, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::support::http::{response, Reserved};
use crate::support::process::{finish, holdfast, serving, Running};
use crate::support::proxy::{metric_value, raw_config, Holdfast};
use crate::support::tls::{ca_file, series, Ca, Dir, Leaf};
use crate::support::within;

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

const UPSTREAM_FAILURES: &str = "holdfast_upstream_failures_total";

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
