//! A request body the client breaks once its upload has begun (a chunk that does not decode, a
//! chunk size of 17 hex digits, a body that ends before its length, a stall): the client's
//! failure, answered 400 (408 for the stall) as nginx and HAProxy answer it, and never counted
//! against the upstream (issue 43: it was a 502 `client_body` in
//! `holdfast_upstream_failures_total`, so a client sending garbage could fire
//! `HoldfastUpstreamFailures`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::http::{echo, raw_post, read_head, Upstream};
use crate::support::proxy::{metric_value, raw_config, Holdfast};
use crate::support::within;

/// A chunked POST's head and a first good chunk, then `rest`.
fn chunked(addr: std::net::SocketAddr, rest: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n{rest}"
    )
}

/// Every series of `holdfast_upstream_failures_total`, summed: none may count a client's fault.
fn upstream_failures(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("holdfast_upstream_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What `stream` receives until the connection ends (bounded).
async fn answer(mut stream: TcpStream) -> String {
    let mut got = Vec::new();
    within(stream.read_to_end(&mut got)).await.unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_body_the_client_breaks_mid_upload_is_a_400_not_an_upstream_failure() {
    let up = Upstream::start(echo).await;
    let mut raw = raw_config(&up.url());
    raw.routes.behind_router = Some(false);
    let hf = Holdfast::start_with(raw).await;

    let broken = [
        // A chunk-size line that is no hex number.
        "zz\r\nworld\r\n0\r\n\r\n",
        // A chunk size of 17 hex digits: past what 64 bits hold.
        "10000000000000000\r\nworld\r\n0\r\n\r\n",
        // A chunk's data not ended by CRLF.
        "5\r\nworldX0\r\n\r\n",
    ];
    for rest in broken {
        let mut s = TcpStream::connect(hf.addr).await.unwrap();
        s.write_all(chunked(hf.addr, rest).as_bytes())
            .await
            .unwrap();
        let got = answer(s).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{rest:?}: {got}");
        assert!(got.contains("holdfast-reason: client_body"), "{got}");
    }
    // A body that ends before its length: the client closes its side after 10 of 40 bytes.
    let body = "x".repeat(40);
    let mut cut = raw_post(hf.addr, &body, 10).await;
    cut.shutdown().await.unwrap();
    let got = answer(cut).await;
    assert!(got.starts_with("HTTP/1.1 400 "), "cut short: {got}");

    // Each upload had begun: the upstream saw each body break off.
    let seen = up.until_seen(broken.len() + 1).await;
    assert!(seen.iter().all(|s| s.body_error.is_some()), "{seen:#?}");

    let metrics = hf.metrics().await;
    assert_eq!(upstream_failures(&metrics), 0.0, "{metrics}");
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_client_body_failures_total{reason=\"malformed\"}"
        ),
        (broken.len() + 1) as f64
    );
}

/// A client that stops in the middle of its upload is cut after `streams.idle_timeout_secs`:
/// 408, as nginx's `client_body_timeout` answers, and the upstream sees the body break off
/// (never a short body that looks whole).
#[tokio::test]
async fn an_upload_that_stalls_is_a_408_after_the_idle_timeout() {
    let up = Upstream::start(echo).await;
    let mut raw = raw_config(&up.url());
    raw.streams.idle_timeout_secs = 0.3;
    let hf = Holdfast::start_with(raw).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count"}}"#;
    let mut stalled = raw_post(hf.addr, body, body.len() / 2).await;
    let head = within(read_head(&mut stalled)).await;
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(
        head.contains("holdfast-reason: client_body_timeout"),
        "{head}"
    );
    let seen = up.until_seen(1).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].body_error.is_some(), "{seen:?}");
    assert_eq!(seen[0].body, body.as_bytes()[..body.len() / 2]);

    let metrics = hf.metrics().await;
    assert_eq!(upstream_failures(&metrics), 0.0, "{metrics}");
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_client_body_failures_total{reason=\"idle_timeout\"}"
        ),
        1.0
    );
}
