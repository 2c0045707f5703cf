//! `holdfast probe URL` against real endpoints of each kind: rmcp servers (stateful with SSE
//! answers, stateless with JSON), a port where nothing listens, a TLS server holdfast does not
//! trust, Traefik's route-missing 404, a web page, an authorization challenge with its
//! resource metadata, a retired endpoint, a legacy HTTP+SSE server that keeps its stream open,
//! and an SSE service that is not MCP. (The command's output and exit status:
//! `probe_command.rs`.)

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use holdfast::probe::report::Report;
use holdfast::probe::verdict::Kind;
use holdfast::probe::{run, Options, DEFAULT_PROTOCOL_VERSION};
use http::{Method, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::support::http::{
    response, ChannelBody, Reserved, TestBody, Upstream, TRAEFIK_404_HEADERS,
};
use crate::support::mcp::{McpServer, Mode, Options as ServerOptions};
use crate::support::router::TRAEFIK_404;
use crate::support::within;

async fn probe_with(url: &str, timeout: f64, headers: &[&str]) -> Report {
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let opts = Options::new(
        url,
        timeout,
        &headers,
        DEFAULT_PROTOCOL_VERSION.into(),
        None,
    )
    .expect("valid options");
    within(run(&opts)).await.expect("the probe runs")
}

/// The probe of `url` with the default options (a 10 s budget per step).
pub(crate) async fn probe(url: &str) -> Report {
    probe_with(url, 10.0, &[]).await
}

fn steps(report: &Report) -> Vec<(String, Option<u16>)> {
    report
        .steps
        .iter()
        .map(|s| (format!("{} {}", s.method, s.step), s.status))
        .collect()
}

fn step_names(report: &Report) -> Vec<String> {
    steps(report).into_iter().map(|(name, _)| name).collect()
}

/// An event-stream response whose body the test feeds, left open while `tx` lives.
pub(crate) fn open_stream(
    first: &'static str,
) -> (
    Response<TestBody>,
    mpsc::Sender<Result<Frame<Bytes>, crate::support::http::BoxError>>,
) {
    let (tx, rx) = mpsc::channel(4);
    tx.try_send(Ok(Frame::data(Bytes::from_static(first.as_bytes()))))
        .unwrap();
    let body = ChannelBody(rx).boxed();
    let resp = Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap();
    (resp, tx)
}

#[tokio::test]
async fn a_stateful_server_is_described_its_tools_counted_and_its_session_ended() {
    let server = McpServer::start().await;
    let report = probe(&server.url()).await;
    assert_eq!(report.verdict.kind, Kind::McpServer, "{}", report.text());
    assert_eq!(report.exit_code, 0);
    assert_eq!(
        steps(&report),
        [
            ("POST server/discover".to_string(), Some(200)),
            ("POST initialize".to_string(), Some(200)),
            ("POST notifications/initialized".to_string(), Some(202)),
            ("POST tools/list".to_string(), Some(200)),
            ("DELETE end session".to_string(), Some(202)),
        ]
    );
    let s = report.server.as_ref().expect("server details");
    assert!(s.stateful);
    assert_eq!(s.answers, "sse");
    assert_eq!(s.protocol_version.as_deref(), Some("2025-11-25"));
    assert!(s.name.is_some());
    let tools = s.tools.as_ref().expect("tools");
    assert_eq!(
        (
            tools.count,
            tools.read_only_hint,
            tools.idempotent_hint,
            tools.paginates
        ),
        (6, 1, 1, false)
    );
    assert!(report.steps[1].headers.contains_key("mcp-session-id"));
    // rmcp 3.11 answers both eras: server/discover names 2026-07-28 too.
    let discovered = report.eras.discover.as_ref().expect("discover answered");
    assert!(
        discovered.iter().any(|v| v == "2026-07-28"),
        "{}",
        report.text()
    );
    assert_eq!(report.eras.initialize.as_deref(), Some("2025-11-25"));
    assert!(
        report.verdict.finding.contains("both eras"),
        "{}",
        report.text()
    );
    // The server saw the session the probe opened closed: nothing left behind.
    let seen = server.seen();
    let delete = seen
        .iter()
        .find(|r| r.method == Method::DELETE)
        .expect("a DELETE");
    let opened = seen.iter().find_map(|r| r.assigned_session.as_deref());
    assert_eq!(delete.session_id(), opened);
    assert!(report
        .verdict
        .next
        .contains(&format!("--upstream http://{}", server.addr())));
}

#[tokio::test]
async fn a_stateless_json_server_is_not_sent_a_delete() {
    let server = McpServer::start_with(ServerOptions {
        mode: Mode::StatelessJson,
        ..ServerOptions::default()
    })
    .await;
    let report = probe(&server.url()).await;
    assert_eq!(report.verdict.kind, Kind::McpServer, "{}", report.text());
    let s = report.server.as_ref().unwrap();
    assert!(!s.stateful);
    assert_eq!(s.answers, "json");
    assert_eq!(s.tools.as_ref().unwrap().count, 6);
    assert!(!step_names(&report).iter().any(|n| n.starts_with("DELETE")));
    assert!(report.verdict.holdfast.contains("stateless"));
}

#[tokio::test]
async fn nothing_listening_is_an_outage_holdfast_would_hold() {
    let port = Reserved::new();
    let report = probe(&format!("{}/mcp", port.url())).await;
    assert_eq!(report.verdict.kind, Kind::Outage);
    assert_eq!(report.exit_code, 5);
    assert!(
        report.verdict.finding.contains("connection refused"),
        "{}",
        report.text()
    );
    assert!(
        report.verdict.finding.contains("os error 111"),
        "{}",
        report.text()
    );
    assert!(report.verdict.holdfast.contains("hold"));
    // The first step, server/discover, already meets the refusal: nothing more is tried.
    assert_eq!(steps(&report), [("POST server/discover".to_string(), None)]);
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_tls_failure_holdfast_would_answer_502() {
    use tokio_rustls::TlsAcceptor;
    let served = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let trusted = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        served.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(holdfast::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![served.cert.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = acceptor.accept(tcp).await;
        }
    });
    let dir = crate::support::files::TempDir::new("probe-tls");
    dir.write("ca.pem", &trusted.cert.pem());
    let opts = Options::new(
        &format!("https://localhost:{port}/mcp"),
        10.0,
        &[],
        DEFAULT_PROTOCOL_VERSION.into(),
        Some(dir.path().join("ca.pem")),
    )
    .unwrap();
    let report = within(run(&opts)).await.unwrap();
    assert_eq!(report.verdict.kind, Kind::Outage, "{}", report.text());
    assert!(
        report.verdict.finding.contains("TLS handshake failed"),
        "{}",
        report.text()
    );
    assert!(
        report.verdict.finding.contains("invalid peer certificate"),
        "{}",
        report.text()
    );
    assert!(report.verdict.holdfast.contains("502 (upstream_tls)"));
}

#[tokio::test]
async fn traefiks_route_missing_404_is_named_and_masked() {
    let router =
        Upstream::start(|_| async { response(404, TRAEFIK_404_HEADERS, TRAEFIK_404) }).await;
    let report = probe(&format!("{}/mcp", router.url())).await;
    assert_eq!(report.verdict.kind, Kind::Outage, "{}", report.text());
    let finding = &report.verdict.finding;
    assert!(
        finding.contains("route missing") && finding.contains("[traefik-404]"),
        "{finding}"
    );
    assert!(report
        .verdict
        .holdfast
        .contains("held and sent once the route is back"));
    // A router's 404 is a verdict: no GET follows.
    assert_eq!(
        step_names(&report),
        ["POST server/discover", "POST initialize"]
    );
}

#[tokio::test]
async fn a_web_page_is_not_mcp_at_any_status() {
    let site = Upstream::start(|_| async {
        response(
            405,
            &[("content-type", "text/html; charset=utf-8")],
            "<html>nope</html>",
        )
    })
    .await;
    let report = probe(&format!("{}/", site.url())).await;
    assert_eq!(report.verdict.kind, Kind::NotMcp);
    assert_eq!(report.exit_code, 4);
    assert!(
        report.verdict.finding.contains("a web page"),
        "{}",
        report.text()
    );
    assert_eq!(
        step_names(&report),
        ["POST server/discover", "POST initialize"]
    );
}

#[tokio::test]
async fn a_challenge_leads_to_the_resource_metadata_and_its_authorization_servers() {
    let server = Upstream::start(|seen| async move {
        if seen.uri == "/.well-known/oauth-protected-resource" {
            return response(
                200,
                &[("content-type", "application/json")],
                r#"{"resource":"x","authorization_servers":["https://auth.example","https://backup.example"]}"#,
            );
        }
        response(
            401,
            &[(
                "www-authenticate",
                r#"Bearer resource_metadata="/.well-known/oauth-protected-resource""#,
            )],
            "",
        )
    })
    .await;
    let report = probe_with(&format!("{}/mcp", server.url()), 10.0, &["X-Probe: yes"]).await;
    assert_eq!(report.verdict.kind, Kind::McpServer, "{}", report.text());
    assert_eq!(report.exit_code, 0);
    assert!(
        report
            .verdict
            .finding
            .contains("authorization servers: https://auth.example, https://backup.example"),
        "{}",
        report.text()
    );
    assert_eq!(
        steps(&report),
        [
            ("POST server/discover".to_string(), Some(401)),
            ("POST initialize".to_string(), Some(401)),
            ("GET resource metadata".to_string(), Some(200)),
        ]
    );
    // The operator's -H reached the server on every request.
    assert!(server
        .seen()
        .iter()
        .all(|s| s.header("x-probe") == Some("yes")));

    let bare = Upstream::start(|_| async { response(401, &[], "") }).await;
    let report = probe(&format!("{}/mcp", bare.url())).await;
    assert_eq!(report.verdict.kind, Kind::McpServer);
    assert!(
        report.verdict.finding.contains("a server bug"),
        "{}",
        report.text()
    );
}

#[tokio::test]
async fn a_retired_endpoint_says_where_to_go() {
    let old = Upstream::start(|_| async {
        response(
            410,
            &[("content-type", "text/plain")],
            "Gone: use /mcp instead\n",
        )
    })
    .await;
    let report = probe(&format!("{}/sse", old.url())).await;
    assert_eq!(report.verdict.kind, Kind::NotMcp);
    assert!(
        report
            .verdict
            .finding
            .contains("It says: Gone: use /mcp instead"),
        "{}",
        report.text()
    );
}

#[tokio::test]
async fn a_legacy_server_is_proven_by_its_endpoint_event_without_waiting_for_the_budget() {
    // The stream stays open, as a legacy server's does, until the test ends.
    let (legacy, mut kept) =
        legacy_server(Duration::ZERO, Duration::ZERO, "/messages?sessionId=abc").await;
    // A budget far longer than the test's own limit: only the event can end the GET in time.
    let report = probe_with(&format!("{}/sse", legacy.url()), 3600.0, &[]).await;
    assert_eq!(report.verdict.kind, Kind::LegacyServer, "{}", report.text());
    assert_eq!(report.exit_code, 3);
    assert!(report
        .verdict
        .finding
        .contains("/messages?sessionId=abc (relative)"));
    assert_eq!(
        steps(&report),
        [
            ("POST server/discover".to_string(), Some(405)),
            ("POST initialize".to_string(), Some(405)),
            ("GET legacy GET".to_string(), Some(200)),
        ]
    );
    assert!(kept.recv().await.is_some());
}

#[tokio::test]
async fn an_sse_stream_without_an_endpoint_event_is_not_mcp() {
    let (keep_open, _kept) = mpsc::channel(1);
    let ticker = Upstream::start(move |seen| {
        let keep_open = keep_open.clone();
        async move {
            if seen.method == Method::POST {
                return response(404, &[("content-type", "text/plain")], "not found");
            }
            let (resp, tx) = open_stream("data: {\"price\": 1}\n\n");
            let _ = keep_open.send(tx).await;
            resp
        }
    })
    .await;
    let report = probe_with(&format!("{}/events", ticker.url()), 1.0, &[]).await;
    assert_eq!(report.verdict.kind, Kind::NotMcp, "{}", report.text());
    assert!(
        report
            .verdict
            .finding
            .contains("an SSE service, not MCP: the stream sent 1 event(s)"),
        "{}",
        report.text()
    );
    // The GET ran its whole own budget, after the POST's.
    assert!(
        report.steps[2].note.contains("time budget"),
        "{}",
        report.text()
    );
}

#[tokio::test]
async fn each_step_has_its_own_budget() {
    // A server that takes the POST's whole budget: the probe still answers in about that
    // budget, not the test's limit, and says the initialize timed out.
    let slow = Upstream::start(|_| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        response(200, &[], "")
    })
    .await;
    let report = probe_with(&format!("{}/mcp", slow.url()), 0.5, &[]).await;
    assert_eq!(report.verdict.kind, Kind::Outage, "{}", report.text());
    assert!(report
        .verdict
        .finding
        .contains("no answer to the initialize within 0.5 s"));
}

#[tokio::test]
async fn holdfasts_own_503_in_front_of_a_missing_server_is_an_outage() {
    let port = Reserved::new();
    let mut raw = crate::support::proxy::raw_config(&port.url());
    raw.hold.enabled = false;
    let proxy = crate::support::proxy::Holdfast::start_with(raw).await;
    let report = probe(&proxy.url("/mcp")).await;
    assert_eq!(report.verdict.kind, Kind::Outage, "{}", report.text());
    assert!(
        report.verdict.finding.starts_with("503, Retry-After"),
        "{}",
        report.text()
    );
    assert_eq!(
        report.steps[0]
            .headers
            .get("retry-after")
            .map(String::as_str),
        Some("2")
    );
}

/// A legacy server: the POST answered 405 after `post_delay`, the GET's stream sends
/// `endpoint_event` after `event_delay` and stays open.
pub(crate) async fn legacy_server(
    post_delay: Duration,
    event_delay: Duration,
    endpoint: &'static str,
) -> (
    Upstream,
    mpsc::Receiver<mpsc::Sender<Result<Frame<Bytes>, crate::support::http::BoxError>>>,
) {
    let (keep_open, kept) = mpsc::channel(4);
    let server = Upstream::start(move |seen| {
        let keep_open = keep_open.clone();
        async move {
            if seen.method == Method::POST {
                tokio::time::sleep(post_delay).await;
                return response(405, &[("content-type", "text/plain")], "Method Not Allowed");
            }
            let (resp, tx) = open_stream(": connected\n\n");
            let later = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(event_delay).await;
                let event = format!("event: endpoint\ndata: {endpoint}\n\n");
                let _ = later.send(Ok(Frame::data(Bytes::from(event)))).await;
            });
            let _ = keep_open.send(tx).await;
            resp
        }
    })
    .await;
    (server, kept)
}

#[tokio::test]
async fn an_absolute_endpoint_url_is_named_as_such() {
    let (server, _kept) = legacy_server(
        Duration::ZERO,
        Duration::ZERO,
        "http://127.0.0.1:8000/messages?session_id=1",
    )
    .await;
    let report = probe(&format!("{}/sse", server.url())).await;
    assert_eq!(report.verdict.kind, Kind::LegacyServer, "{}", report.text());
    assert!(report
        .verdict
        .finding
        .contains("http://127.0.0.1:8000/messages?session_id=1 (absolute)"));
}

#[tokio::test]
async fn a_slow_post_leaves_the_get_its_whole_budget() {
    // The POST's answer takes most of a 2 s budget and the endpoint event comes 1.2 s into
    // the GET: only a GET with a budget of its own sees it.
    let (server, _kept) = legacy_server(
        Duration::from_millis(1500),
        Duration::from_millis(1200),
        "/messages",
    )
    .await;
    let report = probe_with(&format!("{}/sse", server.url()), 2.0, &[]).await;
    assert_eq!(report.verdict.kind, Kind::LegacyServer, "{}", report.text());
}

#[tokio::test]
async fn an_unresolvable_name_is_an_outage_named_dns_or_a_timeout() {
    // `.invalid` never resolves (RFC 6761); a slow resolver may make it a timeout instead.
    let report = probe("http://holdfast-probe-test.invalid/mcp").await;
    assert_eq!(report.verdict.kind, Kind::Outage, "{}", report.text());
    let finding = &report.verdict.finding;
    assert!(
        finding.contains("the name does not resolve")
            || finding.contains("did not complete in time"),
        "{finding}"
    );
}

#[tokio::test]
async fn a_410_with_a_json_message_shows_it() {
    let old = Upstream::start(|_| async {
        response(
            410,
            &[("content-type", "application/json")],
            r#"{"error":"this endpoint is retired, use /mcp"}"#,
        )
    })
    .await;
    let report = probe(&format!("{}/sse", old.url())).await;
    assert_eq!(report.verdict.kind, Kind::NotMcp);
    assert!(report
        .verdict
        .finding
        .contains("this endpoint is retired, use /mcp"));
}
