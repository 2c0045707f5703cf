//! Leaving the hold early: a client that goes away while held is never sent, and a shutdown
//! answers held requests at once.
//!
//! Through a real holdfast in front of an upstream that goes away and comes back on the same port
//! (`support::hold` says how, and why nothing waits a fixed time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::hold::{call_body, holding, holds, spawn_post, HELD, LONG_HOLD_SECS};
use crate::support::http::TRAEFIK_404_HEADERS as TRAEFIK_404;
use crate::support::http::{echo, post_json, raw_post, read_head, response, Reserved, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::{within, within_secs};

// Cancellation.

#[tokio::test]
async fn a_client_that_leaves_while_held_is_never_sent() {
    // POST with its whole body, and GET and DELETE without one.
    for method in ["POST", "GET", "DELETE"] {
        let port = Reserved::new();
        let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
        let body = call_body(21);
        let mut s = TcpStream::connect(hf.addr).await.unwrap();
        let req = if method == "POST" {
            format!(
                "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                hf.addr,
                body.len()
            )
        } else {
            format!(
                "{method} /mcp?gone=1 HTTP/1.1\r\nhost: {}\r\nmcp-session-id: s-1\r\n\r\n",
                hf.addr
            )
        };
        s.write_all(req.as_bytes()).await.unwrap();
        hf.metric_until(HELD, |v| v == 1.0).await;
        drop(s);
        hf.metric_until("holdfast_holds_total{outcome=\"cancelled\"}", |v| v == 1.0)
            .await;
        assert_eq!(hf.metric(HELD).await, 0.0, "{method}");

        // The upstream comes back; a later request goes through, so holdfast had every chance
        // to send the abandoned one.
        let up = Upstream::serve(port.listen(), echo);
        let later = within_secs(10, post_json(&hf.url("/mcp"), &call_body(22))).await;
        assert_eq!(later.status, 200, "{method}");
        let seen = up.seen();
        assert_eq!(seen.len(), 1, "{method}: only the later request: {seen:?}");
        assert_eq!(seen[0].body, call_body(22).as_bytes());
        assert_eq!(holds(&hf, "cancelled").await, 1.0, "{method}");
        assert_eq!(holds(&hf, "released").await, 1.0, "{method}");
        up.stop().await;
    }
}

#[tokio::test]
async fn a_client_that_leaves_mid_body_while_held_is_never_sent() {
    // The body is still arriving when the request is held; the client goes away mid-body. A body
    // larger than hyper's write buffer (so a truncated send would be flushed), and a small one.
    let mut problems = Vec::new();
    for size in [900_000, 100] {
        let port = Reserved::new();
        let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{{"blob":"{}"}}}}"#,
            "c".repeat(size)
        );
        let partial = raw_post(hf.addr, &body, body.len() / 2).await;
        hf.metric_until(HELD, |v| v == 1.0).await;
        drop(partial);

        // The upstream comes back; a later request goes through, so holdfast had every chance
        // to send the abandoned one.
        let up = Upstream::serve(port.listen(), echo);
        let later = within_secs(10, post_json(&hf.url("/mcp"), &call_body(32))).await;
        assert_eq!(later.status, 200);
        // Body lengths, and whether each broke off at the upstream (the abandoned request sent
        // after all, cut short).
        let seen: Vec<(usize, bool)> = up
            .seen_even_broken()
            .iter()
            .map(|s| (s.body.len(), s.body_error.is_some()))
            .collect();
        let released = holds(&hf, "released").await;
        let cancelled = holds(&hf, "cancelled").await;
        if seen != vec![(call_body(32).len(), false)] {
            problems.push(format!(
                "{size}: the upstream saw bodies of {seen:?} (bytes, broken), expected only the \
                 later request's {}",
                call_body(32).len()
            ));
        }
        if (cancelled, released) != (1.0, 1.0) {
            problems.push(format!(
                "{size}: holds_total cancelled={cancelled} released={released}, expected 1 and 1"
            ));
        }
        // Counted as what it is: a client that closed its request (499), not a 400.
        let closed = hf
            .metric_or_zero("holdfast_requests_total{method=\"POST\",status=\"499\"}")
            .await;
        let bad = hf
            .metric_or_zero("holdfast_requests_total{method=\"POST\",status=\"400\"}")
            .await;
        if (closed, bad) != (1.0, 0.0) {
            problems.push(format!(
                "{size}: requests_total status 499={closed} 400={bad}, expected 1 and 0"
            ));
        }
        up.stop().await;
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_held_request_whose_body_is_still_arriving_is_sent_whole_when_released() {
    // A slow client: half its body arrives before the hold, the rest after the release. The
    // request must go out whole, not cut at what was read ahead while it waited.
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    let body = call_body(41);
    let half = body.len() / 2;
    let mut slow = raw_post(hf.addr, &body, half).await;
    hf.metric_until(HELD, |v| v == 1.0).await;

    let up = Upstream::serve(port.listen(), echo);
    hf.metric_until("holdfast_holds_total{outcome=\"released\"}", |v| v == 1.0)
        .await;
    // Write errors are left to the response below to explain.
    let _ = slow.write_all(&body.as_bytes()[half..]).await;
    let head = within_secs(10, read_head(&mut slow)).await;
    let seen = up.seen();
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{head}\nupstream saw: {seen:?}"
    );
    assert_eq!(
        seen.iter().map(|s| s.body.clone()).collect::<Vec<_>>(),
        vec![Bytes::from(body)],
        "the upstream saw the whole body once"
    );
    up.stop().await;
}

// Shutdown.

/// Without peers, a held request has nowhere better to go than its upstream: it keeps waiting
/// for it through the drain, and is answered when the upstream comes back within it.
#[tokio::test]
async fn at_shutdown_without_peers_held_requests_wait_for_the_upstream_through_the_drain() {
    let port = Reserved::new();
    let mut raw = holding(&port.url(), LONG_HOLD_SECS);
    raw.shutdown.drain_timeout_secs = 25.0;
    let mut hf = Holdfast::start_with(raw).await;
    let a = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;

    hf.begin_shutdown();
    let up = Upstream::serve(port.listen(), echo);
    let a = within(a).await.unwrap();
    assert_eq!(
        a.status, 200,
        "answered by the upstream back within the drain"
    );
    assert_eq!(a.body, call_body(1).as_bytes());
    within(hf.wait()).await;
    up.stop().await;
}

/// ... and when the drain ends first, it gets its 503.
#[tokio::test]
async fn a_held_request_gets_its_503_when_the_drain_ends() {
    let port = Reserved::new();
    let mut raw = holding(&port.url(), LONG_HOLD_SECS);
    raw.shutdown.drain_timeout_secs = 0.5;
    let mut hf = Holdfast::start_with(raw).await;
    // A met the refused connection; B arrived during the outage.
    let a = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;
    let b = spawn_post(hf.url("/mcp"), call_body(2));
    hf.metric_until(HELD, |v| v == 2.0).await;

    hf.begin_shutdown();
    // Well before the hold timeout, which is what they would wait otherwise.
    const BEFORE_THE_HOLD_TIMEOUT: u64 = LONG_HOLD_SECS as u64 / 3;
    let (a, b) = within_secs(BEFORE_THE_HOLD_TIMEOUT, async {
        (a.await.unwrap(), b.await.unwrap())
    })
    .await;
    for got in [&a, &b] {
        assert_eq!(got.status, 503);
        assert_eq!(got.header("holdfast-reason"), Some("connect_refused"));
        assert!(got.header("retry-after").is_some());
        let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(v["error"]["code"], -32000);
    }
    within(hf.wait()).await;
    drop(port);
}

#[tokio::test]
async fn shutdown_is_counted_as_the_held_requests_outcome() {
    // The admin port (and so /metrics) lives only until the drain ends, so something must keep
    // the drain going while the counters are read: a request in flight at an upstream that does
    // not answer. The outage comes from a router's route-missing 404: the request that met it
    // is held and then sent as the probe, to that silent upstream, and the prober waits for its
    // answer, so the requests held after it stay held. (After a router's 5xx the probe would
    // be an OPTIONS, and no held request would be in flight.)
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let count = Arc::new(AtomicUsize::new(0));
    let up = Upstream::start(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let arrived_tx = arrived_tx.clone();
        async move {
            if n == 0 {
                return response(404, TRAEFIK_404, "404 page not found\n");
            }
            let _ = arrived_tx.send(());
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut raw = holding(&up.url(), LONG_HOLD_SECS);
    raw.shutdown.drain_timeout_secs = 1.0;
    let mut hf = Holdfast::start_with(raw).await;
    within_secs(5, async {
        // Raw, so that its connection being cut at the drain timeout is no client-side panic.
        let probe = raw_post(hf.addr, &call_body(1), call_body(1).len()).await;
        arrived.recv().await.unwrap();
        let a = spawn_post(hf.url("/mcp"), call_body(3));
        let b = spawn_post(hf.url("/mcp"), call_body(4));
        hf.metric_until(HELD, |v| v == 2.0).await;

        hf.begin_shutdown();
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(a.status, 503);
        assert_eq!(b.status, 503);
        assert_eq!(holds(&hf, "shutdown").await, 2.0);
        assert_eq!(holds(&hf, "timed_out").await, 0.0);
        assert_eq!(holds(&hf, "released").await, 1.0, "the probe");
        assert_eq!(hf.metric(HELD).await, 0.0);
        // The silent probe is cut at the drain timeout.
        hf.wait().await;
        drop(probe);
    })
    .await;
    assert_eq!(
        up.seen().len(),
        2,
        "the first attempt and the probe, nothing after"
    );
}
