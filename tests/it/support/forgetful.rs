//! A scripted stateful MCP server (JSON answers) for what rmcp's server does not do: it names the
//! session in `Mcp-Session-Id` on *every* answer, so a test can see which id a client gets back,
//! and [`ForgetfulServer::forget`] drops its sessions without a restart, as a recreated container
//! would have. A method named `unknown/...` gets the 2026-07-28 revision's method-not-found 404,
//! and a GET gets a framework's 404 (no GET stream), whatever the session.
//!
//! How it says "forgotten" is chosen at start ([`Says`]): the spec's 404, or the 400 of the
//! TypeScript SDK's example servers and the reference everything server. It can also refuse
//! every ping, as a server that does not implement `ping` properly would.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::support::http::{response, Seen, Upstream};

/// The TypeScript SDK example servers' (and the everything server's) answer to a request whose
/// session id is not in their map, byte for byte (docs/compatibility.md).
pub const TS_EXAMPLES_400: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#;

/// The TypeScript SDK transport's answer to a body that is not JSON (on a live session too).
pub const PARSE_ERROR_400: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error: Invalid JSON"},"id":null}"#;

/// How the server says it does not know a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Says {
    /// The specification's 404 (the TypeScript SDK's transport, `-32001 Session not found`).
    Spec404,
    /// The TypeScript SDK examples' 400 ([`TS_EXAMPLES_400`]).
    TsExamples400,
}

/// Sessions the server knows and how many it opened.
struct Known {
    says: Says,
    /// Every ping is refused as a forgotten session's request would be, known session or not.
    refuses_pings: bool,
    sessions: HashSet<String>,
    opened: u32,
    executed: u32,
    pings: u32,
}

/// The server and its state.
pub struct ForgetfulServer {
    /// The listening upstream (its `url()` is the base URL).
    pub upstream: Upstream,
    known: Arc<Mutex<Known>>,
}

impl ForgetfulServer {
    /// Starts on a fresh port; a forgotten session gets the spec's 404.
    pub async fn start() -> ForgetfulServer {
        ForgetfulServer::start_saying(Says::Spec404, false).await
    }

    /// Starts on a fresh port; a forgotten session gets `says`, and with `refuses_pings` so does
    /// every ping.
    pub async fn start_saying(says: Says, refuses_pings: bool) -> ForgetfulServer {
        let known = Arc::new(Mutex::new(Known {
            says,
            refuses_pings,
            sessions: HashSet::new(),
            opened: 0,
            executed: 0,
            pings: 0,
        }));
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

    /// Pings received so far, answered or refused.
    pub fn pings(&self) -> u32 {
        self.known.lock().unwrap().pings
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
    let mut known = known.lock().unwrap();
    let json = ("content-type", "application/json");
    let body = match serde_json::from_slice::<serde_json::Value>(&seen.body) {
        Ok(body) => body,
        // A DELETE has no body.
        Err(_) if seen.method != http::Method::POST => serde_json::Value::Null,
        // As the TypeScript SDK's transport answers a body that is not JSON.
        Err(_) => return response(400, &[json], PARSE_ERROR_400),
    };
    if body["method"] == "ping" {
        known.pings += 1;
    }
    let forgotten = || match known.says {
        Says::Spec404 => response(
            404,
            &[json],
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#,
        ),
        Says::TsExamples400 => response(400, &[json], TS_EXAMPLES_400),
    };
    if body["method"] == "ping" && known.refuses_pings {
        return forgotten();
    }
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
        return forgotten();
    }
    let echo = ("mcp-session-id", session.as_str());
    match body["method"].as_str() {
        Some("notifications/initialized") => response(202, &[echo], ""),
        // A level no server knows: refused as the SDKs refuse one, a 200 carrying the error.
        Some("logging/setLevel") if body["params"]["level"] == "bogus" => {
            let error = serde_json::json!({"jsonrpc": "2.0", "id": body["id"], "error": {
                "code": -32602, "message": "Invalid level"}});
            response(200, &[json, echo], error.to_string())
        }
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
