//! `hold.probe_path` (issue 10): a port that accepts before the application serves it
//! (docker-proxy publishes the port before the container's process listens) passes the TCP
//! probe. Without a health path the oldest held request goes out as the probe there and is
//! lost; with one, held requests wait until the application has answered the health check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::http::{post_json, Reserved};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;
use holdfast::config::RawConfig;

const CALL: &str = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"record"}}"#;

/// A backend that is starting: until `ready`, it accepts, reads each request and closes the
/// connection without an answer (the port is there, the application is not); then it answers
/// `GET /healthz` and `POST /mcp` with 200. Records each request line with the phase.
struct Starting {
    ready: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(bool, String)>>>,
}

impl Starting {
    fn serve(listener: TcpListener) -> Starting {
        let ready = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn({
            let (ready, seen) = (ready.clone(), seen.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(one(stream, ready.clone(), seen.clone()));
                }
            }
        });
        Starting { ready, seen }
    }

    fn seen(&self) -> Vec<(bool, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// One connection: requests read whole, then closed on (starting) or answered (ready).
async fn one(mut stream: TcpStream, ready: Arc<AtomicBool>, seen: Arc<Mutex<Vec<(bool, String)>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let length: usize = head
            .to_lowercase()
            .lines()
            .find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + length);
        let is_ready = ready.load(Ordering::SeqCst);
        let line = head.lines().next().unwrap_or_default().to_string();
        seen.lock().unwrap().push((is_ready, line));
        if !is_ready {
            return;
        }
        let body = "{}";
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn with_a_health_path_no_held_request_goes_to_a_port_nothing_serves_yet() {
    let port = Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(false);
    raw.hold.probe_path = "/healthz".into();
    raw.hold.timeout_secs = 30.0;
    let hf = Holdfast::start_with(raw).await;

    // The container is gone: refused, so the call is held.
    let url = hf.url("/mcp");
    let call = tokio::spawn(async move { post_json(&url, CALL).await });
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;

    // The port is back before the application: the TCP probe passes, the health check fails.
    let backend = Starting::serve(port.listen());
    within(async {
        while backend.seen().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        backend
            .seen()
            .iter()
            .all(|(_, line)| line == "GET /healthz HTTP/1.1"),
        "only health checks reached the starting backend: {:?}",
        backend.seen()
    );
    assert_eq!(hf.metric("holdfast_held_requests").await, 1.0, "still held");

    // The application is up: the next health check passes and the call goes out, once.
    backend.ready.store(true, Ordering::SeqCst);
    let got = within(call).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    let posts: Vec<_> = backend
        .seen()
        .into_iter()
        .filter(|(_, line)| line.starts_with("POST"))
        .collect();
    assert_eq!(posts, [(true, "POST /mcp HTTP/1.1".to_string())]);
}

#[test]
fn a_health_path_must_be_a_path() {
    let mut raw = raw_config("http://b:1");
    for bad in ["healthz", "http://x/healthz", "/a b"] {
        raw.hold.probe_path = bad.into();
        let err = holdfast::config::Config::from_raw(&raw, &|_| "test".into()).unwrap_err();
        assert!(err.to_string().contains("hold.probe_path"), "{bad}: {err}");
    }
    raw.hold.probe_path = "/healthz?full=1".into();
    let c = holdfast::config::Config::from_raw(&raw, &|_| "test".into()).unwrap();
    assert_eq!(
        c.hold.probe_path.map(|p| p.to_string()).as_deref(),
        Some("/healthz?full=1")
    );
}

/// A health path that answers without ever passing (a 503 for a degraded dependency while MCP
/// works) must not hold everyone forever: after enough such answers the held request probes,
/// as it would without a health path, and is answered.
#[tokio::test]
async fn a_health_path_that_never_passes_stops_deciding_alone() {
    let port = Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(false);
    raw.hold.probe_path = "/healthz".into();
    raw.hold.timeout_secs = 30.0;
    raw.hold.backoff_initial_ms = 2;
    raw.hold.backoff_max_ms = 4;
    let hf = Holdfast::start_with(raw).await;
    let url = hf.url("/mcp");
    let call = tokio::spawn(async move { post_json(&url, CALL).await });
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    let up = crate::support::http::Upstream::serve(port.listen(), |seen| async move {
        if seen.uri.starts_with("/healthz") {
            crate::support::http::response(503, &[], "degraded")
        } else {
            crate::support::http::response(200, &[("content-type", "application/json")], "{}")
        }
    });
    let got = within(call).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    let health_checks = up
        .seen()
        .iter()
        .filter(|s| s.uri.starts_with("/healthz"))
        .count();
    assert_eq!(
        health_checks, 20,
        "the health path decided alone for 20 answers, then the held request probed"
    );
    up.stop().await;
}

/// Health at rest (`hold.check_interval_secs`): with no traffic at all, `holdfast_upstream_up`
/// follows the server. A port where nothing listens opens the outage; the application coming
/// back closes it; and all holdfast ever sent it meanwhile is its health path (never an MCP
/// request it did not get from a client).
#[tokio::test]
async fn at_rest_the_upstream_is_checked_without_traffic() {
    let port = Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(false);
    raw.hold.probe_path = "/healthz".into();
    raw.hold.check_interval_secs = 0.05;
    let hf = Holdfast::start_with(raw).await;

    // Nothing listens, and no request came: the check at rest finds it.
    hf.metric_until("holdfast_upstream_up", |v| v == 0.0).await;
    assert_eq!(hf.metric("holdfast_outages_total").await, 1.0);
    let status = crate::support::http::get(&format!("http://{}/status", hf.admin)).await;
    assert!(
        status
            .text()
            .contains(r#""outage_reason":"connect_refused""#),
        "{}",
        status.text()
    );

    // The application comes back: the next check closes the outage, still without traffic.
    let up = crate::support::http::Upstream::serve(port.listen(), |_| async {
        crate::support::http::response(200, &[], "ok")
    });
    hf.metric_until("holdfast_upstream_up", |v| v == 1.0).await;
    assert_eq!(hf.metric("holdfast_outages_total").await, 1.0);
    assert_eq!(
        hf.metric("holdfast_outage_duration_seconds_count").await,
        1.0,
        "the outage closed with its duration recorded"
    );
    let seen = up.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|s| s.method == http::Method::GET && s.uri == "/healthz"),
        "only the health path reached the server: {:?}",
        seen.iter().map(|s| (&s.method, &s.uri)).collect::<Vec<_>>()
    );
    up.stop().await;
}

/// By default, with no health path: a wrong upstream name shows at once, as a name that does
/// not resolve, in `/status` and `holdfast_upstream_up`, with no request at all.
#[tokio::test]
async fn by_default_a_name_that_does_not_resolve_shows_at_once() {
    let mut raw = raw_config("http://mcp-bakend.invalid:8000");
    raw.hold.check_interval_secs = RawConfig::default().hold.check_interval_secs;
    let hf = Holdfast::start_with(raw).await;
    hf.metric_until("holdfast_upstream_up", |v| v == 0.0).await;
    let status = crate::support::http::get(&format!("http://{}/status", hf.admin)).await;
    assert!(
        status.text().contains(r#""outage_reason":"dns""#),
        "{}",
        status.text()
    );
}

/// With no health path, an outage nobody is held in closes when the application answers an
/// `OPTIONS` on the endpoint (which runs nothing on an MCP server): `holdfast_upstream_up` reads
/// 1 again without a request.
#[tokio::test]
async fn without_a_health_path_options_on_the_endpoint_closes_an_outage_at_rest() {
    let port = Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(false);
    raw.hold.check_interval_secs = 0.05;
    let hf = Holdfast::start_with(raw).await;
    hf.metric_until("holdfast_upstream_up", |v| v == 0.0).await;

    let up = crate::support::http::Upstream::serve(port.listen(), |_| async {
        crate::support::http::response(405, &[("allow", "GET, POST, DELETE")], "")
    });
    hf.metric_until("holdfast_upstream_up", |v| v == 1.0).await;
    let seen = up.seen();
    assert!(
        seen.iter()
            .all(|s| s.method == http::Method::OPTIONS && s.uri == "/mcp"),
        "only OPTIONS on the endpoint reached the server: {:?}",
        seen.iter().map(|s| (&s.method, &s.uri)).collect::<Vec<_>>()
    );
    up.stop().await;
}

/// `hold.check_interval_secs`: 10 s by default, 0 turns the check at rest off, anything else
/// must be a positive number of seconds.
#[test]
fn the_check_interval_defaults_to_ten_seconds_and_zero_turns_it_off() {
    let mut raw = RawConfig {
        upstream: "http://b:1".into(),
        ..RawConfig::default()
    };
    let c = holdfast::config::Config::from_raw(&raw, &|_| "test".into()).unwrap();
    assert_eq!(c.hold.check_interval, Some(Duration::from_secs(10)));
    raw.hold.check_interval_secs = 0.0;
    let c = holdfast::config::Config::from_raw(&raw, &|_| "test".into()).unwrap();
    assert_eq!(c.hold.check_interval, None);
    for bad in [-1.0, f64::NAN] {
        raw.hold.check_interval_secs = bad;
        let err = holdfast::config::Config::from_raw(&raw, &|_| "test".into()).unwrap_err();
        assert!(
            err.to_string().contains("hold.check_interval_secs"),
            "{bad}: {err}"
        );
    }
}
