//! SIGHUP: the configuration read again and taken while holdfast runs, by new requests and new
//! connections alike, with nothing held, tracked or learned lost; an invalid one refused with
//! every problem said; what cannot change while running named. And a second SIGTERM, which ends
//! the drain at once.

use crate::session::{count_call, open_session, result_text, send};
use crate::support::forgetful::ForgetfulServer;
use crate::support::http::{post_json, Reserved, Upstream};
use crate::support::mcp::raw_http;
use crate::support::process::{holdfast, serving, signal, Running};
use crate::support::proxy::{metric_until_at, raw_config, Holdfast};
use crate::support::within;

/// A ping as a client posts it.
const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// An upstream where nothing listens, with holding off: every request gets the 503 at once, its
/// Retry-After saying `retry_after_secs`.
fn refused(port: &Reserved, retry_after: u64) -> holdfast::config::RawConfig {
    let mut raw = raw_config(&port.url());
    raw.hold.enabled = false;
    raw.hold.retry_after = "fixed".into();
    raw.retry_after_secs = retry_after;
    raw
}

#[tokio::test]
async fn new_requests_take_the_reloaded_settings() {
    let port = Reserved::new();
    let holdfast = Holdfast::start_with(refused(&port, 2)).await;
    let before = within(post_json(&holdfast.url("/mcp"), PING)).await;
    assert_eq!(before.status, 503);
    assert_eq!(before.header("retry-after"), Some("2"));

    holdfast.reload(refused(&port, 7)).await;
    let after = within(post_json(&holdfast.url("/mcp"), PING)).await;
    assert_eq!(after.header("retry-after"), Some("7"));
}

#[tokio::test]
async fn a_kept_alive_connection_takes_the_reload_at_its_next_request() {
    let port = Reserved::new();
    let holdfast = Holdfast::start_with(refused(&port, 2)).await;
    let mut conn = tokio::net::TcpStream::connect(holdfast.addr).await.unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{PING}",
        holdfast.addr,
        PING.len()
    );
    let first = within(raw_http_on(&mut conn, &request)).await;
    assert!(first.contains("retry-after: 2"), "{first}");
    holdfast.reload(refused(&port, 7)).await;
    let second = within(raw_http_on(&mut conn, &request)).await;
    assert!(second.contains("retry-after: 7"), "{second}");
}

/// Writes `request` on `conn` and reads one answer's head and its (Content-Length) body.
async fn raw_http_on(conn: &mut tokio::net::TcpStream, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text;
            }
        }
    }
}

#[tokio::test]
async fn held_requests_and_sessions_outlive_a_reload() {
    // A session, opened before the reload, keeps its upstream session after it.
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    let mut raw = raw_config(&server.upstream.url());
    raw.retry_after_secs = 3;
    holdfast.reload(raw).await;
    let call = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&call), "1");
    assert_eq!(
        server.opened(),
        1,
        "the session went on, nothing re-established"
    );

    // A request held through the reload is released once the upstream answers.
    let port = Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.hold.timeout_secs = 20.0;
    let holdfast = Holdfast::start_with(raw.clone()).await;
    let url = holdfast.url("/mcp");
    let held = tokio::spawn(async move { post_json(&url, PING).await });
    holdfast
        .metric_until("holdfast_held_requests", |n| n == 1.0)
        .await;
    raw.retry_after_secs = 5;
    holdfast.reload(raw).await;
    assert_eq!(holdfast.metric("holdfast_held_requests").await, 1.0);
    let up = Upstream::serve(port.listen(), |_| async {
        crate::support::http::response(200, &[("content-type", "application/json")], "{}")
    });
    assert_eq!(within(held).await.unwrap().status, 200);
    assert_eq!(up.seen().len(), 1, "sent once");
    up.stop().await;
}

/// The binary, as an operator runs it: a file edited, SIGHUP; a broken edit refused; what
/// cannot change named; SIGHUP never ends the process.
#[tokio::test]
async fn sighup_reloads_the_file_refuses_a_broken_one_and_names_what_cannot_change() {
    let port = Reserved::new();
    let dir = crate::support::files::TempDir::new("reload");
    let config = |rest: &str| {
        format!(
            "upstream = \"{}\"\nadmin = \"127.0.0.1:0\"\nlog_format = \"json\"\n{rest}\n[hold]\nenabled = false\n",
            port.url()
        )
    };
    let file = dir.write(
        "holdfast.toml",
        &config("listen = \"127.0.0.1:0\"\nretry_after_secs = 2"),
    );
    let file = file.to_str().unwrap().to_owned();
    let mut proxy = Running::start(&mut holdfast(&["--config", &file]));
    let (listen, admin) = proxy.addresses();
    let url = format!("http://{listen}/mcp");
    let first = within(post_json(&url, PING)).await;
    assert_eq!(first.header("retry-after"), Some("2"));

    // A good edit, with a listen address and tracing, which cannot change while running.
    dir.write(
        "holdfast.toml",
        &config("listen = \"127.0.0.1:1\"\nretry_after_secs = 9\n[tracing]\nenabled = true"),
    );
    signal(proxy.pid(), "HUP");
    let warning = proxy.wait_for_line("cannot change while holdfast runs");
    assert!(warning.contains("listen"), "{warning}");
    assert!(warning.contains("tracing"), "{warning}");
    proxy.wait_for_line("configuration reloaded");
    let second = within(post_json(&url, PING)).await;
    assert_eq!(second.header("retry-after"), Some("9"), "still on {listen}");

    // A broken edit: refused, every problem said, the running configuration stays.
    dir.write(
        "holdfast.toml",
        &config(
            "listen = \"127.0.0.1:1\"\nretry_after_secs = 0\n[client]\nconnect_timeout_secs = -5",
        ),
    );
    signal(proxy.pid(), "HUP");
    let problem = proxy.wait_for_line("reload refused: the configuration is invalid");
    assert!(problem.contains("retry_after_secs"), "{problem}");
    proxy.wait_for_line("connect_timeout_secs");
    proxy.wait_for_line("the running configuration stays");
    let third = within(post_json(&url, PING)).await;
    assert_eq!(third.header("retry-after"), Some("9"));
    let admin = admin.to_string();
    metric_until_at(
        &admin,
        "holdfast_config_reloads_total{result=\"ok\"}",
        |n| n == 1.0,
    )
    .await;
    metric_until_at(
        &admin,
        "holdfast_config_reloads_total{result=\"refused\"}",
        |n| n == 1.0,
    )
    .await;
    let (status, _) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// A second SIGTERM ends the drain at once: a stream that would keep it going for a minute is
/// cut, and the process exits well within the test's patience (30 s).
#[tokio::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    // An upstream that never answers: a request in flight keeps the drain going.
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let upstream = Upstream::start(move |_| {
        let arrived_tx = arrived_tx.clone();
        async move {
            let _ = arrived_tx.send(());
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut proxy = Running::start(
        serving(&upstream.url(), &[]).env("HOLDFAST_SHUTDOWN__DRAIN_TIMEOUT_SECS", "60"),
    );
    let (listen, _) = proxy.addresses();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {listen}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{PING}",
        PING.len()
    );
    let in_flight = tokio::spawn(async move { raw_http(listen, request.as_bytes()).await });
    within(arrived.recv())
        .await
        .expect("the request reached the upstream");
    signal(proxy.pid(), "TERM");
    proxy.wait_for_line("shutting down: draining in-flight requests");
    signal(proxy.pid(), "TERM");
    proxy.wait_for_line("asked again to stop: closing remaining connections now");
    // Well within the drain's 60 s: `within` fails after 30.
    let (status, _) = within(tokio::task::spawn_blocking(move || proxy.wait_for_exit()))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let _ = in_flight.await;
}
