//! Many held requests: all released and each sent once, and the probe that releases them (a
//! request the router never routes, a slow probe, the horizon past which nobody waits).
//!
//! Through a real holdfast in front of an upstream that goes away and comes back on the same port
//! (`support::hold` says how, and why nothing waits a fixed time).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::support::hold::{
    call_body, holding, holds, request, spawn_post, HELD, LONG_HOLD_SECS, OUTAGES, REPLAYS,
};
use crate::support::http::{echo, post_json, traefik_404, Reserved, Seen, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::within_secs;

// Many held requests.

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
