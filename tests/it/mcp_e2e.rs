//! End to end: rmcp's real client and server with holdfast between them.
//!
//! The client connects to `holdfast.url("/mcp")`; holdfast's upstream is the server's base URL.
//! Each test pins one promise holdfast makes to an MCP client: the conversation is unchanged, and
//! the server's own 404 reaches the client (so rmcp re-initializes) when session continuity is
//! off. `mcp_e2e_outage.rs` pins the others: a missing server is a 503 with `Retry-After` (never
//! a 404, never a connection error), and the same client carries on once the server is back, on
//! its own session (`session.rs` covers session continuity in depth).

use http::{Method, StatusCode};

use crate::support::mcp::{
    call_count, call_echo, connect, mcp_post, raw_http, tool_call, McpServer, RawResponse,
    SeenRequest,
};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// holdfast in front of `server`: the upstream is the server's base URL, without `/mcp`.
/// Holding is off: these tests pin what a client sees of a 503 (`hold_e2e` covers holding).
pub(crate) async fn holdfast_for(server: &McpServer) -> Holdfast {
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.hold.enabled = false;
    Holdfast::start_with(raw).await
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

/// Headers holdfast adds to every forwarded request (the request id when the client sent none).
const FORWARDED: [&str; 4] = [
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-request-id",
];

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
