//! When holdfast does not carry a session, and the server's own answer passes: an initialize it
//! could not track, a refused re-initialize, a server that keeps forgetting, a 404 on a live
//! session or of another path. (Sessions carried across a restart: `session.rs`.)

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ::http::StatusCode;

use crate::session::{
    count_call, initialize_body, open_session, result_text, resumes, send, VERSION,
};
use crate::support::forgetful::ForgetfulServer;
use crate::support::http::{response, Upstream};
use crate::support::mcp::{raw_http, McpServer, MCP_PATH};
use crate::support::proxy::Holdfast;
use crate::support::within;

#[tokio::test]
async fn a_malformed_or_huge_initialize_is_not_tracked() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let broken = send(
        &holdfast,
        "POST",
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initial"#,
    )
    .await;
    assert!(
        broken.status_line.starts_with("HTTP/1.1 4"),
        "the server's own answer: {broken:?}"
    );
    // 70 KiB of client name: over sessions.max_initialize_bytes (64 KiB).
    let huge = send(
        &holdfast,
        "POST",
        None,
        &initialize_body(&"x".repeat(70 * 1024)),
    )
    .await;
    assert_eq!(huge.status_line, "HTTP/1.1 200 OK");
    let id = huge.header("mcp-session-id").expect("session").to_owned();
    assert_eq!(holdfast.metric("holdfast_sessions_tracked").await, 0.0);

    within(server.restart()).await;
    let after = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(
        after.status_line, "HTTP/1.1 404 Not Found",
        "the server's own"
    );
    assert_eq!(server.calls(), 0);
    assert_eq!(holdfast.metric(&resumes("not_tracked")).await, 1.0);
}

#[tokio::test]
async fn a_refused_re_initialize_passes_the_servers_404() {
    let server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let id = open_session(&holdfast).await;
    // The next POST meets a 404 of the application (not a router's signature), so does
    // holdfast's ping on the session, and holdfast's initialize then gets a 401.
    server.fail_next_posts(2, StatusCode::NOT_FOUND, None);
    server.fail_next_posts(1, StatusCode::UNAUTHORIZED, None);
    let answer = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(
        answer.body, b"injected by McpServer\n",
        "the server's original answer"
    );
    assert_eq!(server.calls(), 0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 1.0);
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 0.0);
    // The session is still the server's: the next call goes through on it.
    let next = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(result_text(&next), "1");
}

#[tokio::test]
async fn a_server_that_keeps_forgetting_gets_two_re_establishments_then_its_404_passes() {
    // Answers every initialize with a fresh session and the first ping on each session holdfast
    // opens (so pings witness), then forgets that session too: every other request gets its 404.
    let opened = Arc::new(Mutex::new(0u32));
    let pinged = Arc::new(Mutex::new(HashSet::new()));
    let upstream = Upstream::start({
        let (opened, pinged) = (opened.clone(), pinged.clone());
        move |seen| {
            let (opened, pinged) = (opened.clone(), pinged.clone());
            async move {
                let body: serde_json::Value =
                    serde_json::from_slice(&seen.body).unwrap_or_default();
                let session = seen.header("mcp-session-id").unwrap_or_default().to_owned();
                match body["method"].as_str() {
                    Some("initialize") => {
                        let n = {
                            let mut opened = opened.lock().unwrap();
                            *opened += 1;
                            *opened
                        };
                        let result = serde_json::json!({"jsonrpc":"2.0","id":0,"result":{
                            "protocolVersion": VERSION, "capabilities": {},
                            "serverInfo": {"name": "forgetful", "version": "1"}}});
                        response(
                            200,
                            &[
                                ("content-type", "application/json"),
                                ("mcp-session-id", &format!("s-{n}")),
                            ],
                            result.to_string(),
                        )
                    }
                    Some("notifications/initialized") => response(202, &[], ""),
                    Some("ping") if session != "s-1" && pinged.lock().unwrap().insert(session) => {
                        response(
                            200,
                            &[("content-type", "application/json")],
                            r#"{"jsonrpc":"2.0","id":"holdfast-ping","result":{}}"#,
                        )
                    }
                    _ => response(
                        404,
                        &[("content-type", "application/json")],
                        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}"#,
                    ),
                }
            }
        }
    })
    .await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let id = open_session(&holdfast).await;
    assert!(
        id.starts_with("hf1."),
        "the client holds a token, not s-1: {id}"
    );

    let answer = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found");
    assert!(String::from_utf8_lossy(&answer.body).contains("Session not found"));
    let calls = upstream
        .seen()
        .iter()
        .filter(|s| String::from_utf8_lossy(&s.body).contains("tools/call"))
        .count();
    assert_eq!(
        calls, 3,
        "the first attempt and one after each re-establishment"
    );
    assert_eq!(
        *opened.lock().unwrap(),
        3,
        "the client's and two of holdfast's"
    );
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 2.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 1.0);
    assert_eq!(holdfast.metric("holdfast_sessions_tracked").await, 1.0);
}

#[tokio::test]
async fn a_404_on_a_live_session_is_the_answer_not_a_reason_to_re_establish() {
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    // A server without a GET stream answers the client's GET 404, on a session it knows.
    let host = holdfast.addr.to_string();
    let get = format!(
        "GET {MCP_PATH} HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\
         mcp-session-id: {id}\r\n\r\n"
    );
    let answer = within(raw_http(holdfast.addr, get.as_bytes()))
        .await
        .expect("raw GET");
    assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(answer.body, b"Cannot GET /mcp");
    // holdfast asked (a ping on the session, answered 200) and left the session alone.
    let pinged = server
        .upstream
        .seen()
        .iter()
        .any(|s| String::from_utf8_lossy(&s.body).contains("\"ping\""));
    assert!(pinged, "holdfast checked the session");
    assert_eq!(server.opened(), 1, "nothing re-initialized");
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 0.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 0.0);
    let call = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&call), "1");
    assert_eq!(server.opened(), 1);
}

#[tokio::test]
async fn a_404_of_another_path_or_an_unknown_method_leaves_the_session_alone() {
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;

    let unknown = r#"{"jsonrpc":"2.0","id":1,"method":"unknown/thing"}"#;
    let answer = send(&holdfast, "POST", Some(&id), unknown).await;
    assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found", "{answer:?}");
    assert!(String::from_utf8_lossy(&answer.body).contains("-32601"));

    let host = holdfast.addr.to_string();
    let other = format!("GET /elsewhere HTTP/1.1\r\nhost: {host}\r\nmcp-session-id: {id}\r\n\r\n");
    let answer = within(raw_http(holdfast.addr, other.as_bytes()))
        .await
        .expect("raw GET");
    assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found");

    assert_eq!(server.opened(), 1, "no session was re-established");
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 0.0);
    let call = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(
        result_text(&call),
        "1",
        "the session is the server's, as it was"
    );
    assert_eq!(server.opened(), 1);
}
