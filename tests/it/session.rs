//! Session continuity: an MCP session outlives the backend's restart.
//!
//! The server is rmcp's stateful Streamable HTTP server ([`McpServer`]), which keeps sessions in
//! memory: [`McpServer::restart`] comes back on the same port with none, like a recreated
//! container, and answers an old session id with its own 404. Clients are rmcp's with its own
//! re-initialize turned off (so only holdfast can carry the session) and raw JSON-RPC over a
//! socket, to see exactly which id each side gets. `session_ts.rs` does the same with the
//! official TypeScript SDK client; `session_not_resumed.rs` has the cases where the session is
//! not carried and the server's own answer passes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ::http::{Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::support::forgetful::ForgetfulServer;
use crate::support::http;
use crate::support::mcp::{
    call_count, connect_with, raw_http, tool_call, McpServer, RawResponse, MCP_ACCEPT, MCP_PATH,
};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::router::FakeRouter;
use crate::support::within;

/// The protocol version the raw client speaks.
pub(crate) const VERSION: &str = "2025-06-18";

/// `holdfast_session_resumes_total{outcome}`.
pub(crate) fn resumes(outcome: &str) -> String {
    format!("holdfast_session_resumes_total{{outcome=\"{outcome}\"}}")
}

/// An rmcp client that never re-initializes by itself: only holdfast can keep its session.
async fn stubborn_client(holdfast: &Holdfast) -> crate::support::mcp::Client {
    let config = StreamableHttpClientTransportConfig::with_uri(holdfast.url(MCP_PATH))
        .reinit_on_expired_session(false);
    within(connect_with(config)).await.expect("connect")
}

/// One HTTP/1.1 request to `/mcp` as an MCP client sends it.
fn request(method: &str, host: &str, session: Option<&str>, body: &str) -> Vec<u8> {
    let session = session
        .map(|id| format!("mcp-session-id: {id}\r\nmcp-protocol-version: {VERSION}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {MCP_PATH} HTTP/1.1\r\nhost: {host}\r\naccept: {MCP_ACCEPT}\r\n\
         content-type: application/json\r\nauthorization: Bearer current\r\n\
         accept-encoding: gzip, deflate\r\n{session}\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends one request to holdfast and reads the answer off the socket.
pub(crate) async fn send(
    holdfast: &Holdfast,
    method: &str,
    session: Option<&str>,
    body: &str,
) -> RawResponse {
    let host = holdfast.addr.to_string();
    within(raw_http(
        holdfast.addr,
        &request(method, &host, session, body),
    ))
    .await
    .expect("raw request")
}

pub(crate) fn initialize_body(client_name: &str) -> String {
    serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": { "name": client_name, "version": "1" },
        },
    })
    .to_string()
}

/// Opens a session through holdfast as a client does: initialize, then initialized. Returns the
/// session id the client was given.
pub(crate) async fn open_session(holdfast: &Holdfast) -> String {
    let init = send(holdfast, "POST", None, &initialize_body("raw")).await;
    assert_eq!(init.status_line, "HTTP/1.1 200 OK", "{init:?}");
    let id = init
        .header("mcp-session-id")
        .expect("a stateful server gives a session id")
        .to_owned();
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let done = send(holdfast, "POST", Some(&id), initialized).await;
    assert_eq!(done.status_line, "HTTP/1.1 202 Accepted", "{done:?}");
    id
}

pub(crate) fn count_call(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"count","arguments":{{}}}}}}"#
    )
}

/// The text of the first content item of the JSON-RPC result in a raw body: JSON, or SSE (the
/// `data:` of an event, chunked on the wire).
pub(crate) fn result_text(raw: &RawResponse) -> String {
    let body = String::from_utf8_lossy(&raw.body);
    let message: serde_json::Value = body
        .lines()
        .map(|line| line.strip_prefix("data:").unwrap_or(line).trim())
        .filter(|line| line.starts_with('{'))
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC message in {body:?}"));
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result in {message}"))
        .to_owned()
}

#[tokio::test]
async fn a_client_that_never_reinitializes_keeps_its_session_across_a_restart() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let client = stubborn_client(&holdfast).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(within(call_count(&client)).await.expect("count"), 2);
    let original = server.seen()[0].assigned_session.clone().expect("session");
    assert_eq!(holdfast.metric("holdfast_sessions_tracked").await, 1.0);

    within(server.restart()).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 3);
    assert_eq!(within(call_count(&client)).await.expect("count"), 4);
    assert_eq!(server.calls(), 4, "each call ran exactly once");

    // The server saw the old session once more (its 404, nothing executed), then holdfast's
    // initialize and the calls on the new session.
    let seen = server.seen();
    let forgotten: Vec<_> = seen
        .iter()
        .filter(|r| tool_call(r) && r.status == StatusCode::NOT_FOUND)
        .collect();
    assert_eq!(forgotten.len(), 1, "one call met the forgotten session");
    assert_eq!(forgotten[0].session_id(), Some(original.as_str()));
    let initializes: Vec<_> = seen
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .collect();
    assert_eq!(initializes.len(), 2, "the client's and holdfast's");
    let renewed = initializes[1]
        .assigned_session
        .clone()
        .expect("a new session");
    assert_ne!(renewed, original);
    let later_calls: Vec<_> = seen
        .iter()
        .filter(|r| tool_call(r) && r.status == StatusCode::OK)
        .skip(2)
        .collect();
    assert_eq!(later_calls.len(), 2);
    assert!(later_calls
        .iter()
        .all(|r| r.session_id() == Some(renewed.as_str())));
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 0.0);
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 0.0);
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn with_resume_off_the_same_client_loses_its_session() {
    let mut server = McpServer::start().await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.sessions.resume = false;
    let holdfast = Holdfast::start_with(raw).await;
    let client = stubborn_client(&holdfast).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);
    assert_eq!(holdfast.metric("holdfast_sessions_tracked").await, 0.0);

    within(server.restart()).await;
    within(call_count(&client))
        .await
        .expect_err("the server forgot the session and nobody re-established it");
    assert_eq!(server.calls(), 1);
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 0.0);
}

#[tokio::test]
async fn a_call_on_the_old_id_runs_once_and_the_client_keeps_its_id_until_delete() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;

    // A session holdfast never saw opened: the server's own 404, at once.
    let bogus = send(&holdfast, "POST", Some("bogus"), &count_call(1)).await;
    assert_eq!(bogus.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(bogus.body, b"Not Found: Session not found");
    assert_eq!(holdfast.metric(&resumes("not_tracked")).await, 1.0);

    let id = open_session(&holdfast).await;
    // The client holds holdfast's token; the server knows its own id.
    let upstream_id = server
        .seen()
        .iter()
        .find_map(|r| r.assigned_session.clone())
        .expect("the server's session id");
    assert!(id.starts_with("hf1."), "{id}");
    assert_ne!(id, upstream_id);
    let first = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(result_text(&first), "1");

    within(server.restart()).await;
    let again = send(&holdfast, "POST", Some(&id), &count_call(3)).await;
    assert_eq!(again.status_line, "HTTP/1.1 200 OK", "{again:?}");
    assert_eq!(result_text(&again), "2");
    assert_eq!(server.calls(), 2);

    // What the server saw after its restart: the request on the old id (404), holdfast's
    // initialize with the client's body and the current credentials, initialized, the request.
    let seen = server.seen();
    let restart = seen
        .iter()
        .position(|r| {
            tool_call(r)
                && r.status == StatusCode::NOT_FOUND
                && r.session_id() == Some(&upstream_id)
        })
        .expect("the 404");
    let after: Vec<_> = seen[restart..].iter().collect();
    let summary: Vec<_> = after
        .iter()
        .map(|r| (r.rpc_method.clone().unwrap_or_default(), r.status.as_u16()))
        .collect();
    assert_eq!(
        summary,
        [
            ("tools/call".to_owned(), 404),
            // holdfast's check that the session is gone, on the old id.
            ("ping".to_owned(), 404),
            ("initialize".to_owned(), 200),
            ("notifications/initialized".to_owned(), 202),
            // holdfast's check that pings witness: answered on the new session.
            ("ping".to_owned(), 200),
            ("tools/call".to_owned(), 200),
        ]
    );
    assert_eq!(after[1].session_id(), Some(upstream_id.as_str()));
    let renewed = after[2].assigned_session.clone().expect("new session");
    assert_ne!(renewed, upstream_id);
    assert_eq!(
        again.header("mcp-session-id"),
        None,
        "the server named no session"
    );
    // Whatever the answer names, it is never the new upstream id.
    assert_ne!(again.header("mcp-session-id"), Some(renewed.as_str()));
    assert_eq!(after[2].session_id(), None);
    assert_eq!(after[2].header("authorization"), Some("Bearer current"));
    for r in &after[3..] {
        assert_eq!(r.session_id(), Some(renewed.as_str()));
        assert_eq!(r.header("mcp-protocol-version"), Some(VERSION));
    }

    // DELETE goes to the new session and ends tracking; the old id is then the server's 404.
    let delete = send(&holdfast, "DELETE", Some(&id), "").await;
    assert!(delete.status_line.starts_with("HTTP/1.1 2"), "{delete:?}");
    let deleted = within(server.wait_for_request(|r| r.method == Method::DELETE)).await;
    assert_eq!(deleted.session_id(), Some(renewed.as_str()));
    assert_eq!(holdfast.metric("holdfast_sessions_tracked").await, 0.0);
    let gone = send(&holdfast, "POST", Some(&id), &count_call(4)).await;
    assert_eq!(gone.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(gone.body, b"Not Found: Session not found");
    assert_eq!(server.calls(), 2);
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    assert_eq!(holdfast.metric(&resumes("not_tracked")).await, 2.0);
}

#[tokio::test]
async fn the_log_level_is_set_again_on_the_new_session() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let id = open_session(&holdfast).await;
    let set = r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}"#;
    let answer = send(&holdfast, "POST", Some(&id), set).await;
    assert_eq!(answer.status_line, "HTTP/1.1 200 OK");
    assert_eq!(server.levels(), ["debug"]);

    within(server.restart()).await;
    let again = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(result_text(&again), "1");
    assert_eq!(server.levels(), ["debug", "debug"], "applied again");
    let renewed = server
        .seen()
        .into_iter()
        .filter(|r| r.rpc_method.as_deref() == Some("logging/setLevel"))
        .nth(1)
        .expect("the second setLevel");
    assert_ne!(renewed.session_id(), Some(id.as_str()));
    assert_eq!(renewed.status, StatusCode::OK);
}

#[tokio::test]
async fn a_stream_cut_by_a_restart_goes_on_on_the_new_session() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let id = open_session(&holdfast).await;
    let host = holdfast.addr.to_string();
    // The client's standalone stream, resumed after an event of its own, is open when the server
    // dies.
    let stream = within(http::send(
        Request::get(holdfast.url(MCP_PATH))
            .header("host", &host)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &id)
            .header("mcp-protocol-version", VERSION)
            .header("last-event-id", "0/7")
            .body(Full::<Bytes>::default())
            .unwrap(),
    ))
    .await;
    assert_eq!(stream.status(), StatusCode::OK);
    let first = within(server.wait_for_request(|r| r.method == Method::GET)).await;
    let old = first.session_id().expect("the stream's session").to_owned();
    assert_eq!(first.header("last-event-id"), Some("0/7"));
    within(server.restart()).await;

    // holdfast opens the stream again itself, on the re-established session; the client's goes
    // on.
    let opened = within(server.wait_for_request(|r| {
        r.method == Method::GET && r.status == StatusCode::OK && r.session_id() != Some(&old)
    }))
    .await;
    assert_eq!(
        opened.header("last-event-id"),
        None,
        "an event id of the old session (and the client's own, already resumed from) means \
         nothing to the new one"
    );
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    // Reopened at least there (rmcp also ends a stream resumed from an event it does not know,
    // which holdfast opens again too).
    let reopened = "holdfast_sse_streams_reopened_total";
    holdfast.metric_until(reopened, |n| n >= 1.0).await;
    assert_eq!(holdfast.metric("holdfast_sse_streams_active").await, 1.0);
    // Its client goes away: the stream and the server's behind it end.
    drop(stream);
    holdfast
        .metric_until("holdfast_sse_streams_active", |n| n == 0.0)
        .await;
}

#[tokio::test]
async fn concurrent_calls_on_a_forgotten_session_re_establish_it_once() {
    let mut server = McpServer::start().await;
    let holdfast = Arc::new(Holdfast::start(&format!("http://{}", server.addr())).await);
    let id = open_session(&holdfast).await;
    within(server.restart()).await;

    let calls: Vec<_> = (0..5)
        .map(|n| {
            let (holdfast, id) = (holdfast.clone(), id.clone());
            tokio::spawn(async move { send(&holdfast, "POST", Some(&id), &count_call(n)).await })
        })
        .collect();
    let mut values = Vec::new();
    for call in calls {
        let answer = within(call).await.expect("task");
        assert_eq!(answer.status_line, "HTTP/1.1 200 OK", "{answer:?}");
        values.push(result_text(&answer).parse::<u64>().expect("a count"));
    }
    values.sort();
    assert_eq!(values, [1, 2, 3, 4, 5], "each ran once");
    let initializes = server
        .seen()
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 2, "the client's and one re-establishment");
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
}

#[tokio::test]
async fn a_session_survives_a_route_gap_with_a_restart_in_it() {
    let mut server = McpServer::start().await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = Holdfast::start(&format!("http://{}", router.addr)).await;
    let client = stubborn_client(&holdfast).await;
    assert_eq!(within(call_count(&client)).await.expect("count"), 1);

    // The container is recreated: its route vanishes, a new one with no sessions starts.
    router.missing.store(true, Ordering::SeqCst);
    within(server.restart()).await;
    let held = tokio::spawn({
        let peer = client.peer().clone();
        async move { call_count(&peer).await }
    });
    // The call met the router's 404 and is held; then the route comes back.
    holdfast
        .metric_until("holdfast_held_requests", |v| v >= 1.0)
        .await;
    router.missing.store(false, Ordering::SeqCst);
    assert_eq!(within(held).await.expect("task").expect("count"), 2);
    assert_eq!(server.calls(), 2);
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 0.0);
    let log = router.log();
    assert!(log.iter().any(|r| r.answered_404), "the gap was seen");
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn answers_name_the_clients_session_id_never_the_new_one() {
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    assert!(
        id.starts_with("hf1."),
        "the client holds a token, not s-1: {id}"
    );
    let first = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(first.header("mcp-session-id"), Some(id.as_str()));
    let sent = server.upstream.seen();
    assert_eq!(sent.last().unwrap().header("mcp-session-id"), Some("s-1"));

    server.forget();
    let again = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(again.status_line, "HTTP/1.1 200 OK", "{again:?}");
    assert_eq!(result_text(&again), "2");
    assert_eq!(server.opened(), 2, "holdfast opened s-2 upstream");
    let sent = server.upstream.seen();
    assert_eq!(sent.last().unwrap().header("mcp-session-id"), Some("s-2"));
    assert_eq!(
        again.header("mcp-session-id"),
        Some(id.as_str()),
        "the server named s-2; the client sees its own id"
    );
    assert_eq!(server.executed(), 2);
    // holdfast reads its own answers and decodes no gzip, whatever the client accepts.
    let initialize = sent
        .iter()
        .filter(|s| String::from_utf8_lossy(&s.body).contains("\"initialize\""))
        .nth(1)
        .expect("holdfast's initialize");
    assert_eq!(initialize.header("accept-encoding"), Some("identity"));

    // The DELETE goes to s-2, and its answer names s-2: the client sees its own id.
    let delete = send(&holdfast, "DELETE", Some(&id), "").await;
    assert_eq!(
        delete.header("mcp-session-id"),
        Some(id.as_str()),
        "{delete:?}"
    );
    let deleted = server.upstream.seen();
    assert_eq!(
        deleted.last().unwrap().header("mcp-session-id"),
        Some("s-2")
    );
}
