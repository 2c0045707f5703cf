//! A terminating holdfast hands what never reached a server to a peer (`[peers]`): the peer's
//! answer reaches the client, the call runs once, a hand-off is never handed on, a holdfast that
//! finds itself in the list skips to the next peer, and the session goes with the call.

use crate::session::{count_call, open_session, result_text, send};
use crate::support::forgetful::ForgetfulServer;
use crate::support::hold::{call_body, holding, spawn_post, HELD, LONG_HOLD_SECS};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::support::http::{call, echo, get, Reserved, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::within;

/// `holdfast_handoffs_total{outcome}`.
fn handoffs(outcome: &str) -> String {
    format!("holdfast_handoffs_total{{outcome=\"{outcome}\"}}")
}

#[tokio::test]
async fn a_held_request_goes_to_a_peer_at_shutdown_and_runs_once() {
    // The peer: its upstream serves.
    let served = Upstream::start(echo).await;
    let peer = Holdfast::start(&served.url()).await;
    // The terminating one: its upstream is gone (its pod's server stopped with it).
    let gone = Reserved::new();
    let mut raw = holding(&gone.url(), LONG_HOLD_SECS);
    raw.shutdown.drain_timeout_secs = 25.0;
    raw.peers.urls = vec![format!("http://{}", peer.addr)];
    let mut leaving = Holdfast::start_with(raw).await;

    let call = spawn_post(leaving.url("/mcp"), call_body(1));
    leaving.metric_until(HELD, |n| n == 1.0).await;
    leaving.begin_shutdown();
    let got = within(call).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.body, call_body(1).as_bytes());
    let seen = served.seen();
    assert_eq!(seen.len(), 1, "ran once, at the peer");
    assert_eq!(
        seen[0].header("holdfast-handoff"),
        None,
        "the peer's upstream never sees the mark"
    );
    assert_eq!(
        peer.metric("holdfast_requests_total{method=\"POST\",status=\"200\"}")
            .await,
        1.0
    );
    within(leaving.wait()).await;
}

/// `peers.dns` as a headless Service is used: the name resolved at the hand-off, each address a
/// peer (`localhost` is 127.0.0.1 and, where it is configured, ::1, where nothing listens: that
/// one is skipped as unreachable).
#[tokio::test]
async fn a_held_request_goes_to_a_peer_found_by_its_dns_name() {
    let served = Upstream::start(echo).await;
    let peer = Holdfast::start(&served.url()).await;
    let gone = Reserved::new();
    let mut raw = holding(&gone.url(), LONG_HOLD_SECS);
    raw.shutdown.drain_timeout_secs = 25.0;
    raw.peers.dns = format!("localhost:{}", peer.addr.port());
    let mut leaving = Holdfast::start_with(raw).await;

    let call = spawn_post(leaving.url("/mcp"), call_body(1));
    leaving.metric_until(HELD, |n| n == 1.0).await;
    leaving.begin_shutdown();
    let got = within(call).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(served.seen().len(), 1, "ran once, at the peer");
    within(leaving.wait()).await;
}

#[tokio::test]
async fn a_holdfast_skips_itself_in_the_list_and_a_hand_off_is_never_handed_on() {
    // Both upstreams gone: the request goes from `a` to `b` (skipping `a` itself, named first in
    // the same list every replica has), is held at `b`, and at `b`'s own shutdown gets its 503
    // there instead of going back.
    let (gone_a, gone_b) = (Reserved::new(), Reserved::new());
    let listen = |r: &Reserved| {
        let mut raw = holding(&r.url(), LONG_HOLD_SECS);
        raw.shutdown.drain_timeout_secs = 0.5;
        raw
    };
    let mut b = Holdfast::start_with(listen(&gone_b)).await;
    let mut raw_a = listen(&gone_a);
    raw_a.shutdown.drain_timeout_secs = 25.0;
    // `a`'s address is known only once it listens: a first holdfast names `b` alone, then a
    // reload gives the full list, itself first.
    raw_a.peers.urls = vec![format!("http://{}", b.addr)];
    let mut a = Holdfast::start_with(raw_a.clone()).await;
    raw_a.peers.urls = vec![format!("http://{}", a.addr), format!("http://{}", b.addr)];
    a.reload(raw_a).await;

    let call = spawn_post(a.url("/mcp"), call_body(1));
    a.metric_until(HELD, |n| n == 1.0).await;
    a.begin_shutdown();
    // `a` no longer accepts (its drain began): its own entry is skipped as a peer that cannot
    // be reached, and `b` holds the call.
    b.metric_until(HELD, |n| n == 1.0).await;
    b.begin_shutdown();
    let got = within(call).await.unwrap();
    assert_eq!(got.status, 503, "b's, not handed back: {}", got.text());
    within(b.wait()).await;
    within(a.wait()).await;
}

/// A hand-off that reaches its own sender (a relay in front of the replicas with a pooled
/// connection to it, a list naming an address that leads back) is refused with a 421 its sender
/// knows, and never reaches the upstream; another holdfast's is taken, the mark stripped.
#[tokio::test]
async fn a_holdfast_refuses_its_own_hand_off_with_a_421() {
    let served = Upstream::start(echo).await;
    let proxy = Holdfast::start(&served.url()).await;
    let got = get(&format!("http://{}/status", proxy.admin)).await;
    let status: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    let me = status["instance"]
        .as_str()
        .expect("/status names the instance");
    assert_eq!(me.len(), 16, "{status}");
    let post = |mark: &str, body: String| {
        Request::post(proxy.url("/mcp"))
            .header("host", proxy.addr.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("holdfast-handoff", mark)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };

    let own = call(post(me, call_body(1))).await;
    assert_eq!(own.status, 421, "{}", own.text());
    assert_eq!(own.header("holdfast-reason"), Some("handoff_self"));
    assert!(
        served.seen().is_empty(),
        "its own hand-off never goes upstream"
    );

    let other = call(post("0123456789abcdef", call_body(2))).await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(served.seen().len(), 1);
    assert_eq!(served.seen()[0].header("holdfast-handoff"), None);
}

#[tokio::test]
async fn a_session_moves_with_its_hand_off() {
    // Two replicas sharing a key and one server each; the client's session was opened at the
    // leaving one, whose server is gone when the call comes.
    let dir = crate::support::files::TempDir::new("handoff-session");
    let keys = dir.write("keys", &format!("{}\n", crate::session_replicas::KEY_A));
    let peer_server = ForgetfulServer::start().await;
    let mut raw = holding(&peer_server.upstream.url(), LONG_HOLD_SECS);
    raw.sessions.key_file = Some(keys.clone());
    let peer = Holdfast::start_with(raw).await;

    let leaving_server = ForgetfulServer::start().await;
    let mut raw = holding(&leaving_server.upstream.url(), LONG_HOLD_SECS);
    raw.sessions.key_file = Some(keys);
    raw.shutdown.drain_timeout_secs = 25.0;
    raw.peers.urls = vec![format!("http://{}", peer.addr)];
    let mut leaving = Holdfast::start_with(raw).await;
    let id = open_session(&leaving).await;
    let first = send(&leaving, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&first), "1");

    // The leaving pod's server goes; the next call is held, then handed over at shutdown.
    drop(leaving_server);
    let call = tokio::spawn({
        let id = id.clone();
        let addr = leaving.addr;
        async move {
            crate::support::mcp::raw_http(
                addr,
                format!(
                    "POST /mcp HTTP/1.1\r\nhost: {addr}\r\naccept: application/json, text/event-stream\r\n\
                     content-type: application/json\r\nmcp-session-id: {id}\r\n\
                     mcp-protocol-version: 2025-06-18\r\ncontent-length: {}\r\n\r\n{}",
                    count_call(2).len(),
                    count_call(2)
                )
                .as_bytes(),
            )
            .await
            .expect("raw request")
        }
    });
    leaving.metric_until(HELD, |n| n == 1.0).await;
    leaving.begin_shutdown();
    let got = within(call).await.unwrap();
    assert_eq!(got.status_line, "HTTP/1.1 200 OK", "{got:?}");
    assert_eq!(result_text(&got), "1", "run once, at the peer's server");
    assert_eq!(
        got.header("mcp-session-id"),
        Some(id.as_str()),
        "the client's own id"
    );
    assert_eq!(
        peer_server.opened(),
        1,
        "the peer carried the session from its token"
    );
    assert_eq!(
        peer.metric(&handoffs("answered")).await,
        0.0,
        "the peer handed nothing"
    );
    within(leaving.wait()).await;
}
