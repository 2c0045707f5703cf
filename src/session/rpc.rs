//! The few JSON-RPC facts session continuity needs, read from bodies holdfast already holds.
//!
//! Nothing here is on the path of an ordinary request: [`state_changes`] first looks for a `/`
//! that could belong to one of three method names and parses only when it finds one, and
//! [`initialize`] runs only for a response that handed out a new `Mcp-Session-Id`.

use bytes::Bytes;
use serde_json::Value;

/// The JSON-RPC method that opens a session.
pub const INITIALIZE: &str = "initialize";

/// An `initialize` request, as far as a resume needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initialize {
    /// `params.protocolVersion`: what the client asked for (the server usually agrees; the
    /// version the client then sends in `MCP-Protocol-Version` replaces it).
    pub protocol_version: Option<String>,
}

/// Reads `body` as a single JSON-RPC `initialize` request (`crate::jsonrpc`). A batch, a
/// notification or anything that does not parse is not one: such a session is not tracked.
pub fn initialize(body: &[u8]) -> Option<Initialize> {
    let message = crate::jsonrpc::one(body)?;
    if message.method() != Some(INITIALIZE) || message.request_id().is_none() {
        return None;
    }
    Some(Initialize {
        protocol_version: message.param_str("protocolVersion"),
    })
}

/// A request that changes what the server keeps for the session, so a resume applies it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// `logging/setLevel`: the level the server logs at for this session.
    SetLevel(String),
    /// `resources/subscribe`: updates of this URI are wanted.
    Subscribe(String),
    /// `resources/unsubscribe`: no longer.
    Unsubscribe(String),
}

/// The state-changing requests in `body` (one request or a batch), in order. Cheap for every
/// other body: it parses only when a method name could be there.
pub fn state_changes(body: &[u8]) -> Vec<StateChange> {
    if !mentions_state_method(body) {
        return Vec::new();
    }
    match crate::jsonrpc::read(body) {
        crate::jsonrpc::Read::One(message) => state_change(&message).into_iter().collect(),
        crate::jsonrpc::Read::Batch(batch) => batch.iter().filter_map(state_change).collect(),
        crate::jsonrpc::Read::Not => Vec::new(),
    }
}

fn state_change(message: &crate::jsonrpc::Message<'_>) -> Option<StateChange> {
    // A notification (no id) is not answered, so nothing says it worked: not recorded.
    message.request_id()?;
    match message.method()? {
        "logging/setLevel" => message.param_str("level").map(StateChange::SetLevel),
        "resources/subscribe" => message.param_str("uri").map(StateChange::Subscribe),
        "resources/unsubscribe" => message.param_str("uri").map(StateChange::Unsubscribe),
        _ => None,
    }
}

/// Whether `body` has a `/` between `logging` and `setLevel`, or between `resources` and
/// `subscribe`/`unsubscribe`. One pass over the bytes; no allocation.
fn mentions_state_method(body: &[u8]) -> bool {
    body.iter().enumerate().any(|(i, &b)| {
        if b != b'/' {
            return false;
        }
        let (before, after) = (&body[..i], &body[i + 1..]);
        (before.ends_with(b"logging") && after.starts_with(b"setLevel"))
            || (before.ends_with(b"resources")
                && (after.starts_with(b"subscribe") || after.starts_with(b"unsubscribe")))
    })
}

/// A `ping`, which every server answers on a session it knows: holdfast's check that a 404 means
/// the session is gone.
pub fn ping_request() -> Bytes {
    Bytes::from_static(br#"{"jsonrpc":"2.0","id":"holdfast-ping","method":"ping"}"#)
}

/// `notifications/initialized`, sent after a re-initialize as the client did after its own.
pub fn initialized_notification() -> Bytes {
    Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
}

/// The request that applies `change` again. Ids are holdfast's own (`holdfast-resume-N`): the
/// answers come back to holdfast, never to the client.
pub fn replay_request(n: usize, change: &StateChange) -> Bytes {
    let (method, params) = match change {
        StateChange::SetLevel(level) => ("logging/setLevel", serde_json::json!({ "level": level })),
        StateChange::Subscribe(uri) => ("resources/subscribe", serde_json::json!({ "uri": uri })),
        StateChange::Unsubscribe(uri) => {
            ("resources/unsubscribe", serde_json::json!({ "uri": uri }))
        }
    };
    let request = serde_json::json!({
        "jsonrpc": "2.0",
        "id": format!("holdfast-resume-{n}"),
        "method": method,
        "params": params,
    });
    Bytes::from(request.to_string())
}

/// Page `n` of a list (`tools/list` and the like) after `cursor`, asked on a re-established
/// session to learn what the new server offers. Ids are holdfast's own (`holdfast-list-N`).
pub fn list_request(method: &str, n: usize, cursor: Option<&str>) -> Bytes {
    let params = match cursor {
        Some(cursor) => serde_json::json!({ "cursor": cursor }),
        None => serde_json::json!({}),
    };
    let request = serde_json::json!({
        "jsonrpc": "2.0",
        "id": format!("holdfast-list-{n}"),
        "method": method,
        "params": params,
    });
    Bytes::from(request.to_string())
}

/// What the server answered to a request holdfast sent on its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A JSON-RPC result.
    Result(Value),
    /// A JSON-RPC error: its code and message.
    Error(i64, String),
    /// No JSON-RPC response (yet) in what was read.
    Nothing,
}

/// Finds the JSON-RPC response in an answer body: `application/json`, or the `data` of the
/// events of a `text/event-stream`, read by the one event reader (`crate::sse`; the first
/// event whose data is a response wins; priming events with empty data are skipped).
pub fn reply(is_sse: bool, body: &[u8]) -> Reply {
    if !is_sse {
        return response(body);
    }
    // Only complete events are read: one cut off before its empty line is not yet an answer.
    let mut found = Reply::Nothing;
    crate::sse::Parser::new(body.len()).feed(body, |event| {
        if found != Reply::Nothing || event.data.is_empty() {
            return;
        }
        found = response(event.data.as_bytes());
    });
    found
}

/// The response in one message's text, read by `crate::jsonrpc`.
fn response(text: &[u8]) -> Reply {
    let Some(message) = crate::jsonrpc::one(text) else {
        return Reply::Nothing;
    };
    if let Some(result) = message.result() {
        return Reply::Result(result);
    }
    match message.error() {
        Some((code, text)) => Reply::Error(code, text),
        None => Reply::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialize_is_one_request_with_an_id() {
        let body = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        assert_eq!(
            initialize(body),
            Some(Initialize {
                protocol_version: Some("2025-06-18".into())
            })
        );
        // A notification, a batch, another method, broken JSON: not tracked.
        assert_eq!(
            initialize(br#"{"jsonrpc":"2.0","method":"initialize"}"#),
            None
        );
        assert_eq!(
            initialize(br#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#),
            None
        );
        assert_eq!(
            initialize(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(initialize(b"{\"jsonrpc\":\"2.0\",\"id\":1,"), None);
    }

    #[test]
    fn state_changes_in_requests_and_batches() {
        let single =
            br#"{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"debug"}}"#;
        assert_eq!(
            state_changes(single),
            vec![StateChange::SetLevel("debug".into())]
        );
        let batch = br#"[{"jsonrpc":"2.0","id":4,"method":"resources/subscribe","params":{"uri":"file:///a"}},
            {"jsonrpc":"2.0","id":5,"method":"resources/unsubscribe","params":{"uri":"file:///b"}},
            {"jsonrpc":"2.0","method":"logging/setLevel","params":{"level":"info"}}]"#;
        assert_eq!(
            state_changes(batch),
            vec![
                StateChange::Subscribe("file:///a".into()),
                StateChange::Unsubscribe("file:///b".into()),
            ]
        );
        // A tool call mentioning the name in its arguments is not a state change.
        let call = br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"logging/setLevel"}}}"#;
        assert!(state_changes(call).is_empty());
        assert!(state_changes(br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#).is_empty());
    }

    #[test]
    fn replies_from_json_and_event_streams() {
        assert_eq!(
            reply(
                false,
                br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18"}}"#
            ),
            Reply::Result(serde_json::json!({"protocolVersion":"2025-06-18"}))
        );
        assert_eq!(
            reply(
                false,
                br#"{"jsonrpc":"2.0","id":0,"error":{"code":-32600,"message":"no"}}"#
            ),
            Reply::Error(-32600, "no".into())
        );
        // rmcp primes the stream with an event without data, then sends the response.
        let sse = b"id: 0\nretry: 3000\ndata:\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\r\n\r\n";
        assert_eq!(reply(true, sse), Reply::Result(serde_json::json!({})));
        // An event cut off before its blank line is not read yet.
        assert_eq!(
            reply(
                true,
                b"data: {\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\n"
            ),
            Reply::Nothing
        );
        assert_eq!(reply(false, b"not json"), Reply::Nothing);
        // A server that ends its lines with a lone CR, after a BOM.
        let cr = b"\xEF\xBB\xBFid: 0\rdata:\r\rdata: {\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{\"a\":1}}\r\r";
        assert_eq!(reply(true, cr), Reply::Result(serde_json::json!({"a":1})));
    }

    #[test]
    fn replayed_requests_carry_holdfast_ids() {
        let body = replay_request(2, &StateChange::SetLevel("warning".into()));
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["id"], "holdfast-resume-2");
        assert_eq!(value["method"], "logging/setLevel");
        assert_eq!(value["params"]["level"], "warning");
    }
}
