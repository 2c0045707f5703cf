//! Request ids (`request_id.header`): passed on when the client sent a usable one, made when it
//! did not, the same on every request holdfast sends for one client request (a replay after a
//! hold, a re-established session's own requests), and in holdfast's own answers, never added
//! to the server's.

use crate::support::forgetful::ForgetfulServer;
use crate::support::hold::{call_body, holding, request, router_then_app, LONG_HOLD_SECS};
use crate::support::http::TRAEFIK_404_HEADERS as TRAEFIK_404;
use crate::support::http::{echo, Reserved, Upstream};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within_secs;

const JSON: (&str, &str) = ("content-type", "application/json");

/// Whether `id` is one holdfast made: 32 lower-case hex digits.
fn is_made(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[tokio::test]
async fn the_clients_id_is_passed_on_a_missing_or_unusable_one_is_made() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&up.url()).await;
    let url = hf.url("/mcp");
    let long = "x".repeat(129);
    let cases: [&[(&str, &str)]; 4] = [
        &[JSON, ("x-request-id", "client-chose-this-1")],
        &[JSON],
        &[JSON, ("x-request-id", "two words")],
        &[JSON, ("x-request-id", long.as_str())],
    ];
    for headers in cases {
        let got = request("POST", &url, headers, &call_body(1)).await;
        assert_eq!(got.status, 200);
        // The server's answer passes as the server sent it: no id added.
        assert_eq!(got.header("x-request-id"), None);
    }
    let seen = up.seen();
    let ids: Vec<&str> = seen
        .iter()
        .map(|s| {
            s.header("x-request-id")
                .expect("every request carries an id")
        })
        .collect();
    assert_eq!(ids[0], "client-chose-this-1");
    for made in &ids[1..] {
        assert!(is_made(made), "{made:?}");
    }
    assert_ne!(ids[1], ids[2]);
    assert!(seen
        .iter()
        .all(|s| s.headers.get_all("x-request-id").iter().count() == 1));
    hf.shutdown().await;
    up.stop().await;
}

#[tokio::test]
async fn a_held_and_replayed_request_keeps_its_id_on_every_attempt() {
    // The router's 404 to the first attempt and to the first probe, then the application.
    let up = Upstream::start(router_then_app(2, 404, TRAEFIK_404, "404 page not found\n")).await;
    let hf = Holdfast::start_with(holding(&up.url(), LONG_HOLD_SECS)).await;
    let made = within_secs(10, request("POST", &hf.url("/mcp"), &[JSON], &call_body(3))).await;
    assert_eq!(made.status, 200);
    let said = [JSON, ("x-request-id", "held-then-replayed")];
    let kept = within_secs(10, request("POST", &hf.url("/mcp"), &said, &call_body(4))).await;
    assert_eq!(kept.status, 200);

    let seen = up.seen();
    let of = |body: String| -> Vec<String> {
        seen.iter()
            .filter(|s| s.body == body.as_bytes())
            .map(|s| s.header("x-request-id").unwrap_or_default().to_owned())
            .collect()
    };
    let first = of(call_body(3));
    assert_eq!(first.len(), 3, "router, router, application: {first:?}");
    assert!(is_made(&first[0]), "{first:?}");
    assert!(first.iter().all(|id| *id == first[0]), "one id: {first:?}");
    assert_eq!(of(call_body(4)), ["held-then-replayed"]);
    hf.shutdown().await;
    up.stop().await;
}

#[tokio::test]
async fn holdfasts_own_answer_names_the_request_in_the_configured_header_and_its_body() {
    let refused = Reserved::new();
    let mut raw = raw_config(&refused.url());
    raw.hold.enabled = false;
    raw.request_id.header = "X-Correlation-ID".into();
    let hf = Holdfast::start_with(raw).await;
    let url = hf.url("/mcp");

    let said = [JSON, ("x-correlation-id", "quote-me-42")];
    let got = request("POST", &url, &said, &call_body(9)).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("x-correlation-id"), Some("quote-me-42"));
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v["id"], 9);
    assert_eq!(v["error"]["data"]["requestId"], "quote-me-42");
    assert_eq!(v["error"]["data"]["reason"], "connect_refused");

    // Not a JSON-RPC request: a text answer, the id in its header, one of holdfast's making.
    let got = request("GET", &url, &[], "").await;
    assert_eq!(got.status, 503);
    assert!(is_made(got.header("x-correlation-id").unwrap()));
    assert_eq!(
        got.header("x-request-id"),
        None,
        "only the configured header"
    );
    hf.shutdown().await;
}

#[tokio::test]
async fn a_re_established_sessions_own_requests_carry_the_id_of_the_request_they_serve() {
    let server = ForgetfulServer::start().await;
    let hf = Holdfast::start(&server.upstream.url()).await;
    let url = hf.url("/mcp");
    let accept = ("accept", "application/json, text/event-stream");
    let init = crate::session::initialize_body("ids");
    let opened = request("POST", &url, &[JSON, accept], &init).await;
    let session = opened
        .header("mcp-session-id")
        .expect("a session")
        .to_owned();
    server.forget();

    let said = [
        JSON,
        accept,
        ("mcp-session-id", session.as_str()),
        ("x-request-id", "carry-me-across"),
    ];
    let got = request("POST", &url, &said, &call_body(5)).await;
    assert_eq!(got.status, 200, "{}", got.text());

    let seen = server.upstream.seen();
    // After the client's initialize: the call (refused: its session is forgotten), whatever
    // holdfast asks to bring the session back (its initialize and initialized, a ping to check),
    // the call again on the new session. Every one of them is the client's request's.
    let after: Vec<(Option<&str>, String)> = seen[1..]
        .iter()
        .map(|s| {
            (
                s.header("x-request-id"),
                String::from_utf8_lossy(&s.body).into_owned(),
            )
        })
        .collect();
    assert!(
        after.iter().all(|(id, _)| *id == Some("carry-me-across")),
        "{after:#?}"
    );
    let has = |what: &str| after.iter().any(|(_, body)| body.contains(what));
    assert!(
        has(r#""method":"initialize""#) && has("notifications/initialized"),
        "{after:#?}"
    );
    assert_eq!(
        after
            .iter()
            .filter(|(_, b)| b.contains("tools/call"))
            .count(),
        2
    );
    hf.shutdown().await;
}

#[tokio::test]
async fn a_reload_changes_the_header_for_new_requests() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&up.url()).await;
    let url = hf.url("/mcp");
    request("POST", &url, &[JSON], &call_body(1)).await;
    let mut raw = raw_config(&up.url());
    raw.request_id.header = "x-trace-id".into();
    hf.reload(raw).await;
    request(
        "POST",
        &url,
        &[JSON, ("x-trace-id", "after")],
        &call_body(2),
    )
    .await;
    let seen = up.seen();
    assert!(is_made(seen[0].header("x-request-id").unwrap()));
    assert_eq!(seen[1].header("x-trace-id"), Some("after"));
    assert_eq!(seen[1].header("x-request-id"), None);
    hf.shutdown().await;
    up.stop().await;
}
