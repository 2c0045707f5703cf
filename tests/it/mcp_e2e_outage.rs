//! End to end, rmcp's real client and server with holdfast between them, while the server is
//! missing: a missing server is a 503 with `Retry-After` (never a 404, never a connection error),
//! surfaced by rmcp as holdfast's "temporarily unavailable" error, and the same client carries
//! on once the server is back. (The conversation itself: `mcp_e2e.rs`.)

use http::{Method, StatusCode};
use rmcp::{
    service::ClientInitializeError, transport::streamable_http_client::StreamableHttpError,
    ServiceError,
};

use crate::mcp_e2e::holdfast_for;
use crate::support::mcp::{
    call_count, call_echo, connect, is_connection_refused, mcp_post, raw_http, tool_call,
    transport_error, McpServer,
};
use crate::support::within;

/// The `Retry-After` holdfast puts on its 503s by default.
fn default_retry_after() -> String {
    holdfast::config::defaults::RETRY_AFTER_SECS.to_string()
}

/// Asserts that rmcp surfaced holdfast's JSON-RPC 503 body: holdfast answers a single JSON-RPC
/// request with a JSON-RPC error echoing its id (so SDKs show the message), and rmcp 3.11 returns
/// a 5xx whose body is a JSON-RPC error *as that error* rather than as `HttpStatus(503)`.
fn assert_holdfast_unavailable(error: &rmcp::model::ErrorData) {
    assert_eq!(error.code.0, -32000, "{error:?}");
    assert!(
        error.message.contains("temporarily unavailable"),
        "{error:?}"
    );
    let data = error.data.as_ref().expect("error data");
    assert_eq!(data["reason"], "connect_refused", "{error:?}");
    assert_eq!(
        data["retryAfterSeconds"].to_string(),
        default_retry_after(),
        "{error:?}"
    );
}

/// Asserts what holds whichever way rmcp surfaces holdfast's 503: not a refused connection (what
/// the client sees without holdfast) and not an expired session (what a 404 means to it).
fn assert_neither_refused_nor_expired(error: &ServiceError) {
    assert!(!is_connection_refused(error), "{error:?}");
    assert!(
        !matches!(
            transport_error(error),
            Some(StreamableHttpError::SessionExpired)
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_stopped_server_is_a_503_and_the_same_client_goes_on_after_restart() {
    let mut server = McpServer::start().await;
    let holdfast = holdfast_for(&server).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    let old_session = server.seen()[0].assigned_session.clone().expect("session");
    within(server.wait_for_request(|r| r.method == Method::GET)).await;
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v >= 1.0)
        .await;

    within(server.stop()).await;

    // The dying server cut the standalone GET stream; holdfast passed the cut on as an error (not
    // a clean end), so rmcp resumes at once, and gets holdfast's 503.
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v == 0.0)
        .await;
    holdfast
        .metric_until(
            "holdfast_requests_total{method=\"GET\",status=\"503\"}",
            |v| v >= 1.0,
        )
        .await;

    // Each call fails with holdfast's 503 (how rmcp surfaces it is pinned separately, in
    // `a_call_while_stopped_reaches_rmcp_as_http_503_with_retry_after`); the session and the
    // client survive.
    for failed in 1..=2 {
        let error = within(call_count(&client))
            .await
            .expect_err("server is down");
        assert_neither_refused_nor_expired(&error);
        assert_eq!(
            holdfast
                .metric("holdfast_requests_total{method=\"POST\",status=\"503\"}")
                .await,
            f64::from(failed),
            "{error:?}"
        );
    }
    assert!(!client.is_closed());
    assert_eq!(server.calls(), 1, "nothing ran while the server was down");
    assert!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}")
            .await
            >= 3.0,
        "two POSTs and at least one GET"
    );
    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 0.0);
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 0.0);

    // A recreated container: same port, no sessions. The same client's next call meets the new
    // server's real 404 for its old session; holdfast re-establishes the session (the second
    // initialize is holdfast's, with the client's recorded body) and the call succeeds on it.
    within(server.restart()).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    assert_eq!(server.calls(), 2);
    let expired =
        within(server.wait_for_request(|r| tool_call(r) && r.status == StatusCode::NOT_FOUND))
            .await;
    assert_eq!(expired.session_id(), Some(old_session.as_str()));
    let initializes = server
        .seen()
        .into_iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 2);

    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 1.0);
    // rmcp's GET stream and its call may both meet the 404; one of them re-establishes the
    // session, the other finds it done. Neither 404 reaches the client.
    assert_eq!(
        holdfast
            .metric("holdfast_session_resumes_total{outcome=\"resumed\"}")
            .await,
        1.0
    );
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 0.0);
    assert_eq!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}")
            .await,
        0.0
    );
    assert_eq!(
        within(call_echo(&client, "back")).await.expect("echo"),
        "back"
    );
    within(client.cancel()).await.expect("close");
}

/// A call while the server is down fails with holdfast's "temporarily unavailable" JSON-RPC error
/// (code -32000, the reason and the retry hint in `data`), not a refused connection or an
/// expired session.
#[tokio::test]
async fn a_call_while_stopped_reaches_rmcp_as_holdfasts_unavailable_error() {
    let mut server = McpServer::start().await;
    let holdfast = holdfast_for(&server).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    within(server.stop()).await;

    let error = within(call_count(&client))
        .await
        .expect_err("server is down");
    assert_neither_refused_nor_expired(&error);
    match &error {
        ServiceError::McpError(data) => assert_holdfast_unavailable(data),
        other => panic!("expected holdfast's JSON-RPC error, got {other:?}"),
    }
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn a_raw_jsonrpc_request_while_stopped_gets_a_jsonrpc_503_with_its_id() {
    let mut server = McpServer::start().await;
    within(server.stop()).await;
    let holdfast = holdfast_for(&server).await;
    let host = holdfast.addr.to_string();
    let retry_after = default_retry_after();

    for (body, id) in [
        (
            r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"count"}}"#,
            serde_json::json!(42),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"req-7","method":"tools/list"}"#,
            serde_json::json!("req-7"),
        ),
    ] {
        let response = within(raw_http(holdfast.addr, &mcp_post(&host, Some("s-1"), body)))
            .await
            .expect("raw POST");
        assert_eq!(response.status_line, "HTTP/1.1 503 Service Unavailable");
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.header("retry-after"), Some(retry_after.as_str()));
        assert_eq!(response.header("cache-control"), Some("no-store"));
        assert_eq!(response.header("holdfast-reason"), Some("connect_refused"));
        let json: serde_json::Value = serde_json::from_slice(&response.body).expect("a JSON body");
        assert_eq!(json["jsonrpc"], "2.0");
        assert_eq!(json["id"], id);
        assert_eq!(json["error"]["code"], -32000);
        assert_eq!(json["error"]["data"]["reason"], "connect_refused");
    }

    // A notification has no id to echo, and a GET (how rmcp resumes its streams) no body: both
    // get the same 503 as text.
    let notification = within(raw_http(
        holdfast.addr,
        &mcp_post(
            &host,
            Some("s-1"),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
    ))
    .await
    .expect("raw notification");
    let get = format!(
        "GET /mcp HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\
         mcp-session-id: s-1\r\nlast-event-id: 0\r\n\r\n"
    );
    let get = within(raw_http(holdfast.addr, get.as_bytes()))
        .await
        .expect("raw GET");
    for response in [notification, get] {
        assert_eq!(response.status_line, "HTTP/1.1 503 Service Unavailable");
        assert_eq!(
            response.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(response.header("retry-after"), Some(retry_after.as_str()));
        assert_eq!(response.header("cache-control"), Some("no-store"));
        assert_eq!(response.header("holdfast-reason"), Some("connect_refused"));
    }
    assert!(server.seen().is_empty());
    assert_eq!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}")
            .await,
        4.0
    );
}

#[tokio::test]
async fn initialize_while_the_server_is_down_fails_then_connects_once_back() {
    let mut server = McpServer::start().await;
    within(server.stop()).await;
    let holdfast = holdfast_for(&server).await;

    // rmcp gives up on a failed initialize. What matters is what it met: holdfast's 503, not a
    // 404 (which can push an older client onto the legacy SSE transport) and not a refused
    // connection.
    let error = within(connect(&holdfast.url("/mcp")))
        .await
        .expect_err("the server is down");
    // rmcp surfaces holdfast's JSON-RPC 503 body as the initialize's JSON-RPC error: neither a
    // refused connection nor an expired session.
    match &error {
        ClientInitializeError::JsonRpcError(data) => assert_holdfast_unavailable(data),
        other => panic!("expected holdfast's JSON-RPC error on initialize, got {other:?}"),
    }
    // One initialize POST, answered 503, not retried.
    assert_eq!(
        holdfast
            .metric("holdfast_requests_total{method=\"POST\",status=\"503\"}")
            .await,
        1.0
    );
    assert_eq!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}")
            .await,
        1.0
    );

    within(server.restart()).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect once the server is back");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 1.0);
    within(client.cancel()).await.expect("close");
}

/// Like `a_call_while_stopped_reaches_rmcp_as_holdfasts_unavailable_error`, for `connect()`.
#[tokio::test]
async fn initialize_while_stopped_reaches_rmcp_as_holdfasts_unavailable_error() {
    let mut server = McpServer::start().await;
    within(server.stop()).await;
    let holdfast = holdfast_for(&server).await;

    let error = within(connect(&holdfast.url("/mcp")))
        .await
        .expect_err("the server is down");
    match &error {
        ClientInitializeError::JsonRpcError(data) => assert_holdfast_unavailable(data),
        other => panic!("expected holdfast's JSON-RPC error on initialize, got {other:?}"),
    }
}
