//! The era bridge's translations, 2026-07-28 client -> 2025 server (docs/design/era-bridge.md
//! 3.4), as pure functions of bodies and headers: no I/O, no state. Build order step 1's first
//! part: what a `tools/list` or `tools/call` of a 2026 client becomes on a 2025 session, and
//! what the server's answer becomes for the client.
//!
//! A 2026 request carries its protocol in `params._meta` (`io.modelcontextprotocol/*` keys) and
//! in headers (`MCP-Protocol-Version: 2026-07-28`, `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`); a
//! 2025 server knows none of it and wants a session (`Mcp-Session-Id`) opened by `initialize`.
//! Its results lack what a 2026 client requires: `resultType`, and on cacheable results `ttlMs`
//! and `cacheScope` (the Python SDK's client refuses a `tools/list` without them, design 0.3).

use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use crate::http1::names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};

/// The 2026 revision's version string.
pub const MODERN: &str = "2026-07-28";

/// The 2025 version the bridge asks a server for.
pub const LEGACY: &str = "2025-11-25";

/// The `_meta` keys of the 2026 envelope (all under this prefix).
const ENVELOPE_PREFIX: &str = "io.modelcontextprotocol/";

/// Results a 2026 client caches, which must say for how long and for whom.
const CACHEABLE: [&str; 6] = [
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// Why a body could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the body is not one JSON-RPC 2.0 message: {0}")]
    NotJsonRpc(String),
    #[error("the message is not a request (a method and a string or number id)")]
    NotRequest,
    #[error("the message is not a response (an id and a result or an error)")]
    NotResponse,
}

/// Whether a request speaks the 2026 revision: its `MCP-Protocol-Version` says so.
pub fn is_modern(headers: &HeaderMap) -> bool {
    headers
        .get(MCP_PROTOCOL_VERSION)
        .is_some_and(|v| v.as_bytes() == MODERN.as_bytes())
}

/// What a 2026 request said of its client in its envelope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Envelope {
    /// `io.modelcontextprotocol/clientInfo`.
    pub client_info: Option<Value>,
    /// `io.modelcontextprotocol/clientCapabilities`.
    pub capabilities: Option<Value>,
    /// `io.modelcontextprotocol/logLevel`: this request opts in to log messages from this level.
    pub log_level: Option<String>,
}

/// A 2026 request made a 2025 one.
#[derive(Debug, Clone, PartialEq)]
pub struct ToLegacy {
    /// The request as the 2025 server gets it: the envelope taken out of `params._meta`
    /// (`progressToken` and foreign keys kept), the id replaced.
    pub body: Vec<u8>,
    /// The client's id, for its answer.
    pub client_id: Value,
    /// The id it goes upstream with.
    pub upstream_id: u64,
    pub method: String,
    pub envelope: Envelope,
}

/// The 2025 form of the 2026 request `body`, sent upstream with id `upstream_id` (unique on the
/// bridge's session: requests of several clients share it).
pub fn request_to_legacy(body: &[u8], upstream_id: u64) -> Result<ToLegacy, WireError> {
    let mut message = object(body)?;
    let method = match message.get("method") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(WireError::NotRequest),
    };
    let client_id = match message.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => return Err(WireError::NotRequest),
    };
    let envelope = match message.get_mut("params").and_then(Value::as_object_mut) {
        Some(params) => take_envelope(params),
        None => Envelope::default(),
    };
    message.insert("id".into(), Value::from(upstream_id));
    Ok(ToLegacy {
        body: serde_json::to_vec(&message).expect("a JSON value serializes"),
        client_id,
        upstream_id,
        method,
        envelope,
    })
}

/// Takes the envelope's keys out of `params._meta`, dropping `_meta` when nothing else is left.
fn take_envelope(params: &mut Map<String, Value>) -> Envelope {
    let Some(Value::Object(meta)) = params.get_mut("_meta") else {
        return Envelope::default();
    };
    let mut take = |key: &str| meta.remove(&format!("{ENVELOPE_PREFIX}{key}"));
    let envelope = Envelope {
        client_info: take("clientInfo"),
        capabilities: take("clientCapabilities"),
        log_level: take("logLevel").and_then(|v| v.as_str().map(str::to_owned)),
    };
    meta.retain(|key, _| !key.starts_with(ENVELOPE_PREFIX));
    if meta.is_empty() {
        params.remove("_meta");
    }
    envelope
}

/// The 2025 server's answer `body` to a bridged `method`, as the 2026 client expects it: its own
/// id back, and a result with `resultType` (and, cacheable, `ttlMs` and `cacheScope`: 0 and
/// private, since a 2025 server says nothing of how long its lists hold). Errors pass with the
/// id replaced.
pub fn answer_to_modern(
    body: &[u8],
    client_id: &Value,
    method: &str,
) -> Result<Vec<u8>, WireError> {
    let mut message = object(body)?;
    if !message.contains_key("id") || message.contains_key("method") {
        return Err(WireError::NotResponse);
    }
    message.insert("id".into(), client_id.clone());
    let is_error = message.contains_key("error");
    match message.get_mut("result") {
        Some(Value::Object(result)) => {
            result
                .entry("resultType")
                .or_insert_with(|| Value::from("complete"));
            if CACHEABLE.contains(&method) {
                result.entry("ttlMs").or_insert_with(|| Value::from(0));
                result
                    .entry("cacheScope")
                    .or_insert_with(|| Value::from("private"));
            }
        }
        Some(_) => return Err(WireError::NotResponse),
        None if is_error => {}
        None => return Err(WireError::NotResponse),
    }
    Ok(serde_json::to_vec(&message).expect("a JSON value serializes"))
}

/// What becomes of one message the server sent on a bridged request's event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum EventOut {
    /// Passed as it came (a progress notification: the same in both eras; what is not JSON-RPC).
    Pass,
    /// Not for a 2026 client: a log message it did not ask for (it opts in per request, build
    /// order step 3), a request of the server's (2026 asks for input by answering with an input
    /// round, step 4).
    Drop,
    /// The answer to the bridged request, translated by [`answer_to_modern`].
    Answer(Vec<u8>),
    /// The server asks the client for input during a call: an input round
    /// (src/bridge/rounds.rs).
    Ask(Ask),
}

/// The log levels of MCP (syslog's), least severe first.
pub const LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// Where `level` stands among [`LEVELS`]; `None` for a name that is none of them.
pub fn level_rank(level: &str) -> Option<usize> {
    LEVELS.iter().position(|l| *l == level)
}

/// The request an event stream answers, as the bridge sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The id it went upstream with.
    pub upstream_id: u64,
    /// The client's id.
    pub client_id: Value,
    pub method: String,
    /// The level from which the request opted in to log messages (its envelope's `logLevel`).
    pub log_level: Option<String>,
}

/// The 2026 form of one event's `data` on the stream answering the bridged request `sent`.
pub fn event_to_modern(data: &[u8], sent: &Sent) -> EventOut {
    let Ok(message) = object(data) else {
        return EventOut::Pass;
    };
    let (upstream_id, client_id, method) = (sent.upstream_id, &sent.client_id, &sent.method);
    match (message.get("method"), message.get("id")) {
        (Some(Value::String(m)), None) if m == "notifications/message" => {
            // A 2026 server sends a request's log messages only when it opted in, and only at
            // or above its level; the session's level may be lower (another request's).
            let level = message
                .get("params")
                .and_then(|p| p.get("level"))
                .and_then(Value::as_str)
                .and_then(level_rank);
            let wanted = sent.log_level.as_deref().and_then(level_rank);
            match (level, wanted) {
                (Some(level), Some(wanted)) if level >= wanted => EventOut::Pass,
                _ => EventOut::Drop,
            }
        }
        (Some(_), None) => EventOut::Pass,
        (Some(_), Some(_)) => ask_of(&message, sent).map_or(EventOut::Drop, EventOut::Ask),
        (None, Some(id)) if id.as_u64() == Some(upstream_id) => {
            match answer_to_modern(data, client_id, method) {
                Ok(answer) => EventOut::Answer(answer),
                Err(_) => EventOut::Pass,
            }
        }
        (None, _) => EventOut::Pass,
    }
}

/// A server's requests to its client that a 2026 client answers in an input round.
const INPUT_METHODS: [&str; 3] = ["elicitation/create", "sampling/createMessage", "roots/list"];

/// The requests a 2026 server may answer with an input round (the spec's "Supported Requests").
const ROUND_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

/// A server's request for input, read off the stream answering a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The id the server gave it: its answer goes back with it.
    pub id: Value,
    pub method: String,
    pub params: Option<Value>,
}

/// The server's request in the event `message`, when the call `sent` may be answered with an
/// input round.
pub fn ask_of(message: &Map<String, Value>, sent: &Sent) -> Option<Ask> {
    let method = message.get("method")?.as_str()?;
    let id = message.get("id")?;
    if !INPUT_METHODS.contains(&method) || !ROUND_METHODS.contains(&sent.method.as_str()) {
        return None;
    }
    Some(Ask {
        id: id.clone(),
        method: method.to_owned(),
        params: message.get("params").cloned(),
    })
}

/// The answer that ends the client's stream: an input round asking `ask`, resumed with `state`.
/// The key of its one input request is the method asked.
pub fn input_required(client_id: &Value, ask: &Ask, state: &str) -> Vec<u8> {
    let mut request = Map::new();
    request.insert("method".into(), Value::from(ask.method.as_str()));
    if let Some(params) = &ask.params {
        request.insert("params".into(), params.clone());
    }
    let message = serde_json::json!({
        "jsonrpc": "2.0",
        "id": client_id,
        "result": {
            "resultType": "input_required",
            "inputRequests": {ask.method.as_str(): request},
            "requestState": state,
        },
    });
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// The DiscoverResult of a 2025 server, from its answer to `initialize`: the 2026 revision (the
/// bridge speaks it for the server), the server's capabilities, instructions and serverInfo, not
/// cached by the client (a 2025 server says nothing of how long they hold).
pub fn discover_result(initialized: &Value) -> Value {
    let mut result = Map::new();
    result.insert("supportedVersions".into(), serde_json::json!([MODERN]));
    let capabilities = initialized.get("capabilities").cloned();
    result.insert(
        "capabilities".into(),
        capabilities.unwrap_or_else(|| Value::Object(Map::new())),
    );
    if let Some(instructions) = initialized.get("instructions") {
        result.insert("instructions".into(), instructions.clone());
    }
    result.insert("resultType".into(), "complete".into());
    result.insert("ttlMs".into(), 0.into());
    result.insert("cacheScope".into(), "private".into());
    if let Some(info) = initialized.get("serverInfo") {
        let meta = serde_json::json!({ format!("{ENVELOPE_PREFIX}serverInfo"): info });
        result.insert("_meta".into(), meta);
    }
    Value::Object(result)
}

/// A JSON-RPC response to request `id` with `result`.
pub fn result_for(id: &Value, result: Value) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The `initialize` the bridge opens a 2025 session with for a 2026 client: its capabilities
/// (without `roots.listChanged`, a notification a 2026 client never sends) and its `clientInfo`
/// (holdfast's when it gave none), at [`LEGACY`].
pub fn legacy_initialize(envelope: &Envelope, id: u64) -> Vec<u8> {
    let mut capabilities = match &envelope.capabilities {
        Some(Value::Object(c)) => c.clone(),
        _ => Map::new(),
    };
    if let Some(Value::Object(roots)) = capabilities.get_mut("roots") {
        roots.remove("listChanged");
    }
    let client_info = envelope.client_info.clone().unwrap_or_else(
        || serde_json::json!({"name": "holdfast", "version": env!("CARGO_PKG_VERSION")}),
    );
    let message = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": capabilities,
            "clientInfo": client_info,
        },
    });
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// A 2026 request's headers made a 2025 one's: the routing headers (`Mcp-Method`, `Mcp-Name`,
/// `Mcp-Param-*`) removed, since a 2025 server knows none of them and the body they mirrored
/// changed; the version and the session set.
pub fn headers_to_legacy(headers: &mut HeaderMap, version: &str, session: HeaderValue) {
    let routing: Vec<_> = headers
        .keys()
        .filter(|name| {
            let n = name.as_str();
            *name == MCP_METHOD || *name == MCP_NAME || n.starts_with("mcp-param-")
        })
        .cloned()
        .collect();
    for name in routing {
        headers.remove(name);
    }
    headers.remove(http::header::CONTENT_LENGTH);
    let version = HeaderValue::from_str(version).expect("a version is a header value");
    headers.insert(MCP_PROTOCOL_VERSION, version);
    headers.insert(MCP_SESSION_ID, session);
}

/// One JSON-RPC 2.0 message as an object.
fn object(body: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(message)) if message.get("jsonrpc") == Some(&Value::from("2.0")) => {
            Ok(message)
        }
        Ok(_) => Err(WireError::NotJsonRpc("not a JSON-RPC 2.0 object".into())),
        Err(e) => Err(WireError::NotJsonRpc(e.to_string())),
    }
}

#[cfg(test)]
mod tests;
