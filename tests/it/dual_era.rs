//! Both protocol eras through holdfast (issue 27): the final 2026-07-28 revision's
//! `server/discover` and its own -32601 404, beside the 2025 handshake.
//!
//! - A dual-era client (the official Python SDK's, `mode="auto"`) probes with `server/discover`
//!   and falls back to the handshake on any HTTP 4xx without a JSON-RPC body, caching the verdict.
//!   A router's 404 in a deploy's route gap would push it to the old era, or fail its connect:
//!   through holdfast the probe is held, and the client lands on 2026-07-28 with no failed call.
//! - A 2026-07-28 server answers an unknown method with HTTP 404 and JSON-RPC error -32601: that
//!   is the server's own answer, and passes unchanged, even behind a router.
//! - `holdfast probe` asks both eras and says which a server answers.

use crate::probe::probe;
use crate::support::files::TempDir;
use crate::support::http::{post_json, response, Seen, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::python::{AutoClient, PyServer};
use crate::support::router::FakeRouter;
use crate::support::within;

/// Lookups the client makes once connected.
const CALLS: usize = 3;

#[tokio::test]
async fn a_dual_era_client_connecting_in_a_route_gap_lands_on_the_final_revision() {
    let dir = TempDir::new("dual-era");
    let server = PyServer::start(&dir.path().join("ledger")).await;
    let router = FakeRouter::start(server.addr()).await;
    // The deploy's route gap: Traefik answers its own 404 for the MCP server.
    router
        .missing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let holdfast = Holdfast::start(&format!("http://{}", router.addr)).await;

    let client = AutoClient::start(&holdfast.url("/mcp"), CALLS);
    // The client's probe met the router's 404 and waits in the hold.
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    router
        .missing
        .store(false, std::sync::atomic::Ordering::SeqCst);

    let out = client.output().await;
    let mut expected = vec!["era 2026-07-28".to_owned()];
    expected.extend((0..CALLS).map(|n| format!("ok {n} lookup {n}")));
    assert_eq!(out, expected, "the client's output");
    // It never fell back to the handshake: no initialize ever reached the router.
    let methods: Vec<Option<String>> = router.log().iter().map(|r| r.rpc_method()).collect();
    assert!(
        !methods.iter().any(|m| m.as_deref() == Some("initialize")),
        "{methods:?}"
    );
    assert_eq!(
        methods[0].as_deref(),
        Some("server/discover"),
        "{methods:?}"
    );
}

/// Without holdfast the same gap costs the connect: the probe's 404 has no JSON-RPC body, the
/// client falls back to the handshake, and that meets the 404 too. (What the test above proves
/// holdfast prevents.)
#[tokio::test]
async fn without_holdfast_the_route_gap_fails_the_connect() {
    let dir = TempDir::new("dual-era-direct");
    let server = PyServer::start(&dir.path().join("ledger")).await;
    let router = FakeRouter::start(server.addr()).await;
    router
        .missing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let out = AutoClient::start(&format!("http://{}/mcp", router.addr), CALLS)
        .output()
        .await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].starts_with("connect-failed"), "{out:?}");
}

/// A 2026-07-28-only server: `server/discover` and `tools/list` answered, everything else (the
/// 2025 handshake included) an unknown method: HTTP 404 with JSON-RPC error -32601.
async fn modern_only_server() -> Upstream {
    Upstream::start(|seen: Seen| async move {
        let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        let id = body["id"].clone();
        let json = [("content-type", "application/json")];
        if seen.method != http::Method::POST {
            return response(405, &[], "");
        }
        let result = match body["method"].as_str() {
            Some("server/discover") => serde_json::json!({
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
            }),
            Some("tools/list") => serde_json::json!({
                "tools": [{"name": "peek", "inputSchema": {"type": "object"},
                           "annotations": {"readOnlyHint": true}}],
            }),
            _ => {
                let error = serde_json::json!({
                    "jsonrpc": "2.0", "id": id,
                    "error": {"code": -32601, "message": "Method not found"},
                });
                return response(404, &json, error.to_string());
            }
        };
        let answer = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result});
        response(200, &json, answer.to_string())
    })
    .await
}

#[tokio::test]
async fn a_final_revision_servers_own_404_passes_unchanged() {
    let server = modern_only_server().await;
    // Behind a router (the default): its route-missing 404 would be held, the server's not.
    let holdfast = Holdfast::start(&server.url()).await;
    let unknown = r#"{"jsonrpc":"2.0","id":"u-1","method":"vendor/unknown","params":{}}"#;
    let got = within(post_json(&holdfast.url("/mcp"), unknown)).await;
    assert_eq!(got.status, 404, "{}", got.text());
    assert_eq!(
        got.text(),
        r#"{"error":{"code":-32601,"message":"Method not found"},"id":"u-1","jsonrpc":"2.0"}"#,
        "byte for byte"
    );
    assert_eq!(got.header("holdfast-reason"), None, "not holdfast's answer");
    assert_eq!(holdfast.metric("holdfast_passthrough_404_total").await, 1.0);
    assert_eq!(
        holdfast
            .metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"held\"}")
            .await,
        0.0
    );
    assert_eq!(server.seen().len(), 1, "sent once, not held or sent again");
}

#[tokio::test]
async fn probe_names_a_server_of_the_final_revision_only() {
    let server = modern_only_server().await;
    let report = probe(&format!("{}/mcp", server.url())).await;
    assert_eq!(report.exit_code, 0, "{}", report.text());
    assert!(
        report.verdict.finding.contains("2026-07-28 revision only"),
        "{}",
        report.text()
    );
    assert_eq!(
        report.eras.discover.as_deref(),
        Some(&["2026-07-28".to_owned()][..])
    );
    assert_eq!(report.eras.initialize, None);
    let tools = report.server.as_ref().and_then(|s| s.tools.as_ref());
    assert_eq!(
        tools.map(|t| (t.count, t.read_only_hint)),
        Some((1, 1)),
        "{}",
        report.text()
    );
    // Asked the revision's way: its headers on the discover and the tools/list (the
    // handshake's initialize is the 2025 era's, without them).
    let methods: Vec<String> = server
        .seen()
        .iter()
        .map(|s| {
            let body: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
            let method = body["method"].as_str().unwrap().to_owned();
            if method != "initialize" {
                assert_eq!(
                    s.header("mcp-protocol-version"),
                    Some("2026-07-28"),
                    "{method}"
                );
                assert_eq!(s.header("mcp-method"), Some(method.as_str()));
                assert_eq!(
                    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
                    "2026-07-28"
                );
            }
            method
        })
        .collect();
    assert_eq!(methods, ["server/discover", "initialize", "tools/list"]);
    assert!(report.text().contains("eras:"), "{}", report.text());
    // What the era bridge would do: nothing for 2025 clients yet, and it says so.
    let bridge = report.bridge.expect("the eras are known");
    assert!(bridge.starts_with("2026-07-28 only"), "{}", report.text());
    assert!(report.text().contains(&format!("bridge:   {bridge}")));
}

#[tokio::test]
async fn probe_names_both_eras_of_the_python_sdk_server() {
    let dir = TempDir::new("dual-era-probe");
    let server = PyServer::start(&dir.path().join("ledger")).await;
    let report = probe(&format!("http://{}/mcp", server.addr())).await;
    assert!(
        report.verdict.finding.contains("both eras"),
        "{}",
        report.text()
    );
    let discover = report.eras.discover.clone().unwrap_or_default();
    assert!(
        discover.iter().any(|v| v == "2026-07-28"),
        "{}",
        report.text()
    );
    assert!(report.eras.initialize.is_some(), "{}", report.text());
    let bridge = report.bridge.expect("the eras are known");
    assert!(bridge.starts_with("both eras"), "{}", report.text());
}
