//! A call that is safe to send twice is held through its server's death, not failed (issue 27).
//!
//! The server dies at the instant it has read the call, and stays dying for a moment: the call
//! sent once more at once breaks too. Before, that second break was the client's 502; now the
//! call waits in the hold like one that never reached the server, and goes once the server is
//! back. Four kinds of call, 30 deaths each: a read-only JSON-RPC method, a tool announced
//! `readOnlyHint`, one announced `idempotentHint` (none of them may fail), and a tool with no
//! annotations (may fail with an honest 502, never runs twice).
//!
//! - In process: a real rmcp server that closes the connection of the call it read, twice in a
//!   row, staying up (a dying process whose listener still accepts).
//! - As a separate process: the official Python SDK's server SIGKILLs itself the instant its
//!   handler gets the call, and is started again.

use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use rmcp::service::Peer;
use rmcp::RoleClient;

use crate::support::files::TempDir;
use crate::support::mcp::{call_ledger, connect, McpServer, Mode, Options};
use crate::support::proxy::Holdfast;
use crate::support::python::PyServer;
use crate::support::within;

/// Deaths per kind of call.
const DEATHS: usize = 30;

/// holdfast in front of `server`, and an rmcp client connected through it that has listed the
/// tools: the answer that teaches holdfast which tools are safe passed through it first.
async fn through_holdfast(
    server: std::net::SocketAddr,
) -> (
    Holdfast,
    rmcp::service::RunningService<RoleClient, ()>,
    Peer<RoleClient>,
) {
    let holdfast = Holdfast::start(&format!("http://{server}")).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    let peer = client.peer().clone();
    within(peer.list_all_tools()).await.expect("tools/list");
    (holdfast, client, peer)
}

#[tokio::test]
async fn safe_calls_outlive_a_server_that_breaks_them_twice_in_process() {
    let server = McpServer::start_with(Options {
        mode: Mode::StatelessJson,
        ..Options::default()
    })
    .await;
    let (holdfast, client, peer) = through_holdfast(server.addr()).await;

    for n in 0..DEATHS {
        // A read-only method.
        server.crash_on_next("tools/list", 2);
        let tools = within(peer.list_all_tools()).await;
        assert!(tools.is_ok(), "tools/list {n} failed: {tools:?}");
        // Tools announced read-only and idempotent.
        for tool in ["lookup", "put"] {
            let id = format!("{tool}-{n}");
            server.crash_on_next(&format!("\"{id}\""), 2);
            let got = within(call_ledger(&peer, tool, &id)).await;
            assert_eq!(got.expect("a safe call never fails"), id);
            assert_eq!(server.runs()[&format!("{tool}:{id}")], 1, "{id}");
        }
        // No annotations: the first break is the client's 502, and it never ran.
        let id = format!("record-{n}");
        server.crash_on_next(&format!("\"{id}\""), 2);
        let got = within(call_ledger(&peer, "record", &id)).await;
        assert!(got.is_err(), "{id}: {got:?}");
        assert_eq!(server.runs().get(&format!("record:{id}")), None, "{id}");
    }
    // Every safe call broke twice: once sent again at once, once held.
    let held = holdfast
        .metric("holdfast_rewrites_total{reason=\"upstream_reset\",action=\"held\"}")
        .await;
    assert_eq!(held, (3 * DEATHS) as f64);
    let failed = holdfast
        .metric("holdfast_upstream_failures_total{reason=\"upstream_reset\"}")
        .await;
    assert_eq!(failed, DEATHS as f64, "only the unannotated calls failed");
    within(client.cancel()).await.expect("close");
}

/// Calls the Python server's tool `tool` with `n`: its text, or the error.
async fn call_py(peer: &Peer<RoleClient>, tool: &'static str, n: usize) -> Result<String, String> {
    let arguments = serde_json::json!({ "n": n });
    let params = CallToolRequestParams::new(tool)
        .with_arguments(arguments.as_object().expect("an object").clone());
    let result = peer.call_tool(params).await.map_err(|e| e.to_string())?;
    if result.is_error == Some(true) {
        return Err(format!("{result:?}"));
    }
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone());
    text.ok_or_else(|| format!("no text: {result:?}"))
}

/// Reads the Python server's resource `ledger://n`: its text, or the error.
async fn read_py(peer: &Peer<RoleClient>, n: usize) -> Result<String, String> {
    let params = ReadResourceRequestParams::new(format!("ledger://{n}"));
    let result = peer
        .read_resource(params)
        .await
        .map_err(|e| e.to_string())?;
    serde_json::to_value(&result.contents)
        .ok()
        .and_then(|v| v[0]["text"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("no text: {result:?}"))
}

#[tokio::test]
async fn safe_calls_outlive_a_sigkilled_python_sdk_server() {
    let dir = TempDir::new("safe-calls-sigkill");
    let mut server = PyServer::start(&dir.path().join("ledger")).await;
    let (_holdfast, client, peer) = through_holdfast(server.addr()).await;

    let mut record_failed = 0;
    for n in 0..DEATHS {
        for kind in ["read", "peek", "put", "record"] {
            server.die_at_next(kind);
            let outcome = {
                let peer = peer.clone();
                let call = tokio::spawn(async move {
                    match kind {
                        "read" => read_py(&peer, n).await,
                        tool @ ("peek" | "put" | "record") => call_py(&peer, tool, n).await,
                        _ => unreachable!(),
                    }
                });
                server.wait_exit().await;
                server.start_again().await;
                within(call).await.expect("the call's task")
            };
            let ran = server
                .ledger()
                .iter()
                .filter(|r| r.tool == kind && r.n == n as u64)
                .count();
            match kind {
                // Killed before it ran, and never sent again: an honest failure.
                "record" => {
                    assert!(outcome.is_err(), "record {n}: {outcome:?}");
                    assert_eq!(ran, 0, "record {n} never ran");
                    record_failed += 1;
                }
                _ => {
                    let text = outcome.unwrap_or_else(|e| panic!("{kind} {n} failed: {e}"));
                    assert_eq!(text, format!("{kind} {n}"));
                    assert_eq!(ran, 1, "{kind} {n}: the killed attempt never ran");
                }
            }
        }
    }
    eprintln!(
        "safe calls through {} SIGKILLs: read, peek and put never failed; record failed \
         {record_failed} of {DEATHS} times and never ran twice",
        4 * DEATHS
    );
    within(client.cancel()).await.expect("close");
}
