//! End to end: rmcp's real client and server with holdfast between them.
//!
//! The client connects to `holdfast.url("/mcp")`; holdfast's upstream is the server's base URL.
//! Each test pins one promise holdfast makes to an MCP client: the conversation is unchanged, the
//! server's own 404 reaches the client (so rmcp re-initializes) when session continuity is off,
//! a missing server is a 503 with `Retry-After` (never a 404, never a connection error), and the
//! same client carries on once the server is back, on its own session (`session.rs` covers
//! session continuity in depth).

use http::{Method, StatusCode};
use rmcp::{
    service::ClientInitializeError, transport::streamable_http_client::StreamableHttpError,
    ServiceError,
};

use crate::support::mcp::{
    call_count, call_echo, connect, is_connection_refused, mcp_post, raw_http, tool_call,
    transport_error, McpServer, RawResponse, SeenRequest,
};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// holdfast in front of `server`: the upstream is the server's base URL, without `/mcp`.
/// Holding is off: these tests pin what a client sees of a 503 (`hold_e2e` covers holding).
async fn holdfast_for(server: &McpServer) -> Holdfast {
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.hold.enabled = false;
    Holdfast::start_with(raw).await
}

/// The `Retry-After` holdfast puts on its 503s by default.
fn default_retry_after() -> String {
    holdfast::config::defaults::RETRY_AFTER_SECS.to_string()
}

/// `(JSON-RPC method or "-", status)` of every POST the server saw, in order.
fn post_summary(server: &McpServer) -> Vec<(String, u16)> {
    server
        .seen()
        .iter()
        .filter(|r| r.method == Method::POST)
        .map(|r| {
            (
                r.rpc_method.clone().unwrap_or_else(|| "-".into()),
                r.status.as_u16(),
            )
        })
        .collect()
}

fn summary(pairs: &[(&str, u16)]) -> Vec<(String, u16)> {
    pairs.iter().map(|(m, s)| (m.to_string(), *s)).collect()
}

/// How many 404s the server has sent so far (any method).
fn server_404s(server: &McpServer) -> usize {
    server
        .seen()
        .iter()
        .filter(|r| r.status == StatusCode::NOT_FOUND)
        .count()
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

/// The raw response with its `date` value masked: the only bytes allowed to differ between two
/// answers of the same server.
fn masked(response: &RawResponse) -> String {
    let text = String::from_utf8_lossy(&response.raw).into_owned();
    match response.header("date") {
        Some(date) => text.replace(date, "<date>"),
        None => text,
    }
}

/// A `tools/list` request body.
const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

/// Headers holdfast adds to every forwarded request.
const FORWARDED: [&str; 3] = ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"];

#[tokio::test]
async fn initialize_list_and_call_tools_through_holdfast() {
    let server = McpServer::start().await;
    let holdfast = holdfast_for(&server).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect through holdfast");

    let mut tools: Vec<String> = within(client.list_all_tools())
        .await
        .expect("list tools")
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    tools.sort();
    assert_eq!(tools, ["count", "echo", "lookup", "put", "record", "wait"]);
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    assert_eq!(
        within(call_echo(&client, "through holdfast"))
            .await
            .expect("echo"),
        "through holdfast"
    );
    assert_eq!(server.calls(), 2);
    assert_eq!(
        post_summary(&server),
        summary(&[
            ("initialize", 200),
            ("notifications/initialized", 202),
            ("tools/list", 200),
            ("tools/call", 200),
            ("tools/call", 200),
            ("tools/call", 200),
        ])
    );

    // What the server saw: the session id it assigned (which reached the client only through
    // holdfast) comes back on every later request, with the negotiated protocol version; the
    // client's Host is preserved; holdfast says who the client was.
    let seen = server.seen();
    let session = seen[0].assigned_session.clone().expect("a session id");
    let proxy_host = holdfast.addr.to_string();
    for (i, request) in seen.iter().enumerate() {
        assert_eq!(request.header("host"), Some(proxy_host.as_str()), "{i}");
        assert_eq!(request.header("x-forwarded-for"), Some("127.0.0.1"), "{i}");
        assert_eq!(request.header("x-forwarded-proto"), Some("http"), "{i}");
        assert_eq!(
            request.header("x-forwarded-host"),
            Some(proxy_host.as_str()),
            "{i}"
        );
        if i == 0 {
            assert_eq!(request.session_id(), None);
            assert_eq!(request.header("mcp-protocol-version"), None);
        } else {
            assert_eq!(request.session_id(), Some(session.as_str()), "{i}");
            assert_eq!(request.header("mcp-protocol-version"), Some("2025-11-25"));
        }
    }

    // Header for header, a tools/call through holdfast is what the same client sends directly,
    // plus X-Forwarded-*: nothing rmcp sends is lost or altered on the way.
    let direct_server = McpServer::start().await;
    let direct = within(connect(&direct_server.url()))
        .await
        .expect("connect directly");
    within(call_count(&direct)).await.expect("direct count");
    let direct_call = direct_server
        .seen()
        .into_iter()
        .find(tool_call)
        .expect("direct tools/call");
    let proxied_call = seen.iter().find(|r| tool_call(r)).expect("tools/call");
    let names = |r: &SeenRequest| {
        let mut names: Vec<String> = r
            .headers
            .keys()
            .map(|n| n.as_str().to_owned())
            .filter(|n| !FORWARDED.contains(&n.as_str()))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(proxied_call), names(&direct_call));
    for (name, value) in &direct_call.headers {
        if ["host", "mcp-session-id", "content-length"].contains(&name.as_str()) {
            continue;
        }
        assert_eq!(
            proxied_call
                .headers
                .get_all(name)
                .iter()
                .collect::<Vec<_>>(),
            vec![value],
            "{name}"
        );
    }
    within(direct.cancel()).await.expect("close direct");

    // The standalone GET stream runs through holdfast, counted while it lives.
    let get = within(server.wait_for_request(|r| r.method == Method::GET)).await;
    assert_eq!(get.status, StatusCode::OK);
    assert_eq!(get.session_id(), Some(session.as_str()));
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v >= 1.0)
        .await;

    // Closing DELETEs the session through holdfast, and the client's streams end with it.
    within(client.cancel()).await.expect("close");
    let delete = server
        .seen()
        .into_iter()
        .find(|r| r.method == Method::DELETE)
        .expect("a DELETE on close");
    assert_eq!(delete.session_id(), Some(session.as_str()));
    assert_eq!(delete.status, StatusCode::ACCEPTED);
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v == 0.0)
        .await;
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 0.0);

    // Every POST is counted once, by the method the server saw in it.
    for (method, count) in [
        ("initialize", 1.0),
        ("notifications/initialized", 1.0),
        ("tools/list", 1.0),
        ("tools/call", 3.0),
        ("ping", 0.0),
        ("other", 0.0),
    ] {
        let series = format!("holdfast_mcp_requests_total{{method=\"{method}\"}}");
        assert_eq!(holdfast.metric(&series).await, count, "{series}");
    }
}

#[tokio::test]
async fn mcp_methods_are_counted_by_header_or_body_and_folded_into_a_bounded_set() {
    let server = McpServer::start().await;
    let holdfast = holdfast_for(&server).await;
    let host = holdfast.addr.to_string();
    let post = |extra: &str, body: &str| {
        let mut request = mcp_post(&host, None, body);
        // An extra header line right after the request line.
        let at = request.iter().position(|&b| b == b'\n').unwrap() + 1;
        request.splice(at..at, extra.bytes());
        request
    };
    let bodies = [
        // The 2026-07-28 header names the method: the body is not read.
        (
            "mcp-method: ping\r\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        ),
        // A method the spec does not name, a response, a batch: `other`, never a new label.
        (
            "",
            r#"{"jsonrpc":"2.0","id":2,"method":"vendor/private-thing"}"#,
        ),
        ("", r#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
        ("", r#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#),
        // The top-level method, not a tool argument's.
        (
            "",
            r#"{"params":{"arguments":{"method":"ping"}},"jsonrpc":"2.0","id":5,"method":"prompts/list"}"#,
        ),
    ];
    for (extra, body) in bodies {
        within(raw_http(holdfast.addr, &post(extra, body)))
            .await
            .expect("an answer");
    }
    let metrics = holdfast.metrics().await;
    for (method, count) in [
        ("ping", 1.0),
        ("tools/list", 0.0),
        ("other", 3.0),
        ("prompts/list", 1.0),
    ] {
        let series = format!("holdfast_mcp_requests_total{{method=\"{method}\"}}");
        assert_eq!(
            crate::support::proxy::metric_value(&metrics, &series),
            count,
            "{series}"
        );
    }
    assert!(!metrics.contains("vendor"), "{metrics}");
}

#[tokio::test]
async fn with_resume_off_the_servers_own_404_reaches_the_client_and_rmcp_reinitializes() {
    let server = McpServer::start().await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.hold.enabled = false;
    raw.sessions.resume = false;
    let holdfast = Holdfast::start_with(raw).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    let old_session = server.seen()[0].assigned_session.clone().expect("session");

    server.clear_sessions().await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    assert_eq!(server.calls(), 2);

    // The server answered the old session with its own 404, which holdfast passed through:
    // otherwise rmcp would not have re-initialized.
    assert_eq!(
        post_summary(&server),
        summary(&[
            ("initialize", 200),
            ("notifications/initialized", 202),
            ("tools/call", 200),
            ("tools/call", 404),
            ("initialize", 200),
            ("notifications/initialized", 202),
            ("tools/call", 200),
        ])
    );
    let expired = server
        .seen()
        .into_iter()
        .find(|r| tool_call(r) && r.status == StatusCode::NOT_FOUND)
        .expect("the 404");
    assert_eq!(expired.session_id(), Some(old_session.as_str()));

    // Counted as the application's 404, never as a rewrite. The closed session's GET stream may
    // also resume and meet a 404, so the count lies between the one POST 404 and every 404 the
    // server has sent (read after the metric, so it can only be larger).
    let passthrough = holdfast.metric("holdfast_passthrough_404_total").await;
    assert!(
        passthrough >= 1.0 && passthrough <= server_404s(&server) as f64,
        "passthrough_404 {passthrough}, server 404s {}",
        server_404s(&server)
    );
    assert_eq!(
        holdfast
            .metric("holdfast_requests_total{method=\"POST\",status=\"404\"}")
            .await,
        1.0
    );
    assert_eq!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}")
            .await,
        0.0
    );
    assert_eq!(holdfast.metric("holdfast_upstream_up").await, 1.0);

    // Byte for byte: rmcp's 404 for an unknown session, through holdfast and directly, differ
    // only in the date. No content type, plain text body.
    let proxy_host = holdfast.addr.to_string();
    let through = within(raw_http(
        holdfast.addr,
        &mcp_post(&proxy_host, Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST through holdfast");
    let direct = within(raw_http(
        server.addr(),
        &mcp_post(&server.addr().to_string(), Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST direct");
    assert_eq!(through.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(through.header("content-type"), None);
    assert_eq!(through.body, b"Not Found: Session not found");
    assert_eq!(masked(&through), masked(&direct));

    // The same for the GET that resumes a stream.
    let get = |host: &str| {
        format!(
            "GET /mcp HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\
             mcp-session-id: bogus\r\nlast-event-id: 0\r\n\r\n"
        )
    };
    let through = within(raw_http(holdfast.addr, get(&proxy_host).as_bytes()))
        .await
        .expect("raw GET through holdfast");
    let direct = within(raw_http(
        server.addr(),
        get(&server.addr().to_string()).as_bytes(),
    ))
    .await
    .expect("raw GET direct");
    assert_eq!(through.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(masked(&through), masked(&direct));

    within(client.cancel()).await.expect("close");
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
