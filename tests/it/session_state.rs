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

/// `check-config` prints the configuration, which ends up in CI logs and tickets: the store's
/// password is not in it.
#[test]
fn check_config_never_prints_the_stores_password() {
    let dir = crate::support::files::TempDir::new("store-password");
    let keys = dir.write(
        "session-keys",
        &format!("{}\n", "0123456789abcdef".repeat(4)),
    );
    let mut cmd = crate::support::process::holdfast(&["check-config"]);
    cmd.env("HOLDFAST_UPSTREAM", "http://mcp:8000")
        .env("HOLDFAST_SESSIONS__KEY_FILE", &keys)
        .env(
            "HOLDFAST_SESSIONS__STORE",
            "redis://:hunter2-secret@redis:6379/0",
        );
    let out = crate::support::process::finish(cmd, "holdfast check-config");
    assert!(out.status.success(), "{out:?}");
    assert!(!out.stdout.contains("hunter2"), "{}", out.stdout);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    assert!(
        out.stdout.contains("redis://:***@redis:6379/0"),
        "{}",
        out.stdout
    );
}
