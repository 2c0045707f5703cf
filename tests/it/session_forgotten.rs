//! A forgotten session said the way real servers say it: the specification's 404, and the 400
//! of the TypeScript SDK's example servers and the reference everything server (which most
//! TypeScript servers are copied from). Each is confirmed by a ping on the session before
//! anything is re-established; a request's own 400 on a live session passes unchanged and runs
//! once; a server that refuses every ping costs one re-establishment and then no more.
//!
//! The real servers themselves, through a restart with the official clients, are in
//! `compat.rs`; these tests pin the decisions on a scripted server that shows every request.

use crate::session::{count_call, open_session, result_text, send};
use crate::support::forgetful::{ForgetfulServer, Says, PARSE_ERROR_400, TS_EXAMPLES_400};
use crate::support::http::Seen;
use crate::support::proxy::Holdfast;

/// `holdfast_session_resumes_total{outcome}`.
fn resumes(outcome: &str) -> String {
    format!("holdfast_session_resumes_total{{outcome=\"{outcome}\"}}")
}

/// The JSON-RPC method of each request the server saw, in order (`-` for a body that is not
/// JSON-RPC), with the session id it came on.
fn methods(seen: &[Seen]) -> Vec<(String, String)> {
    seen.iter()
        .map(|s| {
            let body: serde_json::Value = serde_json::from_slice(&s.body).unwrap_or_default();
            (
                body["method"].as_str().unwrap_or("-").to_owned(),
                s.header("mcp-session-id").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_ts_examples_400_for_a_forgotten_session_re_establishes_it() {
    let server = ForgetfulServer::start_saying(Says::TsExamples400, false).await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    let first = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&first), "1");

    server.forget();
    let before = server.upstream.seen().len();
    let again = send(&holdfast, "POST", Some(&id), &count_call(2)).await;
    assert_eq!(again.status_line, "HTTP/1.1 200 OK", "{again:?}");
    assert_eq!(result_text(&again), "2");
    assert_eq!(again.header("mcp-session-id"), Some(id.as_str()));
    assert_eq!(server.executed(), 2, "each call ran once");

    let after = methods(&server.upstream.seen()[before..]);
    let on = |m: &str, s: &str| (m.to_owned(), s.to_owned());
    assert_eq!(
        after,
        [
            on("tools/call", "s-1"),
            // The 400 is only a suspicion: the ping on the same session is refused alike.
            on("ping", "s-1"),
            on("initialize", ""),
            on("notifications/initialized", "s-2"),
            // Pings witness: the new session answers one.
            on("ping", "s-2"),
            on("tools/call", "s-2"),
        ]
    );
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 1.0);

    // Its end goes to the new session too.
    let delete = send(&holdfast, "DELETE", Some(&id), "").await;
    assert_eq!(delete.status_line, "HTTP/1.1 200 OK", "{delete:?}");
    let last = server.upstream.seen().last().cloned().unwrap();
    assert_eq!(last.header("mcp-session-id"), Some("s-2"));
}

#[tokio::test]
async fn a_delete_on_a_session_forgotten_with_400_is_the_servers_answer() {
    let server = ForgetfulServer::start_saying(Says::TsExamples400, false).await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    server.forget();
    let delete = send(&holdfast, "DELETE", Some(&id), "").await;
    assert_eq!(delete.status_line, "HTTP/1.1 200 OK", "{delete:?}");
    assert_eq!(server.opened(), 2, "re-established, then ended");
    let last = server.upstream.seen().last().cloned().unwrap();
    assert_eq!(last.method, http::Method::DELETE);
    assert_eq!(last.header("mcp-session-id"), Some("s-2"));
}

#[tokio::test]
async fn a_requests_own_400_on_a_live_session_passes_unchanged_and_runs_once() {
    let server = ForgetfulServer::start_saying(Says::TsExamples400, false).await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;

    // A body that is not JSON: the transport's own 400, on a session it knows.
    let before = server.upstream.seen().len();
    let bad = send(&holdfast, "POST", Some(&id), "{not json").await;
    assert_eq!(bad.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(bad.body, PARSE_ERROR_400.as_bytes(), "the server's answer");
    let after = methods(&server.upstream.seen()[before..]);
    assert_eq!(
        after,
        [
            ("-".to_owned(), "s-1".to_owned()),
            ("ping".to_owned(), "s-1".to_owned()),
        ],
        "sent once, then the ping that shows the session alive; nothing re-established"
    );
    assert_eq!(server.opened(), 1);
    assert_eq!(holdfast.metric(&resumes("resumed")).await, 0.0);
    assert_eq!(holdfast.metric(&resumes("failed")).await, 0.0);

    // The session goes on.
    let next = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&next), "1");
    assert_eq!(server.executed(), 1);
}

#[tokio::test]
async fn a_400_for_a_session_holdfast_does_not_carry_passes_at_once() {
    let server = ForgetfulServer::start_saying(Says::TsExamples400, false).await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let answer = send(&holdfast, "POST", Some("not-a-token"), &count_call(1)).await;
    assert_eq!(answer.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(answer.body, TS_EXAMPLES_400.as_bytes());
    assert_eq!(
        server.pings(),
        0,
        "no ping for a session holdfast never saw"
    );
    assert_eq!(server.upstream.seen().len(), 1);
    // `not_tracked` counts the spec's 404 only.
    assert_eq!(holdfast.metric(&resumes("not_tracked")).await, 0.0);
}

#[tokio::test]
async fn a_server_that_refuses_every_ping_costs_one_re_establishment_then_none() {
    let server = ForgetfulServer::start_saying(Says::TsExamples400, true).await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;

    // The request's own 400 looks like a forgotten session, and so does the ping's: holdfast
    // opens a session, whose ping is refused too. Pings prove nothing here: the server's
    // answer passes, and the request went once.
    let bad = send(&holdfast, "POST", Some(&id), "{not json").await;
    assert_eq!(bad.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(bad.body, PARSE_ERROR_400.as_bytes());
    assert_eq!(
        server.opened(),
        2,
        "the client's session and holdfast's one try"
    );
    assert_eq!(
        server.pings(),
        2,
        "the suspected session's and the new one's"
    );
    let sent_bad = server
        .upstream
        .seen()
        .iter()
        .filter(|s| s.body.starts_with(b"{not json"))
        .count();
    assert_eq!(sent_bad, 1, "never sent twice");
    assert_eq!(holdfast.metric(&resumes("failed")).await, 1.0);

    // From now on a 400 is the server's answer, and costs nothing more.
    let again = send(&holdfast, "POST", Some(&id), "{not json").await;
    assert_eq!(again.body, PARSE_ERROR_400.as_bytes());
    assert_eq!(server.opened(), 2);
    assert_eq!(server.pings(), 2);
    // The client's session was never replaced: its calls still run on it.
    let call = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(result_text(&call), "1");
    let last = server.upstream.seen().last().cloned().unwrap();
    assert_eq!(last.header("mcp-session-id"), Some("s-1"));
}
