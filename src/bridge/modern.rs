//! The era bridge's translations the other way (docs/design/era-bridge.md 3.6): a 2025 client
//! (the handshake, a session) in front of a server that speaks only 2026-07-28. Pure functions:
//! the `initialize` answered from the server's `server/discover`, each request given the 2026
//! envelope (from the client's own `initialize`, which its session token carries) and the
//! routing headers the revision requires.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::{HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

use super::wire::{WireError, LEGACY, MODERN};
use crate::http1::names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};

/// The upstream id sealed into the session token of a 2025 client holdfast answered itself: no
/// server session stands behind it (a 2026-07-28 server has none), and no server ever gives an
/// id holdfast could take for it (it is not a visible-ASCII-only id a server would make: it has
/// a space).
pub const LOCAL_SESSION: &str = "holdfast bridge";

/// The versions of the handshake a 2025 client may ask for, newest first.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The result of the `initialize` holdfast answers for a 2026-07-28-only server: the client's
/// version when it is one of the handshake's (else the newest), the server's capabilities,
/// instructions and identity from its DiscoverResult.
pub fn initialize_result(discovered: &Value, requested: Option<&str>) -> Value {
    let version = requested
        .filter(|v| HANDSHAKE_VERSIONS.contains(v))
        .unwrap_or(LEGACY);
    let server_info = discovered["_meta"]["io.modelcontextprotocol/serverInfo"].clone();
    let server_info = if server_info.is_object() {
        server_info
    } else {
        json!({"name": "holdfast-bridged", "version": env!("CARGO_PKG_VERSION")})
    };
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": discovered.get("capabilities").cloned().unwrap_or_else(|| json!({})),
        "serverInfo": server_info,
    });
    if let Some(instructions) = discovered.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = instructions.clone();
    }
    result
}

/// A 2025 request made a 2026-07-28 one.
#[derive(Debug, Clone, PartialEq)]
pub struct ToModern {
    pub body: Vec<u8>,
    pub method: String,
    /// `Mcp-Name`'s value: the tool's or prompt's name, the resource's URI.
    pub name: Option<String>,
}

/// The 2026 form of the 2025 request `body` of a client whose `initialize` was `initialize`
/// (its capabilities and identity go in every request's `_meta`, as the revision requires).
pub fn request_to_modern(
    body: &[u8],
    initialize: Option<&[u8]>,
    log_level: Option<&str>,
) -> Result<ToModern, WireError> {
    let mut message = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) if m.get("jsonrpc") == Some(&Value::from("2.0")) => m,
        Ok(_) => return Err(WireError::NotJsonRpc("not a JSON-RPC 2.0 object".into())),
        Err(e) => return Err(WireError::NotJsonRpc(e.to_string())),
    };
    let method = match (message.get("method"), message.get("id")) {
        (Some(Value::String(m)), Some(Value::String(_) | Value::Number(_))) => m.clone(),
        _ => return Err(WireError::NotRequest),
    };
    let hello: Value = initialize
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let params = message
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(params) = params else {
        return Err(WireError::NotRequest);
    };
    let name_key = if method == "resources/read" {
        "uri"
    } else {
        "name"
    };
    let name = match method.as_str() {
        "tools/call" | "prompts/get" | "resources/read" => params
            .get(name_key)
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        let capabilities = hello["params"]["capabilities"].clone();
        let capabilities = if capabilities.is_object() {
            capabilities
        } else {
            json!({})
        };
        meta.insert(
            "io.modelcontextprotocol/protocolVersion".into(),
            Value::from(MODERN),
        );
        meta.insert(
            "io.modelcontextprotocol/clientCapabilities".into(),
            capabilities,
        );
        if hello["params"]["clientInfo"].is_object() {
            meta.insert(
                "io.modelcontextprotocol/clientInfo".into(),
                hello["params"]["clientInfo"].clone(),
            );
        }
        // The level the session was set to: 2026 sends a request's log messages only when it
        // opts in.
        if let Some(level) = log_level {
            meta.insert("io.modelcontextprotocol/logLevel".into(), level.into());
        }
    }
    Ok(ToModern {
        body: serde_json::to_vec(&message).expect("a JSON value serializes"),
        method,
        name,
    })
}

/// Whether a 2026-07-28 server may ask the client of `initialize` for input: it declared a
/// capability to answer (elicitation, sampling, roots). A server asks only what the client can
/// answer, so the calls of other clients are not watched for input rounds.
pub fn may_be_asked(initialize: Option<&[u8]>) -> bool {
    let hello: Value = initialize
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let capabilities = &hello["params"]["capabilities"];
    ["elicitation", "sampling", "roots"]
        .iter()
        .any(|c| capabilities.get(c).is_some())
}

/// The routing headers of a 2026-07-28 request: the version, `Mcp-Method`, and `Mcp-Name` when
/// it has a name.
pub fn routing_headers(method: &str, name: Option<&str>) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![
        (MCP_PROTOCOL_VERSION, HeaderValue::from_static(MODERN)),
        (MCP_METHOD, header_value(method)),
    ];
    if let Some(name) = name {
        headers.push((MCP_NAME, header_value(name)));
    }
    headers
}

/// A value as the revision writes it in a header: as it is when it is printable ASCII without
/// spaces at its edges and does not look like the encoding, else `=?base64?…?=`.
pub fn header_value(value: &str) -> HeaderValue {
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with("=?base64?");
    if plain {
        if let Ok(v) = HeaderValue::from_str(value) {
            return v;
        }
    }
    let encoded = format!("=?base64?{}?=", STANDARD.encode(value.as_bytes()));
    HeaderValue::from_str(&encoded).expect("base64 is a header value")
}

/// The arguments of one tool the revision mirrors in headers: each argument's path (a chain of
/// `properties` keys) and its `x-mcp-header` token.
pub type Mirrored = Vec<(Vec<String>, String)>;

/// Deepest `properties` chain followed: schemas are finite, this only bounds a hostile one.
const MAX_DEPTH: usize = 32;

/// What each tool of a `tools/list` result mirrors in headers (tools that mirror nothing are
/// listed with nothing).
pub fn mirrored(listed: &Value) -> Vec<(String, Mirrored)> {
    let Some(tools) = listed["tools"].as_array() else {
        return Vec::new();
    };
    tools
        .iter()
        .filter_map(|tool| {
            let name = tool["name"].as_str()?.to_owned();
            let mut found = Vec::new();
            walk(&tool["inputSchema"], &mut Vec::new(), &mut found);
            Some((name, found))
        })
        .collect()
}

/// The `x-mcp-header` annotations under `schema`, reached through `properties` only (as the
/// revision says: a property under another applicator is not mirrored).
fn walk(schema: &Value, path: &mut Vec<String>, found: &mut Mirrored) {
    if path.len() > MAX_DEPTH {
        return;
    }
    if !path.is_empty() {
        if let Some(token) = schema.get("x-mcp-header").and_then(Value::as_str) {
            found.push((path.clone(), token.to_owned()));
        }
    }
    if let Some(Value::Object(properties)) = schema.get("properties") {
        for (name, sub) in properties {
            path.push(name.clone());
            walk(sub, path, found);
            path.pop();
        }
    }
}

/// The `Mcp-Param-*` headers of a `tools/call` with `arguments`: each mirrored argument that is
/// present and a scalar (`true`/`false` for booleans), encoded as [`header_value`].
pub fn param_headers(mirrored: &Mirrored, arguments: &Value) -> Vec<(HeaderName, HeaderValue)> {
    mirrored
        .iter()
        .filter_map(|(path, token)| {
            let value = path.iter().try_fold(arguments, |node, key| node.get(key))?;
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ => return None,
            };
            let name = HeaderName::from_bytes(format!("mcp-param-{token}").as_bytes()).ok()?;
            Some((name, header_value(&text)))
        })
        .collect()
}

/// What a listen for a 2025 client's GET stream asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen<'a> {
    /// The stream's own listen: every list change the server's capabilities say it announces
    /// (a 2026 server sends only what was asked for), and the updates of the URIs the session
    /// subscribed to.
    Everything(&'a [String]),
    /// One more listen on an open stream, for the updates of a URI subscribed since.
    Updates(&'a str),
}

/// The `subscriptions/listen` request of `what`. `None` when the server announces none of it:
/// there is nothing to listen for.
pub fn listen_request(
    discovered: &Value,
    id: u64,
    initialize: Option<&[u8]>,
    what: Listen<'_>,
) -> Option<Vec<u8>> {
    let capabilities = &discovered["capabilities"];
    let mut notifications = Map::new();
    let uris: Vec<&str> = match what {
        Listen::Everything(uris) => {
            for (capability, kind) in [
                ("tools", "toolsListChanged"),
                ("prompts", "promptsListChanged"),
                ("resources", "resourcesListChanged"),
            ] {
                if capabilities[capability]["listChanged"] == true {
                    notifications.insert(kind.into(), Value::Bool(true));
                }
            }
            uris.iter().map(String::as_str).collect()
        }
        Listen::Updates(uri) => vec![uri],
    };
    if capabilities["resources"]["subscribe"] == true && !uris.is_empty() {
        notifications.insert("resourceSubscriptions".into(), json!(uris));
    }
    if notifications.is_empty() {
        return None;
    }
    let listen = json!({
        "jsonrpc": "2.0",
        "id": format!("hf-listen-{id}"),
        "method": "subscriptions/listen",
        "params": {"notifications": notifications},
    });
    request_to_modern(listen.to_string().as_bytes(), initialize, None)
        .ok()
        .map(|r| r.body)
}

/// One event of a `subscriptions/listen` stream as a 2025 client's GET stream carries it: the
/// acknowledgement and the listen's closing result are the 2026 client's only, dropped; the
/// notifications pass (their `_meta.subscriptionId` is one more `_meta` key to a 2025 client).
pub fn listen_event(data: &[u8]) -> super::wire::EventOut {
    use super::wire::EventOut;
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(data) else {
        return EventOut::Pass;
    };
    match message.get("method").and_then(Value::as_str) {
        Some("notifications/subscriptions/acknowledged") => EventOut::Drop,
        Some(_) => EventOut::Pass,
        None if message.contains_key("id") => EventOut::Drop,
        None => EventOut::Pass,
    }
}

/// What holdfast answers itself for a 2025 client of a 2026-07-28-only server: the methods and
/// messages the revision dropped.
#[derive(Debug, Clone, PartialEq)]
pub enum Local {
    /// An empty result (`ping`, and what names nothing to keep).
    Empty(Value),
    /// `logging/setLevel` to a level of [`super::wire::LEVELS`]: an empty result, and the
    /// session's later requests opt in to log messages from that level (`logLevel`).
    SetLevel(Value, &'static str),
    /// `resources/subscribe` of a URI: an empty result, and the session's GET stream listens
    /// for its updates.
    Subscribe(Value, String),
    /// `resources/unsubscribe` of a URI: an empty result, and the session's next GET stream
    /// leaves it out.
    Unsubscribe(Value, String),
    /// A notification or a response of the client's: taken, nowhere to go (202).
    Accepted,
}

/// Whether holdfast answers `body` itself, and how.
pub fn local(body: &[u8]) -> Option<Local> {
    let message: Value = serde_json::from_slice(body).ok()?;
    let id = message
        .get("id")
        .filter(|id| id.is_string() || id.is_number());
    match (message.get("method").and_then(Value::as_str), id) {
        (Some("logging/setLevel"), Some(id)) => {
            let level = message["params"]["level"]
                .as_str()
                .and_then(super::wire::level_rank);
            Some(match level {
                Some(rank) => Local::SetLevel(id.clone(), super::wire::LEVELS[rank]),
                None => Local::Empty(id.clone()),
            })
        }
        (Some(method @ ("resources/subscribe" | "resources/unsubscribe")), Some(id)) => {
            let uri = message["params"]["uri"].as_str().map(str::to_owned);
            Some(match (method, uri) {
                ("resources/subscribe", Some(uri)) => Local::Subscribe(id.clone(), uri),
                (_, Some(uri)) => Local::Unsubscribe(id.clone(), uri),
                (_, None) => Local::Empty(id.clone()),
            })
        }
        (Some("ping"), Some(id)) => Some(Local::Empty(id.clone())),
        // Notifications (initialized, cancelled, roots changed) and answers to requests.
        (Some(_), None) | (None, Some(_)) => Some(Local::Accepted),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialize_is_answered_from_the_discover_result() {
        let discovered = json!({
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {"listChanged": true}},
            "instructions": "be nice",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}},
        });
        let result = initialize_result(&discovered, Some("2025-06-18"));
        assert_eq!(result["protocolVersion"], "2025-06-18");
        assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(result["serverInfo"]["name"], "s");
        assert_eq!(result["instructions"], "be nice");
        // A version of no handshake gets the newest.
        let result = initialize_result(&json!({}), Some("2026-07-28"));
        assert_eq!(result["protocolVersion"], LEGACY);
        assert!(result["serverInfo"]["name"].is_string());
        assert_eq!(result["capabilities"], json!({}));
    }

    #[test]
    fn a_request_gets_the_clients_envelope_and_its_name() {
        let hello = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"c","version":"2"}}}"#;
        let call = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"_meta":{"progressToken":7}}}"#;
        let out = request_to_modern(call, Some(hello), Some("warning")).unwrap();
        assert_eq!(out.method, "tools/call");
        assert_eq!(out.name.as_deref(), Some("echo"));
        let body: Value = serde_json::from_slice(&out.body).unwrap();
        let meta = &body["params"]["_meta"];
        assert_eq!(meta["io.modelcontextprotocol/protocolVersion"], MODERN);
        assert_eq!(
            meta["io.modelcontextprotocol/clientCapabilities"]["sampling"],
            json!({})
        );
        assert_eq!(meta["io.modelcontextprotocol/clientInfo"]["name"], "c");
        assert_eq!(meta["io.modelcontextprotocol/logLevel"], "warning");
        assert_eq!(meta["progressToken"], 7, "kept");
        assert_eq!(
            body["id"], 5,
            "the client's id: no session is shared upstream"
        );
        let read =
            br#"{"jsonrpc":"2.0","id":"r","method":"resources/read","params":{"uri":"note://1"}}"#;
        let out = request_to_modern(read, None, None).unwrap();
        assert_eq!(out.name.as_deref(), Some("note://1"));
        let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let out = request_to_modern(list, None, None).unwrap();
        let body: Value = serde_json::from_slice(&out.body).unwrap();
        assert!(body["params"]["_meta"]
            .get("io.modelcontextprotocol/logLevel")
            .is_none());
        assert_eq!(
            body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"],
            json!({})
        );
        assert_eq!(out.name, None);
        assert_eq!(
            request_to_modern(
                br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                None,
                None
            ),
            Err(WireError::NotRequest)
        );
    }

    #[test]
    fn header_values_are_plain_or_base64_as_the_revision_says() {
        assert_eq!(header_value("echo"), "echo");
        assert_eq!(header_value("note://1"), "note://1");
        assert_eq!(header_value("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(header_value(" edge"), "=?base64?IGVkZ2U=?=");
        assert_eq!(header_value("=?base64?x?="), "=?base64?PT9iYXNlNjQ/eD89?=");
        let headers = routing_headers("tools/call", Some("echo"));
        assert_eq!(headers.len(), 3);
        assert_eq!(routing_headers("tools/list", None).len(), 2);
    }

    #[test]
    fn mirrored_arguments_become_param_headers() {
        let listed = json!({"tools": [
            {"name": "region", "inputSchema": {"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "q": {"type": "string"},
                "opts": {"type": "object", "properties": {
                    "fast": {"type": "boolean", "x-mcp-header": "Fast"},
                }},
                "any": {"anyOf": [{"x-mcp-header": "Never"}]},
            }}},
            {"name": "plain", "inputSchema": {"type": "object"}},
        ]});
        let tools = mirrored(&listed);
        assert_eq!(tools.len(), 2);
        let (name, region) = &tools[0];
        assert_eq!(name, "region");
        assert_eq!(region.len(), 2, "{region:?}: not through anyOf");
        assert!(tools[1].1.is_empty());
        let headers = param_headers(
            region,
            &json!({"region": "eu west ", "q": "x", "opts": {"fast": true}}),
        );
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert!(headers.contains(&("mcp-param-region".into(), "=?base64?ZXUgd2VzdCA=?=".into())));
        assert!(headers.contains(&("mcp-param-fast".into(), "true".into())));
        // Absent or null: no header.
        assert!(param_headers(region, &json!({"q": "x", "region": null})).is_empty());
    }

    #[test]
    fn a_get_stream_listens_for_what_the_server_announces() {
        let discovered = json!({"capabilities": {
            "tools": {"listChanged": true},
            "prompts": {"listChanged": false},
            "resources": {"subscribe": true},
        }});
        let body = listen_request(&discovered, 3, None, Listen::Everything(&[])).expect("tools");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["method"], "subscriptions/listen");
        assert_eq!(body["id"], "hf-listen-3");
        assert_eq!(
            body["params"]["notifications"],
            json!({"toolsListChanged": true})
        );
        assert_eq!(
            body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            MODERN
        );
        let nothing = json!({"capabilities": {}});
        assert_eq!(
            listen_request(&nothing, 1, None, Listen::Everything(&[])),
            None
        );
        // The session's subscriptions, on its stream and one more on an open one.
        let uris = ["note://1".to_owned()];
        let body = listen_request(&discovered, 4, None, Listen::Everything(&uris)).unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["params"]["notifications"],
            json!({"toolsListChanged": true, "resourceSubscriptions": ["note://1"]})
        );
        let body = listen_request(&discovered, 5, None, Listen::Updates("note://2")).unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["params"]["notifications"],
            json!({"resourceSubscriptions": ["note://2"]})
        );
        assert_eq!(
            listen_request(&nothing, 6, None, Listen::Updates("note://2")),
            None,
            "the server takes no subscriptions"
        );
        use crate::bridge::wire::EventOut;
        let ack =
            br#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{}}"#;
        assert_eq!(listen_event(ack), EventOut::Drop);
        let changed =
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{}}"#;
        assert_eq!(listen_event(changed), EventOut::Pass);
        let end = br#"{"jsonrpc":"2.0","id":"hf-listen-3","result":{}}"#;
        assert_eq!(listen_event(end), EventOut::Drop);
    }

    #[test]
    fn only_a_client_that_can_answer_may_be_asked() {
        let hello = |caps: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"capabilities":{caps}}}}}"#
            )
        };
        assert!(may_be_asked(Some(
            hello(r#"{"elicitation":{}}"#).as_bytes()
        )));
        assert!(may_be_asked(Some(hello(r#"{"sampling":{}}"#).as_bytes())));
        assert!(!may_be_asked(Some(
            hello(r#"{"experimental":{}}"#).as_bytes()
        )));
        assert!(!may_be_asked(None));
    }

    #[test]
    fn what_the_revision_dropped_is_answered_locally() {
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#),
            Some(Local::Empty(json!(3)))
        );
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","id":"a","method":"logging/setLevel","params":{"level":"info"}}"#),
            Some(Local::SetLevel(json!("a"), "info"))
        );
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","id":"b","method":"logging/setLevel","params":{"level":"loud"}}"#),
            Some(Local::Empty(json!("b"))),
            "no level to keep"
        );
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Some(Local::Accepted)
        );
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Some(Local::Accepted)
        );
        assert_eq!(
            local(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        // A 2026 server has no such method: its 404 would fail the client's subscribe.
        let subscribe =
            br#"{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"n://1"}}"#;
        assert_eq!(
            local(subscribe),
            Some(Local::Subscribe(json!(2), "n://1".into()))
        );
        let unsubscribe =
            br#"{"jsonrpc":"2.0","id":3,"method":"resources/unsubscribe","params":{"uri":"n://1"}}"#;
        assert_eq!(
            local(unsubscribe),
            Some(Local::Unsubscribe(json!(3), "n://1".into()))
        );
        let no_uri = br#"{"jsonrpc":"2.0","id":4,"method":"resources/subscribe"}"#;
        assert_eq!(local(no_uri), Some(Local::Empty(json!(4))));
    }
}
