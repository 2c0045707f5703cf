//! rmcp's server and client talking directly, no proxy: what they do is what holdfast must
//! preserve or stand in for. Each test pins one behaviour a proxy depends on.

use http::{Method, StatusCode};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};

use crate::support::mcp::{
    call_count, call_echo, call_wait, connect, connect_with, is_connection_refused, mcp_post,
    raw_http, tool_call, transport_error, McpServer, Mode, Options,
};
use crate::support::within;

/// A `tools/list` request body.
const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

#[tokio::test]
async fn initialize_list_tools_and_count() {
    let server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");

    let info = client.peer_info().expect("initialized");
    assert!(info.capabilities.tools.is_some());

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
    assert_eq!(server.calls(), 2);
    assert_eq!(
        within(call_echo(&client, "hello")).await.expect("echo"),
        "hello"
    );
    assert_eq!(server.session_count().await, 1);

    // The handshake as the server saw it: initialize without a session, answered 200 with an
    // SSE stream and a new session id; everything after carries that id and the negotiated
    // protocol version.
    let seen = server.seen();
    let initialize = &seen[0];
    assert_eq!(initialize.rpc_method.as_deref(), Some("initialize"));
    assert_eq!(initialize.session_id(), None);
    assert_eq!(initialize.status, StatusCode::OK);
    assert_eq!(
        initialize.header("accept"),
        Some("text/event-stream, application/json")
    );
    assert_eq!(initialize.header("content-type"), Some("application/json"));
    let session = initialize.assigned_session.clone().expect("a session id");
    let initialized = &seen[1];
    assert_eq!(
        initialized.rpc_method.as_deref(),
        Some("notifications/initialized")
    );
    assert_eq!(initialized.status, StatusCode::ACCEPTED);
    let call = seen.iter().find(|r| tool_call(r)).expect("a tools/call");
    assert_eq!(call.session_id(), Some(session.as_str()));
    assert_eq!(initialize.header("mcp-protocol-version"), None);
    assert_eq!(call.header("mcp-protocol-version"), Some("2025-11-25"));

    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn stateful_answers_are_sse_and_client_opens_get_stream_and_deletes_on_close() {
    let server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");
    let session = server.seen()[0].assigned_session.clone().expect("session");

    // Right after initialization the client opens the standalone GET stream in the background.
    let get = within(server.wait_for_request(|r| r.method == Method::GET)).await;
    assert_eq!(get.session_id(), Some(session.as_str()));
    assert_eq!(get.status, StatusCode::OK);
    assert_eq!(
        get.header("accept"),
        Some("text/event-stream, application/json")
    );

    // A raw call on the same session shows the response framing: SSE, even for one answer.
    let response = within(raw_http(
        server.addr(),
        &mcp_post(&server.addr().to_string(), Some(&session), TOOLS_LIST),
    ))
    .await
    .expect("raw tools/list");
    assert_eq!(response.status_line, "HTTP/1.1 200 OK");
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let body = String::from_utf8_lossy(&response.body);
    assert!(body.contains("retry: 3000"), "priming event: {body}");
    assert!(body.contains(r#""name":"count""#), "tools in: {body}");

    // Closing the client DELETEs its session before `cancel` returns.
    within(client.cancel()).await.expect("close");
    let delete = server
        .seen()
        .into_iter()
        .find(|r| r.method == Method::DELETE)
        .expect("a DELETE on close");
    assert_eq!(delete.session_id(), Some(session.as_str()));
    assert_eq!(delete.status, StatusCode::ACCEPTED);
    assert_eq!(server.session_count().await, 0);
}

#[tokio::test]
async fn after_clear_sessions_the_client_reinitializes_and_retries_once() {
    let server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    let old_session = server.seen()[0].assigned_session.clone().expect("session");

    server.clear_sessions().await;
    assert_eq!(server.session_count().await, 0);

    // The same client's next call succeeds: rmcp gets the 404, re-runs initialize without a
    // session id, sends notifications/initialized, and retries the call on the new session.
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    assert_eq!(server.calls(), 2);
    assert_eq!(server.session_count().await, 1);

    let posts: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|r| r.method == Method::POST)
        .collect();
    let summary: Vec<_> = posts
        .iter()
        .map(|r| (r.rpc_method.as_deref().unwrap_or("-"), r.status.as_u16()))
        .collect();
    assert_eq!(
        summary,
        [
            ("initialize", 200),
            ("notifications/initialized", 202),
            ("tools/call", 200),
            ("tools/call", 404),
            ("initialize", 200),
            ("notifications/initialized", 202),
            ("tools/call", 200),
        ]
    );
    assert_eq!(posts[3].session_id(), Some(old_session.as_str()));
    assert_eq!(posts[4].session_id(), None);
    let new_session = posts[4].assigned_session.clone().expect("new session");
    assert_ne!(new_session, old_session);
    assert_eq!(posts[6].session_id(), Some(new_session.as_str()));

    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn with_reinit_disabled_a_404_surfaces_as_session_expired() {
    let server = McpServer::start().await;
    let config = StreamableHttpClientTransportConfig::with_uri(server.url())
        .reinit_on_expired_session(false);
    let client = within(connect_with(config)).await.expect("connect");
    server.clear_sessions().await;

    let error = within(call_count(&client)).await.expect_err("404");
    assert!(
        matches!(
            transport_error(&error),
            Some(StreamableHttpError::SessionExpired)
        ),
        "{error:?}"
    );
    assert_eq!(server.calls(), 0);
}

#[tokio::test]
async fn stop_refuses_connections_and_a_restart_serves_old_and_new_clients() {
    let mut server = McpServer::start().await;
    let addr = server.addr();
    let client = within(connect(&server.url())).await.expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);

    within(server.stop()).await;

    // The call fails with the refused connection; the client itself stays usable.
    let error = within(call_count(&client))
        .await
        .expect_err("server is down");
    assert!(is_connection_refused(&error), "{error:?}");
    assert!(matches!(
        transport_error(&error),
        Some(StreamableHttpError::Client(_))
    ));
    let refused = tokio::net::TcpStream::connect(addr)
        .await
        .expect_err("nothing listens");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(!client.is_closed());

    // Same port, same counter, no sessions: a recreated container.
    let restarted = McpServer::start_with(server.options()).await;
    assert_eq!(restarted.addr(), addr);

    // The old client's session is unknown now: it gets the 404, re-initializes, and the call
    // goes through.
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    let expired = within(restarted.wait_for_request(|r| tool_call(r) && r.status == 404)).await;
    assert!(expired.session_id().is_some());

    let fresh = within(connect(&restarted.url())).await.expect("connect");
    assert_eq!(within(call_count(&fresh)).await.expect("count"), 3);
    assert_eq!(restarted.calls(), 3);
    assert_eq!(server.calls(), 3);

    within(client.cancel()).await.expect("close");
    within(fresh.cancel()).await.expect("close");
}

#[tokio::test]
async fn restart_rebinds_the_same_port_with_the_same_counter() {
    let mut server = McpServer::start().await;
    let addr = server.addr();
    let client = within(connect(&server.url())).await.expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);

    within(server.restart()).await;
    assert_eq!(server.addr(), addr);
    assert_eq!(server.session_count().await, 0);
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);

    // `start_on` takes the port again but starts counting afresh.
    within(server.stop()).await;
    let other = McpServer::start_on(addr).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(other.calls(), 1);
    assert_eq!(server.calls(), 2);
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn a_503_fails_only_that_call_and_keeps_retry_after() {
    let server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");

    server.fail_next_posts(1, StatusCode::SERVICE_UNAVAILABLE, Some("5"));
    let error = within(call_count(&client)).await.expect_err("503");
    match transport_error(&error) {
        Some(StreamableHttpError::HttpStatus(status)) => {
            assert_eq!(status.status, 503);
            assert_eq!(status.retry_after.as_deref(), Some("5"));
        }
        other => panic!("expected HttpStatus, got {other:?} from {error:?}"),
    }
    // Not retried: exactly one POST was injected and the tool never ran.
    assert_eq!(server.seen().iter().filter(|r| r.injected).count(), 1);
    assert_eq!(server.calls(), 0);

    // The session survives; the next call is an ordinary one.
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(server.seen().iter().filter(|r| tool_call(r)).count(), 2);
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn a_503_on_initialize_fails_the_connect() {
    let server = McpServer::start().await;
    server.fail_next_posts(1, StatusCode::SERVICE_UNAVAILABLE, None);
    within(connect(&server.url()))
        .await
        .expect_err("503 on initialize");
    assert_eq!(server.seen().len(), 1, "no retry of the initialize");
}

#[tokio::test]
async fn unknown_session_gets_rmcps_exact_404() {
    let server = McpServer::start().await;
    let host = server.addr().to_string();

    let response = within(raw_http(
        server.addr(),
        &mcp_post(&host, Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST");
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(response.header_names(), ["content-length", "date"]);
    assert_eq!(response.header("content-length"), Some("28"));
    assert_eq!(response.body, b"Not Found: Session not found");
    // The whole answer, with only the date varying.
    let date = response.header("date").expect("date");
    let expected = format!(
        "HTTP/1.1 404 Not Found\r\ncontent-length: 28\r\ndate: {date}\r\n\r\n\
         Not Found: Session not found"
    );
    assert_eq!(String::from_utf8_lossy(&response.raw), expected);

    // GET with an unknown session: the same 404.
    let get = format!(
        "GET /mcp HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\
         mcp-session-id: bogus\r\n\r\n"
    );
    let response = within(raw_http(server.addr(), get.as_bytes()))
        .await
        .expect("raw GET");
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(response.body, b"Not Found: Session not found");

    // DELETE with an unknown session is not a 404: rmcp answers 202 with an empty body.
    let delete = format!("DELETE /mcp HTTP/1.1\r\nhost: {host}\r\nmcp-session-id: bogus\r\n\r\n");
    let response = within(raw_http(server.addr(), delete.as_bytes()))
        .await
        .expect("raw DELETE");
    assert_eq!(response.status_line, "HTTP/1.1 202 Accepted");
    assert_eq!(response.body, b"");

    // The session check comes after the Accept check: a POST that does not accept both JSON and
    // SSE gets 406 even with a bogus session, so a proxy must pass Accept through.
    let no_accept = format!(
        "POST /mcp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         mcp-session-id: bogus\r\ncontent-length: {}\r\n\r\n{TOOLS_LIST}",
        TOOLS_LIST.len()
    );
    let response = within(raw_http(server.addr(), no_accept.as_bytes()))
        .await
        .expect("raw POST");
    assert_eq!(response.status_line, "HTTP/1.1 406 Not Acceptable");

    // Any other path: an empty 404 from the routing in front of rmcp.
    let other = format!("POST /other HTTP/1.1\r\nhost: {host}\r\ncontent-length: 0\r\n\r\n");
    let response = within(raw_http(server.addr(), other.as_bytes()))
        .await
        .expect("raw POST");
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(response.header("content-length"), Some("0"));
    assert_eq!(server.seen().last().expect("seen").path, "/other");
}

#[tokio::test]
async fn any_host_is_accepted_unless_rmcps_host_check_is_kept() {
    let open = McpServer::start().await;
    let response = within(raw_http(
        open.addr(),
        &mcp_post("backend.internal:8080", Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST");
    // Past the Host check, so rmcp's session 404.
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");

    let checked = McpServer::start_with(Options {
        check_host: true,
        ..Options::default()
    })
    .await;
    let response = within(raw_http(
        checked.addr(),
        &mcp_post("backend.internal:8080", Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST");
    assert_eq!(response.status_line, "HTTP/1.1 403 Forbidden");
    assert_eq!(response.header_names(), ["content-length", "date"]);
    assert_eq!(response.body, b"Forbidden: Host header is not allowed");

    // rmcp's default list names hosts without ports, so a loopback Host with any port passes:
    // a proxy on 127.0.0.1 that preserves the client's Host is fine even with the check on.
    let response = within(raw_http(
        checked.addr(),
        &mcp_post("127.0.0.1:1", Some("bogus"), TOOLS_LIST),
    ))
    .await
    .expect("raw POST");
    assert_eq!(response.status_line, "HTTP/1.1 404 Not Found");
}

#[tokio::test]
async fn stateless_json_mode_has_no_sessions_and_answers_json() {
    let server = McpServer::start_with(Options {
        mode: Mode::StatelessJson,
        ..Options::default()
    })
    .await;
    let client = within(connect(&server.url())).await.expect("connect");
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(server.session_count().await, 0);

    let seen = server.seen();
    assert_eq!(seen[0].assigned_session, None);
    assert!(seen.iter().all(|r| r.session_id().is_none()));

    let response = within(raw_http(
        server.addr(),
        &mcp_post(&server.addr().to_string(), None, TOOLS_LIST),
    ))
    .await
    .expect("raw tools/list");
    assert_eq!(response.status_line, "HTTP/1.1 200 OK");
    assert_eq!(response.header("content-type"), Some("application/json"));

    // No standalone stream and nothing to delete: GET and DELETE are 405, `Allow: POST`.
    for method in ["GET", "DELETE"] {
        let request = format!(
            "{method} /mcp HTTP/1.1\r\nhost: {}\r\naccept: text/event-stream\r\n\r\n",
            server.addr()
        );
        let response = within(raw_http(server.addr(), request.as_bytes()))
            .await
            .expect("raw request");
        assert_eq!(response.status_line, "HTTP/1.1 405 Method Not Allowed");
        assert_eq!(response.header("allow"), Some("POST"));
    }
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn a_waiting_call_returns_when_released() {
    let server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");
    let peer = client.peer().clone();
    let call = tokio::spawn(async move { call_wait(&peer).await });
    within(server.wait_for_request(tool_call)).await;
    assert!(!call.is_finished());
    server.release_waits(1);
    let released = within(call).await.expect("join").expect("wait");
    assert_eq!(released, "released");
    within(client.cancel()).await.expect("close");
}

/// The rmcp client does not fail a call whose SSE response is cut: it tries to resume the stream
/// with GET + `Last-Event-ID` (the priming event gave it one), treats every failure of that GET
/// (refused, then the new server's 404) as retryable, and backs off (the server's `retry: 3000`,
/// then 1 s doubling) forever. With no request timeout the call never completes.
#[tokio::test]
async fn a_call_cut_mid_response_is_not_failed_the_client_keeps_resuming() {
    let mut server = McpServer::start().await;
    let client = within(connect(&server.url())).await.expect("connect");
    let peer = client.peer().clone();
    let call = tokio::spawn(async move { call_wait(&peer).await });
    let cut = within(server.wait_for_request(tool_call)).await;

    within(server.restart()).await;
    // Event ids on a POST's stream are `<request stream>/<index>` (here `0/0`, the priming
    // event); the standalone GET stream's are plain numbers, and it resumes too.
    let resume = within(server.wait_for_request(|r| {
        r.method == Method::GET && r.header("last-event-id").is_some_and(|id| id.contains('/'))
    }))
    .await;
    assert_eq!(resume.session_id(), cut.session_id());
    assert_eq!(resume.status, StatusCode::NOT_FOUND);
    assert!(!call.is_finished(), "the cut call is still pending");
    call.abort();
    within(client.cancel()).await.expect("close");
}
