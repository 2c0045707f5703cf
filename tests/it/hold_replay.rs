//! What is held and replayed: a refused request until the upstream is back on the same port, a
//! router's route-missing answer (the body it consumed is replayed byte for byte), every method.
//!
//! Through a real holdfast in front of an upstream that goes away and comes back on the same port
//! (`support::hold` says how, and why nothing waits a fixed time).

use std::time::Instant;

use bytes::Bytes;

use crate::support::hold::{
    assert_never_held, call_body, holding, holds, request, router_then_app, spawn_post, HELD,
    LONG_HOLD_SECS, OUTAGES, REPLAYS,
};
use crate::support::http::TRAEFIK_404_HEADERS as TRAEFIK_404;
use crate::support::http::{echo, post_json, response, Reserved, Seen, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::within_secs;

// Refused, held, the upstream comes back on the same port.

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

// A router's route-missing answer: the body it consumed is replayed byte for byte.

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

// Every method is held.

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
