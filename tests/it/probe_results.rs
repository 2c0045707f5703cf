//! `holdfast probe` against a server that answers every JSON-RPC request with `{"result":{}}`
//! (issue 43): it was called "a Streamable HTTP MCP server" (exit 0) while its own `eras:` line
//! said the initialize was not answered. An initialize result without `protocolVersion` and
//! `serverInfo` proves no MCP server: the verdict says what was seen (exit 4), and agrees with
//! the eras.

use crate::support::http::{response, Upstream};
use crate::support::process::{finish, holdfast};

/// Answers every request `200 {"jsonrpc":"2.0","id":…,"result":{}}`.
async fn catch_all() -> Upstream {
    Upstream::start(|seen| async move {
        let id = serde_json::from_slice::<serde_json::Value>(&seen.body)
            .map(|v| v["id"].clone())
            .unwrap_or_default();
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}});
        response(
            200,
            &[("content-type", "application/json")],
            body.to_string(),
        )
    })
    .await
}

#[tokio::test]
async fn a_result_to_everything_is_no_verified_mcp_server() {
    let up = catch_all().await;
    let url = format!("{}/mcp", up.url());
    let report = crate::probe::probe(&url).await;
    let text = report.text();
    assert_eq!(
        report.verdict.kind,
        holdfast::probe::verdict::Kind::NotMcp,
        "{text}"
    );
    assert_eq!(report.exit_code, 4, "{text}");
    for says in [
        "a JSON-RPC result to the initialize, but not an MCP server's",
        "no protocolVersion and no serverInfo",
        "the result was {}",
    ] {
        assert!(report.verdict.finding.contains(says), "no {says:?}: {text}");
    }
    // No server described, and no era claimed for it.
    assert_eq!(
        report.eras.line(),
        "server/discover not answered; initialize not answered"
    );
    assert!(report.server.is_none(), "{text}");
    assert!(!text.contains("a Streamable HTTP MCP server"), "{text}");

    // The command: its exit status says the same.
    let out =
        tokio::task::spawn_blocking(move || finish(holdfast(&["probe", &url]), "holdfast probe"))
            .await
            .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}
