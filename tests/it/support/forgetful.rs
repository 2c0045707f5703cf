//! A scripted stateful MCP server (JSON answers) for what rmcp's server does not do: it names the
//! session in `Mcp-Session-Id` on *every* answer, so a test can see which id a client gets back,
//! and [`ForgetfulServer::forget`] drops its sessions without a restart, as a recreated container
//! would have. A method named `unknown/...` gets the 2026-07-28 revision's method-not-found 404,
//! and a GET gets a framework's 404 (no GET stream), whatever the session.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::support::http::{response, Seen, Upstream};

/// Sessions the server knows and how many it opened.
#[derive(Default)]
struct Known {
    sessions: HashSet<String>,
    opened: u32,
    executed: u32,
}

/// The server and its state.
pub struct ForgetfulServer {
    /// The listening upstream (its `url()` is the base URL).
    pub upstream: Upstream,
    known: Arc<Mutex<Known>>,
}

impl ForgetfulServer {
    /// Starts on a fresh port.
    pub async fn start() -> ForgetfulServer {
        let known = Arc::new(Mutex::new(Known::default()));
        let upstream = Upstream::start({
            let known = known.clone();
            move |seen| {
                let known = known.clone();
                async move { answer(&known, &seen) }
            }
        })
        .await;
        ForgetfulServer { upstream, known }
    }

    /// Forgets every session.
    pub fn forget(&self) {
        self.known.lock().unwrap().sessions.clear();
    }

    /// Sessions opened so far.
    pub fn opened(&self) -> u32 {
        self.known.lock().unwrap().opened
    }

    /// `tools/call`s executed so far.
    pub fn executed(&self) -> u32 {
        self.known.lock().unwrap().executed
    }
}

fn answer(known: &Mutex<Known>, seen: &Seen) -> http::Response<super::http::TestBody> {
    if !seen.uri.starts_with("/mcp") {
        // Like any web framework for a path it does not serve.
        return response(404, &[], "");
    }
    if seen.method == http::Method::GET {
        // Like an Express app that routes only `app.post('/mcp')`: no GET stream, and a 404
        // (not the 405 the transport asks for) whatever the session.
        return response(404, &[("content-type", "text/html")], "Cannot GET /mcp");
    }
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
    let mut known = known.lock().unwrap();
    let json = ("content-type", "application/json");
    if body["method"] == "initialize" {
        known.opened += 1;
        let id = format!("s-{}", known.opened);
        known.sessions.insert(id.clone());
        let result = serde_json::json!({"jsonrpc": "2.0", "id": body["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "forgetful", "version": "1"}}});
        return response(200, &[json, ("mcp-session-id", &id)], result.to_string());
    }
    let session = seen.header("mcp-session-id").unwrap_or_default().to_owned();
    if !known.sessions.contains(&session) {
        return response(
            404,
            &[json],
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#,
        );
    }
    let echo = ("mcp-session-id", session.as_str());
    match body["method"].as_str() {
        Some("notifications/initialized") => response(202, &[echo], ""),
        Some("tools/call") => {
            known.executed += 1;
            let result = serde_json::json!({"jsonrpc": "2.0", "id": body["id"], "result": {
                "content": [{"type": "text", "text": known.executed.to_string()}]}});
            response(200, &[json, echo], result.to_string())
        }
        // As the 2026-07-28 revision answers an unknown method: HTTP 404, JSON-RPC -32601.
        Some(method) if method.starts_with("unknown/") => response(
            404,
            &[json, echo],
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#,
        ),
        _ => response(
            200,
            &[json, echo],
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        ),
    }
}
