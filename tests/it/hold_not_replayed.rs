//! What is never held or never replayed: a failure after the request may have reached the
//! application (502), holding switched off, the server's own 404s.
//!
//! Through a real holdfast in front of an upstream that goes away and comes back on the same port
//! (`support::hold` says how, and why nothing waits a fixed time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::support::hold::{
    assert_never_held, call_body, holding, request, spawn_post, HELD, LONG_HOLD_SECS, OUTAGES,
    REPLAYS,
};
use crate::support::http::{post_json, response, Reserved, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::within_secs;

// Failures after the request may have reached the application: 502, never replayed.

/// An upstream that reads each request completely and then resets (`abortive`) or closes.
/// Counts the requests it read; bare connections without a request are not counted.
async fn reads_then_breaks(listener: TcpListener, abortive: bool) -> Arc<AtomicUsize> {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let c = c.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = vec![0u8; 8192];
                let head_end = loop {
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                while got.len() < head_end + len {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                c.fetch_add(1, Ordering::SeqCst);
                if abortive {
                    // SO_LINGER 0: close sends RST. (Deprecated because a non-zero linger
                    // blocks on drop; zero does not.)
                    #[allow(deprecated)]
                    s.set_linger(Some(Duration::ZERO)).unwrap();
                }
                drop(s);
            });
        }
    });
    count
}

#[tokio::test]
async fn reset_or_eof_after_the_request_was_read_is_502_and_never_replayed() {
    for abortive in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = reads_then_breaks(listener, abortive).await;
        let hf = Holdfast::start_with(holding(&format!("http://{addr}"), LONG_HOLD_SECS)).await;
        let got = within_secs(5, post_json(&hf.url("/mcp"), &call_body(3))).await;
        assert_eq!(got.status, 502, "abortive={abortive}");
        assert_eq!(got.header("holdfast-reason"), Some("upstream_reset"));
        assert_eq!(got.header("retry-after"), None);
        // holdfast has answered, so it is done with the request: one read, no replay.
        assert_eq!(count.load(Ordering::SeqCst), 1, "abortive={abortive}");
        assert_never_held(&hf).await;
        assert_eq!(hf.metric(OUTAGES).await, 0.0);
    }
}

#[tokio::test]
async fn a_released_request_that_then_meets_a_reset_is_502_and_not_sent_again() {
    // Held through a refused connection, released when something listens again, and then the
    // "application" reads it and resets: that attempt may have executed, so it is final.
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    let client = spawn_post(hf.url("/mcp"), call_body(4));
    hf.metric_until(HELD, |v| v == 1.0).await;
    let count = reads_then_breaks(port.listen(), true).await;
    let got = within_secs(10, client).await.unwrap();
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("upstream_reset"));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(hf.metric(REPLAYS).await, 1.0, "the one send after the hold");
    assert_eq!(hf.metric(HELD).await, 0.0);
}

#[tokio::test]
async fn no_response_head_in_time_is_502_and_not_replayed() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let up = Upstream::start(move |_| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(());
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut raw = holding(&up.url(), LONG_HOLD_SECS);
    raw.client.response_timeout_secs = 0.3;
    let hf = Holdfast::start_with(raw).await;
    let got = within_secs(5, post_json(&hf.url("/mcp"), &call_body(6))).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("response_timeout"));
    rx.recv().await.unwrap();
    assert!(rx.try_recv().is_err(), "sent exactly once");
    assert_eq!(up.seen().len(), 1);
    assert_never_held(&hf).await;
}

// Holding off.

#[tokio::test]
async fn with_holding_off_a_missing_backend_is_503_at_once() {
    let port = Reserved::new();
    let router = Upstream::route_missing().await;
    for upstream in [port.url(), router.url()] {
        let mut raw = holding(&upstream, LONG_HOLD_SECS);
        raw.hold.enabled = false;
        let hf = Holdfast::start_with(raw).await;
        // The second request arrives while the outage is open: not held either.
        for id in [1, 2] {
            let got = within_secs(5, post_json(&hf.url("/mcp"), &call_body(id))).await;
            assert_eq!(got.status, 503, "{upstream}");
            assert!(got.header("retry-after").is_some());
        }
        assert_never_held(&hf).await;
        assert_eq!(hf.metric(OUTAGES).await, 1.0);
        assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
    }
    assert_eq!(router.seen().len(), 2);
}

// The server's own 404s.

#[tokio::test]
async fn the_servers_own_404s_pass_at_once_and_are_never_held() {
    type Headers = &'static [(&'static str, &'static str)];
    let cases: [(Headers, &str); 2] = [
        (
            &[("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}"#,
        ),
        // rmcp: no Content-Type at all.
        (&[], "Not Found: Session not found"),
    ];
    for (headers, body) in cases {
        let up = Upstream::start(move |_| async move { response(404, headers, body) }).await;
        let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
        let got = within_secs(
            5,
            request(
                "POST",
                &hf.url("/mcp"),
                &[
                    ("content-type", "application/json"),
                    ("mcp-session-id", "stale"),
                ],
                &call_body(1),
            ),
        )
        .await;
        assert_eq!(got.status, 404, "{body}");
        assert_eq!(got.body, body.as_bytes());
        assert_eq!(
            got.header("content-type"),
            headers.first().map(|(_, v)| *v),
            "{body}"
        );
        assert_eq!(up.seen().len(), 1);
        assert_eq!(hf.metric(OUTAGES).await, 0.0, "{body}");
        assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
        assert_never_held(&hf).await;
    }
}
