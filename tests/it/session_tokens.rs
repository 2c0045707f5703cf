//! Session tokens that do not open: cut short, altered, oversized, sealed with another key. Each
//! is somebody else's id as far as holdfast knows, so it goes to the server unchanged and the
//! server's own answer comes back; nothing is re-established from it, and nothing panics.

use crate::session::{count_call, open_session, result_text, send};
use crate::support::mcp::{tool_call, McpServer};
use crate::support::proxy::Holdfast;

/// `holdfast_session_tokens_refused_total{reason}`.
fn refused(reason: &str) -> String {
    format!("holdfast_session_tokens_refused_total{{reason=\"{reason}\"}}")
}

#[tokio::test]
async fn tokens_that_do_not_open_pass_unchanged_and_re_establish_nothing() {
    let server = McpServer::start().await;
    let upstream = format!("http://{}", server.addr());
    let holdfast = Holdfast::start(&upstream).await;
    let token = open_session(&holdfast).await;
    assert!(token.starts_with("hf1."), "{token}");
    // Another holdfast, with a key of its own (none configured: a random one per process).
    let elsewhere = Holdfast::start(&upstream).await;
    let foreign = open_session(&elsewhere).await;

    let mut altered = token.clone().into_bytes();
    let middle = altered.len() / 2;
    altered[middle] = if altered[middle] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let oversized = format!("{token}{}", "A".repeat(4000));
    let cut = token[..token.len() - 7].to_owned();
    // A cut token reads as malformed or as unopened, depending on where the cut falls in the
    // base64; the others are one or the other.
    let cases = [
        cut.as_str(),
        oversized.as_str(),
        "hf1.!not~base64",
        altered.as_str(),
        foreign.as_str(),
    ];
    let initializes_before = server
        .seen()
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    for (n, id) in cases.iter().enumerate() {
        let answer = send(&holdfast, "POST", Some(id), &count_call(n as u64)).await;
        assert_eq!(
            answer.status_line, "HTTP/1.1 404 Not Found",
            "{id}: {answer:?}"
        );
        assert_eq!(
            answer.body, b"Not Found: Session not found",
            "the server's own 404"
        );
        let seen = server.seen();
        let last = seen.iter().rev().find(|r| tool_call(r)).expect("the call");
        assert_eq!(
            last.session_id(),
            Some(*id),
            "the id went to the server unchanged"
        );
    }
    let initializes_after = server
        .seen()
        .iter()
        .filter(|r| r.rpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(
        initializes_after, initializes_before,
        "no initialize from a token that did not open"
    );
    let (malformed, unopened) = (
        holdfast.metric(&refused("malformed")).await,
        holdfast.metric(&refused("unopened")).await,
    );
    assert!(
        malformed >= 2.0 && unopened >= 2.0,
        "{malformed} {unopened}"
    );
    assert_eq!(malformed + unopened, cases.len() as f64);
    assert_eq!(server.calls(), 0);

    // The real token still works, on the same holdfast.
    let call = send(&holdfast, "POST", Some(&token), &count_call(9)).await;
    assert_eq!(call.status_line, "HTTP/1.1 200 OK", "{call:?}");
    assert_eq!(result_text(&call), "1");
}

#[tokio::test]
async fn an_ended_session_stays_ended_here_after_a_restart_of_its_server() {
    let mut server = McpServer::start().await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let token = open_session(&holdfast).await;
    let delete = send(&holdfast, "DELETE", Some(&token), "").await;
    assert!(delete.status_line.starts_with("HTTP/1.1 2"), "{delete:?}");

    crate::support::within(server.restart()).await;
    let after = send(&holdfast, "POST", Some(&token), &count_call(1)).await;
    assert_eq!(after.status_line, "HTTP/1.1 404 Not Found", "{after:?}");
    assert_eq!(holdfast.metric(&refused("ended")).await, 1.0);
    assert_eq!(server.calls(), 0, "nothing re-established, nothing ran");
}
