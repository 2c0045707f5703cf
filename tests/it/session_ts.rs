//! Session continuity with the official TypeScript SDK client, the one most desktop MCP hosts
//! embed. It opens one session and never starts another by itself: after the server forgets the
//! session (a restart), every call on it fails unless holdfast re-establishes it upstream.
//!
//! The client ([`PeerClient`]) is the SDK's `Client` + `StreamableHTTPClientTransport` in a `node`
//! process; the servers are rmcp's stateful server ([`McpServer`]) and the SDK's own stateful
//! server ([`TsServer`], sessions in a map, the SDK's 404 for an unknown one). Each test checks
//! what a user would: every call succeeds, each ran exactly once, in order, and the client kept
//! the one session id it was given.

use serde_json::json;

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::mcp::{mcp_post, raw_http, McpServer};
use crate::support::node::TsServer;
use crate::support::proxy::Holdfast;
use crate::support::within;

/// `holdfast_session_resumes_total{outcome}`.
fn resumes(outcome: &str) -> String {
    format!("holdfast_session_resumes_total{{outcome=\"{outcome}\"}}")
}

/// A TypeScript SDK server recording into a fresh temporary directory (kept alive by the caller).
async fn ts_server(dir: &TempDir) -> TsServer {
    let (ledger, levels) = (dir.path().join("ledger"), dir.path().join("levels"));
    TsServer::start(crate::support::ports::quiet(), &ledger, &levels).await
}

/// The session id the client was given at `initialize`.
fn initial_session(client: &PeerClient) -> String {
    client
        .session_id()
        .expect("a stateful server gives a session id")
        .to_owned()
}

#[tokio::test]
async fn ts_client_keeps_its_session_across_an_rmcp_server_restart() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = initial_session(&client);

    client.count_from(&session, 0, 3).await;
    within(server.restart()).await;
    client.count_from(&session, 3, 3).await;

    assert_eq!(server.calls(), 6, "each call ran exactly once");
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 0.0);
    client.close().await.expect("DELETE the session");
}

#[tokio::test]
async fn ts_client_keeps_its_session_across_a_ts_server_restart() {
    let dir = TempDir::new("session-ts");
    let mut server = ts_server(&dir).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = initial_session(&client);

    client.count_from(&session, 0, 3).await;
    assert_eq!(
        client.call("echo", json!({ "text": "before" })).await,
        Ok("before".to_owned())
    );
    server.restart().await;
    client.count_from(&session, 3, 3).await;
    assert_eq!(
        client.call("echo", json!({ "text": "after" })).await,
        Ok("after".to_owned())
    );

    assert_eq!(
        server.ledger_lines(),
        6,
        "each call ran exactly once; server trace:\n{}",
        server.trace()
    );
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 0.0);
    client.close().await.expect("DELETE the session");
}

#[tokio::test]
async fn thirty_calls_with_a_restart_and_a_call_held_through_it_all_succeed() {
    const CALLS: u64 = 30;
    // The call issued while the server is down.
    const HELD: u64 = 16;
    let dir = TempDir::new("session-ts");
    let mut server = ts_server(&dir).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = initial_session(&client);

    client.count_from(&session, 0, HELD - 1).await;
    server.stop().await;
    client.send(json!({ "op": "call", "tool": "count" }));
    // The call meets a refused connection and waits in the hold. It is the first request held:
    // the client's GET stream, cut by the stop, reconnects only after the SDK's initial
    // reconnection delay (1 s).
    holdfast
        .metric_until("holdfast_held_requests", |held| held >= 1.0)
        .await;
    server.start_again().await;
    assert_eq!(
        client.result().await,
        Ok(HELD.to_string()),
        "the held call; client trace:\n{}",
        client.trace()
    );
    assert_eq!(client.session_id(), Some(session.as_str()));
    client.count_from(&session, HELD, CALLS - HELD).await;

    assert_eq!(
        server.ledger_lines(),
        CALLS as usize,
        "each call ran exactly once; server trace:\n{}",
        server.trace()
    );
    client.close().await.expect("DELETE the session");
}

#[tokio::test]
async fn a_log_level_set_before_a_restart_is_set_again_after_it() {
    let dir = TempDir::new("session-ts");
    let mut server = ts_server(&dir).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = initial_session(&client);

    client.set_level("debug").await.expect("setLevel");
    client.count_from(&session, 0, 1).await;
    assert_eq!(server.levels(), ["setLevel debug"]);

    server.restart().await;
    // The first call after the restart finds the session forgotten; re-establishing it sets the
    // level again before the call runs.
    client.count_from(&session, 1, 1).await;
    assert_eq!(
        server.levels(),
        ["setLevel debug", "setLevel debug"],
        "server trace:\n{}",
        server.trace()
    );
    client.close().await.expect("DELETE the session");
}

/// The control: the same client straight to the server loses its session at the first restart
/// and never recovers, which is the failure holdfast exists to prevent (and proves these tests
/// can fail).
#[tokio::test]
async fn without_holdfast_the_ts_client_loses_its_session_for_good() {
    let dir = TempDir::new("session-ts");
    let mut server = ts_server(&dir).await;
    let mut client = PeerClient::start(&server.url()).await;
    let session = initial_session(&client);
    client.count_from(&session, 0, 1).await;

    server.restart().await;
    for _ in 0..2 {
        let error = client
            .count()
            .await
            .expect_err("the server forgot the session");
        assert!(
            error.contains("Session not found"),
            "{error}; trace:\n{}",
            client.trace()
        );
        assert_eq!(
            client.session_id(),
            Some(session.as_str()),
            "never re-initialized"
        );
    }
    assert_eq!(server.ledger_lines(), 1, "no failed call ran");
}

/// The TypeScript server answers a session it does not know exactly as the SDK's transport does,
/// so the 404 holdfast meets after a restart is the real one.
#[tokio::test]
async fn the_ts_server_answers_an_unknown_session_with_the_sdks_404() {
    let dir = TempDir::new("session-ts");
    let server = ts_server(&dir).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let request = mcp_post(&server.addr().to_string(), Some("forgotten"), body);
    let response = within(raw_http(server.addr(), &request))
        .await
        .expect("raw request");
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}"#
    );
}
