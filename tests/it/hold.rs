//! Hold and replay, through a real holdfast in front of an upstream that goes away and comes
//! back on the same port.
//!
//! "Going away" is a reserved port: a socket bound on 127.0.0.1:0 that does not listen, so
//! connections to it are refused, and no other test can take the port meanwhile. "Coming back"
//! is the same socket starting to listen. Nothing here waits a fixed time for an event: where
//! holdfast offers no event to await (a request entering the hold), the tests poll the metric
//! that shows it, with a deadline. Real time passes only where a timeout or an outage's length
//! is the subject (fractions of a second, and one outage of 2.5 s). The clock is not paused:
//! holdfast's own timers (connect, response head, body idle) would then fire early whenever the
//! runtime idles waiting for loopback I/O.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::support::http::{
    call, echo, host_of, post_json, raw_post, read_head, response, traefik_404, Got, Reserved,
    Seen, TestBody, Upstream,
};
use crate::support::proxy::{raw_config, Holdfast, HOLD_OUTCOMES};
use crate::support::{within, within_secs};

use crate::support::http::TRAEFIK_404_HEADERS as TRAEFIK_404;

/// Long enough that no test here ever reaches it unless it sets a shorter one.
const LONG_HOLD_SECS: f64 = 30.0;

fn call_body(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"count"}}}}"#)
}

/// A router in front of an application that is missing for the first `missing` requests: until
/// then it answers `status` with `headers` and `body` (after reading the whole request body, as
/// a router does), then the application echoes.
fn router_then_app(
    missing: usize,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
) -> impl Fn(Seen) -> std::pin::Pin<Box<dyn Future<Output = Response<TestBody>> + Send>>
       + Send
       + Sync
       + 'static {
    let count = Arc::new(AtomicUsize::new(0));
    move |seen: Seen| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n < missing {
                response(status, headers, body)
            } else {
                response(200, &[("content-type", "application/json")], seen.body)
            }
        })
    }
}

/// `holdfast_holds_total{outcome}`.
async fn holds(hf: &Holdfast, outcome: &str) -> f64 {
    hf.metric(&format!("holdfast_holds_total{{outcome=\"{outcome}\"}}"))
        .await
}

const HELD: &str = "holdfast_held_requests";
const REPLAYS: &str = "holdfast_replays_total";
const OUTAGES: &str = "holdfast_outages_total";

/// Every hold outcome is zero.
async fn assert_never_held(hf: &Holdfast) {
    for outcome in HOLD_OUTCOMES {
        assert_eq!(holds(hf, outcome).await, 0.0, "holds_total{{{outcome}}}");
    }
    assert_eq!(hf.metric(HELD).await, 0.0);
    assert_eq!(hf.metric(REPLAYS).await, 0.0);
}

/// A configuration whose holds last `timeout_secs`.
fn holding(upstream: &str, timeout_secs: f64) -> holdfast::config::RawConfig {
    let mut raw = raw_config(upstream);
    raw.hold.timeout_secs = timeout_secs;
    raw
}

/// POSTs `body` to `url` in the background.
fn spawn_post(url: String, body: String) -> JoinHandle<Got> {
    tokio::spawn(async move { post_json(&url, &body).await })
}

/// Sends `method` with `headers` and `body` to `url`.
async fn request(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Got {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header("host", host_of(url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    call(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
}

fn retry_after(got: &Got) -> u64 {
    got.header("retry-after")
        .expect("a 503 carries Retry-After")
        .parse()
        .unwrap()
}

// 1. Refused, held, the upstream comes back on the same port.

#[tokio::test]
async fn refused_request_is_held_and_replayed_once_the_upstream_is_back() {
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    let body = call_body(7);
    let client = spawn_post(hf.url("/mcp"), body.clone());
    hf.metric_until(HELD, |v| v == 1.0).await;
    assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
    assert!(!client.is_finished(), "held, not answered");

    let back = Instant::now();
    let up = Upstream::serve(port.listen(), echo);
    let got = within_secs(10, client).await.unwrap();
    eprintln!("refused → back: answered {:?} after listen", back.elapsed());
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.body, body.as_bytes());
    assert_eq!(got.header("holdfast-reason"), None);

    let seen = up.seen();
    assert_eq!(
        seen.len(),
        1,
        "the application saw the request exactly once"
    );
    assert_eq!(seen[0].body, body.as_bytes());
    assert_eq!(seen[0].uri, "/mcp");
    assert_eq!(holds(&hf, "released").await, 1.0);
    // It met the refused connection, so it was sent a second time.
    assert_eq!(hf.metric(REPLAYS).await, 1.0);
    assert_eq!(hf.metric(OUTAGES).await, 1.0);
    assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
    assert_eq!(hf.metric(HELD).await, 0.0);
    assert_eq!(
        hf.metric("holdfast_outage_duration_seconds_count").await,
        1.0
    );
    assert_eq!(hf.metric("holdfast_hold_duration_seconds_count").await, 1.0);
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}")
            .await,
        0.0,
        "nothing was rewritten: the client got the application's answer"
    );
    up.stop().await;
}

#[tokio::test]
async fn request_arriving_during_an_outage_is_held_before_dispatch_and_sent_once() {
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    // The first request meets the refused connection and opens the outage.
    let first = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;
    // The second arrives while the outage is open: it waits before being sent at all.
    let second = spawn_post(hf.url("/mcp"), call_body(2));
    hf.metric_until(HELD, |v| v == 2.0).await;

    let up = Upstream::serve(port.listen(), echo);
    let (first, second) = within_secs(10, async { (first.await, second.await) }).await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.status, 200);
    assert_eq!(first.body, call_body(1).as_bytes());
    assert_eq!(second.status, 200);
    assert_eq!(second.body, call_body(2).as_bytes());

    let mut bodies: Vec<Bytes> = up.seen().into_iter().map(|s| s.body).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        vec![Bytes::from(call_body(1)), Bytes::from(call_body(2))],
        "each request reached the application exactly once"
    );
    assert_eq!(holds(&hf, "released").await, 2.0);
    // Only the first was ever sent before: the second's only attempt is no replay.
    assert_eq!(hf.metric(REPLAYS).await, 1.0);
    assert_eq!(hf.metric(OUTAGES).await, 1.0);
    up.stop().await;
}

#[tokio::test]
async fn router_502_answers_503_at_once_and_the_next_request_waits_for_the_app() {
    // Traefik's 502 may follow a request the backend read: never replayed, 503 at once. It still
    // opens the outage, so the next request is held before dispatch and sent once.
    let up = Upstream::start(router_then_app(1, 502, &[], "Bad Gateway")).await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let first = within_secs(5, post_json(&hf.url("/mcp"), &call_body(1))).await;
    assert_eq!(first.status, 503);
    assert_eq!(first.header("holdfast-reason"), Some("router_unavailable"));
    assert!(first.header("retry-after").is_some());
    assert_eq!(hf.metric(OUTAGES).await, 1.0);

    let second = within_secs(10, post_json(&hf.url("/mcp"), &call_body(2))).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body, call_body(2).as_bytes());
    let seen = up.seen();
    let sent: Vec<_> = seen
        .iter()
        .map(|s| (s.method.as_str(), &s.body[..]))
        .collect();
    assert_eq!(
        sent,
        [
            ("POST", call_body(1).as_bytes()),
            // The held request did not go out as the probe into a possible 502: a request that
            // runs nothing asked first.
            ("OPTIONS", &b""[..]),
            ("POST", call_body(2).as_bytes()),
        ],
        "the 502'd request was not sent again"
    );
    assert_eq!(holds(&hf, "released").await, 1.0);
    assert_eq!(hf.metric(REPLAYS).await, 0.0);
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"router_unavailable\",action=\"answered_503\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn router_504_answers_503_at_once_even_while_holding() {
    let up = Upstream::start(|_| async { response(504, &[], "Gateway Timeout") }).await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let got = within_secs(5, post_json(&hf.url("/mcp"), &call_body(1))).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("router_unavailable"));
    assert_eq!(up.seen().len(), 1, "not replayed");
    assert_never_held(&hf).await;
}

// 2. A router's route-missing answer: the body it consumed is replayed byte for byte.

#[tokio::test]
async fn route_missing_body_is_replayed_byte_identical_to_the_app() {
    // A JSON body larger than one read, with escapes and non-ASCII, so a re-encoding or a lost
    // chunk would show.
    let text: String = (0..1500).map(|i| format!("żółw \\\"{i}\\\" ✓ ")).collect();
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
    );
    assert!(body.len() > 16 * 1024);
    serde_json::from_str::<serde_json::Value>(&body).expect("valid JSON");

    // Two route-missing answers (the first attempt, then the first probe), then the app.
    let up = Upstream::start(router_then_app(2, 404, TRAEFIK_404, "404 page not found\n")).await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let got = within_secs(10, post_json(&hf.url("/mcp"), &body)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.body, body.as_bytes());

    let seen = up.seen();
    assert_eq!(seen.len(), 3, "router, router, application");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.method, "POST");
        assert_eq!(s.uri, "/mcp");
        assert_eq!(
            s.body,
            body.as_bytes(),
            "attempt {i} carried the exact body"
        );
        assert_eq!(
            s.headers.get("content-type").unwrap(),
            "application/json",
            "attempt {i}"
        );
        assert_eq!(
            s.headers.get("content-length").map(|v| v.to_str().unwrap()),
            Some(body.len().to_string().as_str()),
            "attempt {i}"
        );
    }
    assert_eq!(hf.metric(REPLAYS).await, 2.0);
    // Each probe is an exit from the hold, so one request re-held once counts as two releases.
    assert_eq!(holds(&hf, "released").await, 2.0);
    assert_eq!(hf.metric(OUTAGES).await, 1.0);
    assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn router_no_available_server_503_is_held_and_replayed() {
    let up = Upstream::start(router_then_app(1, 503, &[], "no available server\n")).await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let body = call_body(5);
    let got = within_secs(10, post_json(&hf.url("/mcp"), &body)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.body, body.as_bytes());
    let seen = up.seen();
    let methods: Vec<_> = seen.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(
        methods,
        ["POST", "OPTIONS", "POST"],
        "the OPTIONS asked first"
    );
    assert!(seen
        .iter()
        .filter(|s| s.method == "POST")
        .all(|s| s.body == body.as_bytes()));
    assert_eq!(hf.metric(REPLAYS).await, 1.0);
    assert_eq!(holds(&hf, "released").await, 1.0);
}

// 3. Failures after the request may have reached the application: 502, never replayed.

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

// 4. The hold's deadline.

#[tokio::test]
async fn a_hold_that_outlives_its_timeout_gets_503_with_retry_after() {
    // (retry_after mode, retry_after_secs): "fixed" is the value; "observed" with no outage seen
    // yet falls back to it.
    for (mode, secs) in [("fixed", 5u64), ("observed", 4)] {
        let port = Reserved::new();
        let mut raw = holding(&port.url(), 0.3);
        raw.hold.retry_after = mode.into();
        raw.retry_after_secs = secs;
        let hf = Holdfast::start_with(raw).await;
        let start = Instant::now();
        let got = within_secs(5, post_json(&hf.url("/mcp"), &call_body(8))).await;
        let took = start.elapsed();
        assert_eq!(got.status, 503, "{mode}");
        assert!(took >= Duration::from_millis(300), "{mode}: held {took:?}");
        assert_eq!(retry_after(&got), secs, "{mode}");
        assert_eq!(got.header("holdfast-reason"), Some("connect_refused"));
        let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(v["id"], 8, "{mode}: the held body's id is echoed");
        assert_eq!(holds(&hf, "timed_out").await, 1.0, "{mode}");
        assert_eq!(holds(&hf, "released").await, 0.0, "{mode}");
        assert_eq!(hf.metric(HELD).await, 0.0, "{mode}");
        assert_eq!(
            hf.metric(
                "holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}"
            )
            .await,
            1.0,
            "{mode}"
        );
        drop(port);
    }
}

// 5. An observed Retry-After.

#[tokio::test]
async fn observed_retry_after_comes_from_the_last_outage() {
    const HOLD: f64 = 0.5;
    const OUTAGE: Duration = Duration::from_millis(2500);
    let port = Reserved::new();
    let addr = port.addr;
    let mut raw = holding(&port.url(), HOLD);
    raw.hold.retry_after = "observed".into();
    raw.hold.retry_after_min_secs = 1;
    raw.hold.retry_after_max_secs = 30;
    raw.retry_after_secs = 9;
    let hf = Holdfast::start_with(raw).await;

    // A opens the outage and times out: no outage has closed yet, so the fixed fallback.
    let a_sent = Instant::now();
    let a = within_secs(5, post_json(&hf.url("/mcp"), &call_body(1))).await;
    let a_answered = Instant::now();
    assert_eq!(a.status, 503);
    assert_eq!(retry_after(&a), 9, "no history: retry_after_secs");

    // The outage stays open with nobody held. Its length is the subject here, so real time
    // passes; then the application comes back and B, held before dispatch, closes the outage.
    tokio::time::sleep_until((a_sent + OUTAGE).into()).await;
    let up = Upstream::serve(port.listen(), |seen: Seen| async move {
        // No keep-alive: when this upstream goes, holdfast must not hold a pooled connection.
        response(200, &[("connection", "close")], seen.body)
    });
    let b_sent = Instant::now();
    let b = within_secs(10, post_json(&hf.url("/mcp"), &call_body(2))).await;
    let b_answered = Instant::now();
    assert_eq!(b.status, 200);
    assert_eq!(holds(&hf, "released").await, 1.0);
    assert_eq!(
        hf.metric("holdfast_outage_duration_seconds_count").await,
        1.0
    );

    // The upstream goes again; C opens a new outage and times out.
    up.stop().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the port is closed again"
    );
    let c_sent = Instant::now();
    let c = within_secs(5, post_json(&hf.url("/mcp"), &call_body(3))).await;
    let c_answered = Instant::now();
    assert_eq!(c.status, 503);
    assert_eq!(holds(&hf, "timed_out").await, 2.0);

    // The outage began after A was sent and at least HOLD before A's answer; it ended after B
    // was sent and before B's answer. C waited at least HOLD and at most its round trip.
    let hold = Duration::from_secs_f64(HOLD);
    let outage_lo = b_sent.saturating_duration_since(a_answered) + hold;
    let outage_hi = b_answered - a_sent;
    let waited_lo = hold;
    let waited_hi = c_answered - c_sent;
    let ceil = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let lo = ceil(outage_lo.saturating_sub(waited_hi)).clamp(1, 30);
    let hi = ceil(outage_hi.saturating_sub(waited_lo)).clamp(1, 30);
    let got = retry_after(&c);
    eprintln!(
        "observed Retry-After {got} s (bounds {lo}..={hi}; outage {outage_lo:?}..{outage_hi:?})"
    );
    assert!(
        (lo..=hi).contains(&got),
        "Retry-After {got} outside {lo}..={hi}"
    );
    assert_ne!(got, 9, "derived from the outage, not the fallback");
}

// 6. Caps.

#[tokio::test]
async fn a_full_hold_answers_503_at_once_while_the_held_request_waits() {
    let port = Reserved::new();
    let mut raw = holding(&port.url(), LONG_HOLD_SECS);
    raw.hold.max_requests = 1;
    let hf = Holdfast::start_with(raw).await;
    let first = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;

    let second = within_secs(5, post_json(&hf.url("/mcp"), &call_body(2))).await;
    assert_eq!(second.status, 503);
    assert_eq!(second.header("holdfast-reason"), Some("connect_refused"));
    assert!(second.header("retry-after").is_some());
    let v: serde_json::Value = serde_json::from_slice(&second.body).unwrap();
    assert_eq!(v["id"], 2);
    assert_eq!(holds(&hf, "queue_full").await, 1.0);
    assert!(!first.is_finished(), "the first is still held");
    assert_eq!(hf.metric(HELD).await, 1.0);

    let up = Upstream::serve(port.listen(), echo);
    let first = within_secs(10, first).await.unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.body, call_body(1).as_bytes());
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "the rejected request was never sent");
    assert_eq!(seen[0].body, call_body(1).as_bytes());
    assert_eq!(holds(&hf, "released").await, 1.0);
    up.stop().await;
}

#[tokio::test]
async fn held_body_bytes_are_capped() {
    // Each body is 1000 bytes; two fit in 2048 buffered bytes, the third does not.
    let port = Reserved::new();
    let mut raw = holding(&port.url(), LONG_HOLD_SECS);
    raw.hold.max_body_bytes = 1024;
    raw.hold.max_buffered_bytes = 2048;
    let hf = Holdfast::start_with(raw).await;
    let body = |id: u64| {
        let head = call_body(id);
        let pad = 1000 - head.len() - r#","pad":"""#.len();
        let b = format!(
            "{},\"pad\":\"{}\"}}",
            &head[..head.len() - 1],
            "x".repeat(pad)
        );
        assert_eq!(b.len(), 1000);
        b
    };
    let first = spawn_post(hf.url("/mcp"), body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;
    let second = spawn_post(hf.url("/mcp"), body(2));
    hf.metric_until(HELD, |v| v == 2.0).await;

    let third = within_secs(5, post_json(&hf.url("/mcp"), &body(3))).await;
    assert_eq!(third.status, 503);
    assert_eq!(holds(&hf, "queue_full").await, 1.0);
    assert_eq!(hf.metric(HELD).await, 2.0);

    let up = Upstream::serve(port.listen(), echo);
    let (first, second) = within_secs(10, async { (first.await, second.await) }).await;
    assert_eq!(first.unwrap().body, body(1).as_bytes());
    assert_eq!(second.unwrap().body, body(2).as_bytes());
    assert_eq!(up.seen().len(), 2);
    assert_eq!(holds(&hf, "released").await, 2.0);
    up.stop().await;
}

#[tokio::test]
async fn a_body_too_large_to_replay_gets_503_at_once_after_a_route_missing_404() {
    let up = Upstream::route_missing().await;
    let mut raw = holding(&up.url(), LONG_HOLD_SECS);
    raw.hold.max_body_bytes = 1024;
    let hf = Holdfast::start_with(raw).await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"blob":"{}"}}}}"#,
        "b".repeat(4096)
    );
    let got = within_secs(5, post_json(&hf.url("/mcp"), &big)).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("route_missing_404"));
    assert!(got.header("retry-after").is_some());
    // Larger than the kept copy: one line of text, not the JSON-RPC error with the request's id
    // (holdfast no longer has the body to read the id from).
    assert_eq!(
        got.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(
        got.text().ends_with('\n') && got.text().lines().count() == 1,
        "{:?}",
        got.text()
    );
    assert_eq!(holds(&hf, "body_too_large").await, 1.0);
    assert_eq!(holds(&hf, "released").await, 0.0);
    assert_eq!(hf.metric(REPLAYS).await, 0.0);
    assert_eq!(up.seen().len(), 1, "sent once, to the router, never again");
    assert_eq!(up.seen()[0].body, big.as_bytes());

    // A body within the cap meeting the same router is held (and, the router staying, times
    // out on its own; it is not waited for here).
    let small = spawn_post(hf.url("/mcp"), call_body(12));
    hf.metric_until(HELD, |v| v == 1.0).await;
    small.abort();
}

// 7. Cancellation.

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

// 8. Shutdown.

#[tokio::test]
async fn shutdown_answers_held_requests_503_at_once() {
    let port = Reserved::new();
    let mut hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    // A met the refused connection; B arrived during the outage.
    let a = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 1.0).await;
    let b = spawn_post(hf.url("/mcp"), call_body(2));
    hf.metric_until(HELD, |v| v == 2.0).await;

    hf.begin_shutdown();
    // "At once": a third of the hold timeout, which is what they would wait otherwise (and then
    // get the same 503), and still far above what a loaded machine needs.
    const AT_ONCE_SECS: u64 = LONG_HOLD_SECS as u64 / 3;
    let (a, b) = within_secs(AT_ONCE_SECS, async { (a.await.unwrap(), b.await.unwrap()) }).await;
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

// 9. Holding off.

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

// 10. The server's own 404s.

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

// 11. Every method is held.

#[tokio::test]
async fn get_and_delete_are_held_and_replayed() {
    let headers: &[(&str, &str)] = &[
        ("mcp-session-id", "s-123"),
        ("accept", "application/json, text/event-stream"),
    ];
    for method in ["GET", "DELETE"] {
        // Through a refused connection.
        let port = Reserved::new();
        let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
        let url = hf.url("/mcp?x=1");
        let client = tokio::spawn(async move { request(method, &url, headers, "").await });
        hf.metric_until(HELD, |v| v == 1.0).await;
        let up = Upstream::serve(port.listen(), |seen: Seen| async move {
            response(200, &[], seen.method.to_string())
        });
        let got = within_secs(10, client).await.unwrap();
        assert_eq!(got.status, 200, "{method}");
        assert_eq!(got.body, method.as_bytes());
        let seen = up.seen();
        assert_eq!(seen.len(), 1, "{method}");
        assert_eq!(seen[0].method, method);
        assert_eq!(seen[0].uri, "/mcp?x=1");
        assert_eq!(seen[0].headers.get("mcp-session-id").unwrap(), "s-123");
        assert_eq!(hf.metric(REPLAYS).await, 1.0, "{method}");
        up.stop().await;

        // Through a router's route-missing 404.
        let up =
            Upstream::start(router_then_app(1, 404, TRAEFIK_404, "404 page not found\n")).await;
        let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
        let got = within_secs(10, request(method, &hf.url("/mcp"), headers, "")).await;
        assert_eq!(got.status, 200, "{method}");
        let seen = up.seen();
        assert_eq!(seen.len(), 2, "{method}");
        assert!(seen.iter().all(|s| s.method == method));
        assert!(seen
            .iter()
            .all(|s| s.headers.get("mcp-session-id").unwrap() == "s-123"));
        assert_eq!(hf.metric(REPLAYS).await, 1.0, "{method}");
    }
}

// 12. Many held requests.

#[tokio::test]
async fn many_held_requests_are_all_released_and_each_sent_once() {
    const N: usize = 200;
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    let mut clients = JoinSet::new();
    // The first meets the refused connection and opens the outage; the others arrive during it,
    // all at once, and are held before they are sent at all.
    let url = hf.url("/mcp");
    clients.spawn(async move { (0, post_json(&url, &call_body(0)).await) });
    hf.metric_until(HELD, |v| v == 1.0).await;
    for id in 1..N as u64 {
        let url = hf.url("/mcp");
        clients.spawn(async move { (id, post_json(&url, &call_body(id)).await) });
    }
    hf.metric_until(HELD, |v| v == N as f64).await;

    let back = Instant::now();
    let up = Upstream::serve(port.listen(), echo);
    let mut latencies = Vec::with_capacity(N);
    within_secs(30, async {
        while let Some(done) = clients.join_next().await {
            let (id, got) = done.unwrap();
            latencies.push(back.elapsed());
            assert_eq!(got.status, 200, "request {id}: {}", got.text());
            assert_eq!(got.body, call_body(id).as_bytes(), "request {id}");
        }
    })
    .await;
    latencies.sort();
    eprintln!(
        "{N} held requests after the upstream came back: first answered {:?}, median {:?}, last {:?}",
        latencies[0],
        latencies[N / 2],
        latencies[N - 1]
    );

    let mut count: HashMap<Bytes, usize> = HashMap::new();
    for s in up.seen() {
        *count.entry(s.body).or_default() += 1;
    }
    assert_eq!(count.len(), N, "every request reached the application");
    assert!(count.values().all(|&c| c == 1), "each exactly once");
    assert_eq!(holds(&hf, "released").await, N as f64);
    assert_eq!(hf.metric(HELD).await, 0.0);
    assert_eq!(hf.metric(OUTAGES).await, 1.0);
    assert_eq!(
        hf.metric(REPLAYS).await,
        1.0,
        "only the first had been sent before: the others' only attempt is no replay"
    );
    up.stop().await;
}

/// A request the router will never route (here: marked `x-bogus`) must not be the only one ever
/// probed: once it has been probed and re-held, the next probe is someone else's request, which
/// the application answers, and everyone is released while the bogus one still waits.
#[tokio::test]
async fn a_request_the_router_never_routes_does_not_stall_the_others() {
    let up = Upstream::start(|seen: Seen| async move {
        if seen.headers.contains_key("x-bogus") {
            traefik_404()
        } else {
            echo(seen).await
        }
    })
    .await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let bogus = {
        let url = hf.url("/mcp");
        tokio::spawn(async move { request("POST", &url, &[("x-bogus", "1")], "{}").await })
    };
    hf.metric_until(HELD, |v| v == 1.0).await;
    // Everyone else arrives during the outage the bogus request opened, and waits before dispatch.
    let others: Vec<_> = (0..5)
        .map(|i| spawn_post(hf.url("/mcp"), call_body(i)))
        .collect();
    for other in others {
        let got = within_secs(10, other).await.unwrap();
        assert_eq!(got.status, 200, "{}", got.text());
    }
    assert!(
        !bogus.is_finished(),
        "the others were answered while the bogus request is still held"
    );
    bogus.abort();
}

/// The probe is a real request, and a JSON tool call sends its head only when the tool is done:
/// a slow probe must not keep the others held once the backend is back.
#[tokio::test]
async fn a_slow_probe_does_not_hold_back_the_others() {
    let port = Reserved::new();
    let hf = Holdfast::start_with(holding(&port.url(), LONG_HOLD_SECS)).await;
    let slow = {
        let url = hf.url("/mcp");
        tokio::spawn(async move { request("POST", &url, &[("x-slow", "1")], "{}").await })
    };
    hf.metric_until(HELD, |v| v == 1.0).await;
    let fast = spawn_post(hf.url("/mcp"), call_body(1));
    hf.metric_until(HELD, |v| v == 2.0).await;

    // The backend comes back; the slow call (the oldest, so the first probe) runs until the test
    // lets it finish.
    let (finish_slow, slow_may_finish) = tokio::sync::watch::channel(false);
    let up = Upstream::serve(port.listen(), move |seen: Seen| {
        let mut may_finish = slow_may_finish.clone();
        async move {
            if seen.headers.contains_key("x-slow") {
                let _ = may_finish.wait_for(|go| *go).await;
            }
            echo(seen).await
        }
    });
    let got = within_secs(10, fast).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        !slow.is_finished(),
        "the fast call did not wait for the slow probe"
    );
    finish_slow.send(true).unwrap();
    assert_eq!(within_secs(10, slow).await.unwrap().status, 200);
    assert_eq!(up.seen().len(), 2, "each sent exactly once");
    up.stop().await;
}

/// Past the horizon a router's 404s pass through: requests held until then are let go to get
/// theirs, and new ones are not held at all.
#[tokio::test]
async fn past_the_horizon_nobody_waits_for_the_routers_404() {
    let up = Upstream::route_missing().await;
    let mut raw = holding(&up.url(), LONG_HOLD_SECS);
    raw.routes.horizon_secs = 0.5;
    let hf = Holdfast::start_with(raw).await;
    let first = spawn_post(hf.url("/mcp"), call_body(0));
    // Held within the horizon (the horizon is a time bound, so time has to pass): the counter
    // of held route-missing answers, since the gauge may already be back at 0.
    hf.metric_until(
        "holdfast_rewrites_total{reason=\"route_missing_404\",action=\"held\"}",
        |v| v >= 1.0,
    )
    .await;
    let first = within_secs(5, first).await.unwrap();
    assert_eq!(
        first.status, 404,
        "released to get the router's answer past the horizon"
    );
    let later: Vec<_> = (0..10)
        .map(|i| spawn_post(hf.url("/mcp"), call_body(i)))
        .collect();
    for got in later {
        // Well inside the 30 s hold: these were not held.
        let got = within_secs(5, got).await.unwrap();
        assert_eq!(got.status, 404);
        assert_eq!(got.body, "404 page not found\n");
    }
    assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
}

/// A body of unknown length (chunked) reserves what was read, not the whole replay cap: a few
/// small chunked requests must not fill the hold.
#[tokio::test]
async fn chunked_bodies_reserve_what_they_hold_not_the_cap() {
    let port = Reserved::new();
    let mut raw = holding(&port.url(), LONG_HOLD_SECS);
    raw.hold.max_body_bytes = 1024;
    raw.hold.max_buffered_bytes = 2048;
    let hf = Holdfast::start_with(raw).await;
    let mut clients = Vec::new();
    for i in 0..3 {
        let mut s = TcpStream::connect(hf.addr).await.unwrap();
        let body = call_body(i);
        let req = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             transfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            hf.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        clients.push(s);
        hf.metric_until(HELD, |v| v == (i + 1) as f64).await;
    }
    assert_eq!(holds(&hf, "queue_full").await, 0.0);
    let up = Upstream::serve(port.listen(), echo);
    for mut s in clients {
        let head = within_secs(10, read_head(&mut s)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    assert_eq!(up.seen().len(), 3);
    up.stop().await;
}
