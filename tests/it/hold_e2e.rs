//! End to end: hold and replay, with rmcp's real client calling `count` in a tight loop through
//! holdfast while the backend goes missing and comes back.
//!
//! Each test pins the promise of holding: a caller sees no failed call and no 503 across a short
//! outage, and every call runs exactly once (the server's counter equals the client's successful
//! calls, and the values come back 1, 2, 3, ...). The outages are the two kinds holdfast holds
//! through: nothing listening (a stopped server, restarted on the same port), and a router that
//! answers Traefik's route-missing 404 by itself (an in-process fake router). The last test pins
//! the other side: the server's own 404s are never held.
//!
//! Timings are printed (`cargo test --test it hold_e2e -- --nocapture`) as `hold_e2e timing:`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rmcp::service::Peer;
use rmcp::RoleClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::mcp::{call_count, connect, mcp_post, raw_http, McpServer};
use crate::support::proxy::{metric_value, requests_with_status, Holdfast, HOLD_OUTCOMES};
use crate::support::router::{FakeRouter, Routed};
use crate::support::{within, LIMIT};

/// How long each outage lasts: long enough for the prober's backoff to reach its cap.
const OUTAGE: Duration = Duration::from_secs(1);

/// Successful calls before the outage starts.
const CALLS_BEFORE: u64 = 5;
/// Successful calls after the held one, so the loop is seen running on the far side too.
const CALLS_AFTER: u64 = 5;

/// `holdfast_holds_total` by outcome, for every outcome.
fn holds(metrics: &str) -> Vec<(&'static str, f64)> {
    HOLD_OUTCOMES
        .into_iter()
        .map(|o| {
            let series = format!("holdfast_holds_total{{outcome=\"{o}\"}}");
            (o, metric_value(metrics, &series))
        })
        .collect()
}

/// What holds after any outage held through: the hold is empty, the upstream is up again, and no
/// client saw a 503 or a 502.
fn assert_recovered_without_errors(metrics: &str) {
    assert_eq!(metric_value(metrics, "holdfast_held_requests"), 0.0);
    assert_eq!(metric_value(metrics, "holdfast_upstream_up"), 1.0);
    assert_eq!(requests_with_status(metrics, 503), 0.0, "{metrics}");
    assert_eq!(requests_with_status(metrics, 502), 0.0, "{metrics}");
    for (outcome, n) in holds(metrics) {
        if outcome != "released" {
            assert_eq!(n, 0.0, "holds_total{{outcome={outcome}}}");
        }
    }
}

/// One `count` call made by the loop.
#[derive(Debug)]
struct Call {
    /// The counter value the server returned, or how the call failed.
    result: Result<u64, String>,
    started: Instant,
    finished: Instant,
}

/// rmcp's client calling `count` back to back, in a task, until told to stop.
///
/// Each call runs under `turn`: a test that takes the lock waits for the call in flight to end
/// and keeps the next one from starting, so it can stop the server *between* calls. A call cut
/// off mid-response may have run, so failing it is right; holding is about the calls that meet
/// the gap, and those must not fail.
struct CountLoop {
    stop: Arc<AtomicBool>,
    /// Successful calls so far; closed when the loop ends (a failed call ends it).
    successes: watch::Receiver<u64>,
    turn: Arc<tokio::sync::Mutex<()>>,
    task: JoinHandle<Vec<Call>>,
}

impl CountLoop {
    fn start(peer: Peer<RoleClient>) -> CountLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let (progress, successes) = watch::channel(0u64);
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        let task = tokio::spawn({
            let (stop, turn) = (stop.clone(), turn.clone());
            async move {
                let mut calls = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let _turn = turn.lock().await;
                    let started = Instant::now();
                    // Holds last about a second here; holdfast's own hold timeout is 15 s, so
                    // anything near this limit is a bug, not a slow machine.
                    let result = match tokio::time::timeout(LIMIT, call_count(&peer)).await {
                        Ok(Ok(value)) => Ok(value),
                        Ok(Err(error)) => Err(format!("{error:?}")),
                        Err(_) => Err(format!("no answer within {LIMIT:?}")),
                    };
                    let failed = result.is_err();
                    calls.push(Call {
                        result,
                        started,
                        finished: Instant::now(),
                    });
                    if failed {
                        // Stop at the first failure: it is the test's finding, and rmcp may not
                        // recover from it.
                        break;
                    }
                    progress.send_modify(|n| *n += 1);
                }
                calls
            }
        });
        CountLoop {
            stop,
            successes,
            turn,
            task,
        }
    }

    /// Waits until `n` calls in all have succeeded. Panics with the loop's calls if it ended.
    async fn until(&mut self, n: u64) {
        let reached = within(self.successes.wait_for(|&done| done >= n))
            .await
            .is_ok();
        if !reached {
            let calls = (&mut self.task).await.expect("count loop panicked");
            panic!(
                "the loop stopped before {n} successful calls: {:?}",
                calls.last()
            );
        }
    }

    /// Stops after the call in flight and returns every call made.
    async fn finish(self) -> Vec<Call> {
        self.stop.store(true, Ordering::SeqCst);
        within(self.task).await.expect("count loop panicked")
    }
}

/// Asserts that every call succeeded and the values ran 1, 2, 3, ... without a gap or a repeat
/// (nothing lost, nothing run twice), and that the server counted exactly these calls.
fn assert_each_call_ran_once(calls: &[Call], server: &McpServer) {
    let failed: Vec<_> = calls.iter().filter(|c| c.result.is_err()).collect();
    assert!(failed.is_empty(), "failed calls: {failed:?}");
    let values: Vec<u64> = calls.iter().map(|c| *c.result.as_ref().unwrap()).collect();
    let expected: Vec<u64> = (1..=calls.len() as u64).collect();
    assert_eq!(values, expected);
    assert_eq!(server.calls(), calls.len() as u64);
}

/// The first call that ended after `back` (the moment the backend was reachable again): how long
/// after `back` it ended, and how long it took in all (most of it held).
fn held_call_timing(calls: &[Call], back: Instant) -> (Duration, Duration) {
    let call = calls
        .iter()
        .find(|c| c.finished >= back)
        .expect("a call ended after the backend came back");
    (
        call.finished.saturating_duration_since(back),
        call.finished.saturating_duration_since(call.started),
    )
}

#[tokio::test]
async fn calls_in_a_tight_loop_survive_a_restart_on_the_same_port() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    let mut calls = CountLoop::start(client.peer().clone());
    calls.until(CALLS_BEFORE).await;

    // Stop between two calls. rmcp's SSE GET, cut when the server stops, reconnects at once: it
    // meets the refused connection, opens the outage and waits in the hold. The next call comes
    // during the outage and waits before it is sent at all.
    {
        let _between = within(calls.turn.lock()).await;
        within(server.stop()).await;
        holdfast
            .metric_until("holdfast_held_requests", |v| v == 1.0)
            .await;
    }
    let stopped = Instant::now();
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 2.0)
        .await;
    // The outage itself: a container being recreated.
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    let held_at_restart = *calls.successes.borrow();
    within(server.restart()).await;
    let back = Instant::now();

    calls.until(held_at_restart + CALLS_AFTER).await;
    let calls = calls.finish().await;
    assert_each_call_ran_once(&calls, &server);
    // The loop made no progress while the server was down (each call was held, none failed).
    assert_eq!(
        calls.iter().filter(|c| c.finished < back).count() as u64,
        held_at_restart
    );
    // The held call reached the new server once, with the old session, and got the server's own
    // 404, which holdfast passed through: rmcp re-initialized once and ran the call again.
    let seen = server.seen();
    let expired = seen
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("tools/call"))
        .filter(|r| r.status == StatusCode::NOT_FOUND)
        .count();
    assert_eq!(expired, 1);
    let initializes = seen
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 2);

    let metrics = holdfast.metrics().await;
    assert_eq!(
        metric_value(&metrics, "holdfast_holds_total{outcome=\"released\"}"),
        2.0,
        "the call and the GET, each released once"
    );
    assert_eq!(
        metric_value(&metrics, "holdfast_outages_total"),
        1.0,
        "one outage"
    );
    assert_eq!(
        metric_value(&metrics, "holdfast_replays_total"),
        1.0,
        "the GET met the refused connection; the call came during the outage"
    );
    assert_recovered_without_errors(&metrics);

    let (after_back, held_for) = held_call_timing(&calls, back);
    eprintln!(
        "hold_e2e timing: restart: {} calls; outage {:?}; the held call ended {:?} after the \
         server was back, {:?} after it started; {} holds released, {} replays",
        calls.len(),
        back - stopped,
        after_back,
        held_for,
        metric_value(&metrics, "holdfast_holds_total{outcome=\"released\"}"),
        metric_value(&metrics, "holdfast_replays_total"),
    );
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn calls_in_a_tight_loop_survive_a_routers_404_window() {
    let server = McpServer::start().await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = Holdfast::start(&format!("http://{}", router.addr)).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    let mut calls = CountLoop::start(client.peer().clone());
    calls.until(CALLS_BEFORE).await;

    // The container's route disappears from the router for a while; the server itself (and so
    // the session) lives on. The switch flips whatever the loop is doing: a request is either
    // forwarded whole or answered 404 whole, so no call can be cut off.
    router.missing.store(true, Ordering::SeqCst);
    let opened = Instant::now();
    holdfast
        .metric_until("holdfast_held_requests", |v| v >= 1.0)
        .await;
    tokio::time::sleep(OUTAGE.saturating_sub(opened.elapsed())).await;
    let held_at_close = *calls.successes.borrow();
    router.missing.store(false, Ordering::SeqCst);
    let back = Instant::now();

    calls.until(held_at_close + CALLS_AFTER).await;
    let calls = calls.finish().await;
    assert_each_call_ran_once(&calls, &server);

    // The router's view: every request it answered 404 reached the server exactly once
    // afterwards, byte for byte the same (a replay, not a new request and not a second one).
    let log = router.log();
    let refused: Vec<&Routed> = log.iter().filter(|r| r.answered_404).collect();
    assert!(
        refused
            .iter()
            .any(|r| r.rpc_method().as_deref() == Some("tools/call")),
        "the window caught a call: {refused:?}"
    );
    for (i, r) in log.iter().enumerate().filter(|(_, r)| r.answered_404) {
        let forwarded: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.answered_404 && f.key() == r.key())
            .map(|(j, _)| j)
            .collect();
        assert_eq!(forwarded.len(), 1, "{r:?}");
        assert!(forwarded[0] > i, "forwarded after its 404s: {r:?}");
    }
    // And what the router forwarded is what ran: one tools/call per successful call.
    let forwarded_calls = log
        .iter()
        .filter(|r| !r.answered_404 && r.rpc_method().as_deref() == Some("tools/call"))
        .count();
    assert_eq!(forwarded_calls as u64, server.calls());
    // No call was re-initialized around: the session lived through the window.
    let initializes = log
        .iter()
        .filter(|r| r.rpc_method().as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 1);

    let metrics = holdfast.metrics().await;
    assert_eq!(
        metric_value(&metrics, "holdfast_outages_total"),
        1.0,
        "one outage"
    );
    // Every 404 the router sent was kept from the client: counted as intercepted and held, and
    // each such hold ended in one release and one replay. None became a 503. (The window caught
    // a call: asserted above.)
    let router_404s = log.iter().filter(|r| r.answered_404).count() as f64;
    assert_eq!(
        metric_value(&metrics, "holdfast_holds_total{outcome=\"released\"}"),
        router_404s
    );
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_rewrites_total{reason=\"route_missing_404\",action=\"held\"}"
        ),
        router_404s
    );
    assert_eq!(
        metric_value(&metrics, "holdfast_replays_total"),
        router_404s
    );
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}"
        ),
        0.0
    );
    assert_eq!(
        metric_value(&metrics, "holdfast_passthrough_404_total"),
        0.0
    );
    assert_recovered_without_errors(&metrics);

    let (after_back, held_for) = held_call_timing(&calls, back);
    eprintln!(
        "hold_e2e timing: router 404: {} calls; window {:?}; {} requests answered 404; the held \
         call ended {:?} after the route was back, {:?} after it started; {} replays",
        calls.len(),
        back - opened,
        refused.len(),
        after_back,
        held_for,
        metric_value(&metrics, "holdfast_replays_total"),
    );
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn an_initialize_sent_while_the_server_is_down_is_held_and_connects() {
    let mut server = McpServer::start().await;
    within(server.stop()).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;

    let url = holdfast.url("/mcp");
    let started = Instant::now();
    let connecting = tokio::spawn(async move { connect(&url).await });
    // The initialize met the refused connection and waits in the hold.
    holdfast
        .metric_until("holdfast_held_requests", |v| v >= 1.0)
        .await;
    tokio::time::sleep((OUTAGE / 2).saturating_sub(started.elapsed())).await;
    within(server.restart()).await;
    let back = Instant::now();

    let client = within(connecting)
        .await
        .expect("connect task panicked")
        .expect("connect: the initialize was held and sent once the server was back");
    let connected_after = back.elapsed();
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    assert_eq!(server.calls(), 2);

    // The server saw the initialize once: the refused attempt never reached it.
    let initializes = server
        .seen()
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 1);

    let metrics = holdfast.metrics().await;
    // The initialize, held once (no session yet, so no GET stream), sent a second time.
    assert_eq!(
        metric_value(&metrics, "holdfast_holds_total{outcome=\"released\"}"),
        1.0
    );
    assert_eq!(metric_value(&metrics, "holdfast_outages_total"), 1.0);
    assert_eq!(metric_value(&metrics, "holdfast_replays_total"), 1.0);
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}"
        ),
        0.0
    );
    assert_recovered_without_errors(&metrics);
    eprintln!(
        "hold_e2e timing: initialize: held {:?} in all; connected {:?} after the server was back",
        back.saturating_duration_since(started) + connected_after,
        connected_after,
    );
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn the_servers_own_404s_are_passed_at_once_never_held() {
    let server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);

    // The server forgets the session: the next call meets its own 404 (never held), holdfast
    // re-establishes the session and the call succeeds.
    server.clear_sessions().await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    let expired = server
        .seen()
        .into_iter()
        .filter(|r| r.rpc_method.as_deref() == Some("tools/call"))
        .filter(|r| r.status == StatusCode::NOT_FOUND)
        .count();
    assert_eq!(expired, 1, "the server's own 404, answered at once");

    // rmcp's plain-text 404 (no Content-Type) for an unknown session, on a POST and on the GET
    // that resumes a stream, comes back as the server sent it.
    let host = holdfast.addr.to_string();
    let tools_list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let asked = Instant::now();
    let post = within(raw_http(
        holdfast.addr,
        &mcp_post(&host, Some("bogus"), tools_list),
    ))
    .await
    .expect("raw POST");
    let post_took = asked.elapsed();
    assert_eq!(post.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(post.header("content-type"), None);
    assert_eq!(post.body, b"Not Found: Session not found");
    let get = format!(
        "GET /mcp HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\
         mcp-session-id: bogus\r\nlast-event-id: 0\r\n\r\n"
    );
    let get = within(raw_http(holdfast.addr, get.as_bytes()))
        .await
        .expect("raw GET");
    assert_eq!(get.status_line, "HTTP/1.1 404 Not Found");

    let metrics = holdfast.metrics().await;
    for (outcome, n) in holds(&metrics) {
        assert_eq!(n, 0.0, "holds_total{{outcome={outcome}}}");
    }
    assert_eq!(metric_value(&metrics, "holdfast_outages_total"), 0.0);
    assert_eq!(metric_value(&metrics, "holdfast_replays_total"), 0.0);
    assert_eq!(
        metric_value(&metrics, "holdfast_hold_duration_seconds_count"),
        0.0
    );
    // The two raw requests' 404s; the forgotten session's was not passed but resumed.
    assert_eq!(
        metric_value(&metrics, "holdfast_passthrough_404_total"),
        2.0
    );
    assert_eq!(
        metric_value(
            &metrics,
            "holdfast_session_resumes_total{outcome=\"resumed\"}"
        ),
        1.0
    );
    assert_recovered_without_errors(&metrics);
    eprintln!("hold_e2e timing: own 404: a raw POST's 404 came back in {post_took:?}");
    within(client.cancel()).await.expect("close");
}
