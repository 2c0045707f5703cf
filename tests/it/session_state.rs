//! What holdfast records of a session, and when it ends it: only what the server confirmed, and
//! only the session's own endpoint ending it.

use crate::session::{count_call, open_session, result_text, send};
use crate::support::forgetful::ForgetfulServer;
use crate::support::proxy::Holdfast;

/// A `logging/setLevel` request for `level`.
fn set_level(id: u64, level: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "logging/setLevel",
        "params": {"level": level}})
    .to_string()
}

/// The levels the server was asked to set, in order.
fn levels_set(server: &ForgetfulServer) -> Vec<String> {
    server
        .upstream
        .seen()
        .iter()
        .filter_map(|s| {
            let body: serde_json::Value = serde_json::from_slice(&s.body).ok()?;
            (body["method"] == "logging/setLevel").then(|| {
                body["params"]["level"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
        })
        .collect()
}

#[tokio::test]
async fn a_state_change_the_server_refused_is_not_set_again_after_a_restart() {
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    let accepted = send(&holdfast, "POST", Some(&id), &set_level(1, "debug")).await;
    assert_eq!(accepted.status_line, "HTTP/1.1 200 OK");
    // A 200 whose body is the server's refusal.
    let refused = send(&holdfast, "POST", Some(&id), &set_level(2, "bogus")).await;
    assert_eq!(refused.status_line, "HTTP/1.1 200 OK");
    assert!(String::from_utf8_lossy(&refused.body).contains("Invalid level"));

    server.forget();
    let call = send(&holdfast, "POST", Some(&id), &count_call(3)).await;
    assert_eq!(result_text(&call), "1");
    assert_eq!(
        levels_set(&server),
        ["debug", "bogus", "debug"],
        "the accepted level set again on the new session, the refused one not"
    );
}

#[tokio::test]
async fn a_delete_to_another_path_does_not_end_the_session() {
    let server = ForgetfulServer::start().await;
    let holdfast = Holdfast::start(&server.upstream.url()).await;
    let id = open_session(&holdfast).await;
    // Another path's own 404 (the server serves only /mcp), with the session's id.
    let other = crate::support::mcp::raw_http(
        holdfast.addr,
        format!(
            "DELETE /other HTTP/1.1\r\nhost: {}\r\nmcp-session-id: {id}\r\n\r\n",
            holdfast.addr
        )
        .as_bytes(),
    )
    .await
    .expect("raw request");
    assert_eq!(other.status_line, "HTTP/1.1 404 Not Found");
    // The session goes on: a restart of the server still has it carried, on its token.
    server.forget();
    let call = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(call.status_line, "HTTP/1.1 200 OK", "{call:?}");
    assert_eq!(result_text(&call), "1");
    assert_eq!(
        server.opened(),
        2,
        "re-established, not passed as an ended session's"
    );
}
