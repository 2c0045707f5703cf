//! What the server speaks, as the bridge learns it: its answer to a `server/discover` of the
//! 2026-07-28 revision decides. A pure reading: the exchange that asks is the proxy's.

use http::StatusCode;
use serde_json::Value;

use super::wire::MODERN;
use crate::session::rpc::Reply;

/// The server's era, as far as the bridge knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// Not asked yet, or its answer said nothing (an outage, a server error).
    Unknown,
    /// It answers `server/discover` naming 2026-07-28: a 2026 client's requests pass unchanged.
    /// Whether it takes the 2025 handshake too is not known yet: the next 2025 `initialize` is
    /// sent to find out (a server lists only its 2026 revisions in its DiscoverResult, the
    /// Python SDK's among them, even when it speaks both).
    Modern,
    /// It speaks 2026-07-28 and refused a 2025 `initialize`: a 2025 client's requests are
    /// bridged to 2026-07-28.
    ModernOnly,
    /// It speaks 2026-07-28 and took a 2025 `initialize`: every client passes in its revision.
    Both,
    /// It refuses `server/discover` as a 2025 server does (a 4xx, a JSON-RPC error, no such
    /// method): a 2026 client's requests are bridged to a session of the 2025 revision.
    Legacy,
}

impl Era {
    /// Whether the server speaks 2026-07-28 (whatever else it speaks).
    pub fn speaks_modern(self) -> bool {
        matches!(self, Era::Modern | Era::ModernOnly | Era::Both)
    }
}

/// Whether `status` is an answer about the client rather than about the revision (it needs
/// credentials, may not, is too fast, took too long): such an answer decides no era, however
/// its body reads. Under OAuth the first request of a login is unauthenticated: its 401 must not
/// make a 2026-07-28 server a 2025 one for every client after it.
pub fn about_the_client(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 407 | 408 | 429)
}

/// The era a `server/discover` answered with `status` and `reply` shows. Only a clear answer
/// decides: a 5xx (a server failing, holdfast's own 503 of an outage) leaves it unknown, to be
/// asked again, and so does an answer about the client ([`about_the_client`]).
pub fn from_discover(status: StatusCode, reply: &Reply) -> Era {
    if status.is_server_error() || about_the_client(status) {
        return Era::Unknown;
    }
    match reply {
        Reply::Result(result) if status.is_success() && names_modern(result) => Era::Modern,
        // A success without a DiscoverResult naming the revision is no 2026 server either.
        Reply::Result(_) | Reply::Error(..) => Era::Legacy,
        // A 4xx without JSON-RPC (a 2025 server's plain 400 or 406, a 404 of its router for the
        // method) refuses the revision; a 2xx saying nothing is no answer.
        Reply::Nothing if status.is_client_error() => Era::Legacy,
        Reply::Nothing => Era::Unknown,
    }
}

/// The era a server of 2026-07-28 shows by its answer (`status`, `reply`) to a 2025
/// `initialize`: [`Era::Both`] when it took it, [`Era::ModernOnly`] when it refused the revision
/// (the 400 of a server that wants a 2026 request, a 404 or 405 of no such endpoint, a JSON-RPC
/// error), `None` when the answer says neither: a server's failure, or an answer about the
/// client ([`about_the_client`]), which is the client's to see.
pub fn from_handshake(status: StatusCode, reply: &Reply) -> Option<Era> {
    let took = match reply {
        Reply::Result(result) => status.is_success() && result.get("protocolVersion").is_some(),
        Reply::Error(..) | Reply::Nothing => false,
    };
    if took {
        return Some(Era::Both);
    }
    if status.is_server_error() || about_the_client(status) {
        return None;
    }
    let refused = matches!(
        status,
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    ) || matches!(reply, Reply::Error(..));
    refused.then_some(Era::ModernOnly)
}

/// Whether `body` is an `initialize` whose refusal says something of the server: one request
/// with `params.protocolVersion` (a string), `params.capabilities` and `params.clientInfo`
/// (objects), as every SDK sends it. A refusal of anything less (`"params": {}`) is the
/// request's own fault, and must not make a server of both revisions a 2026-only one.
pub fn well_formed_initialize(body: &[u8]) -> bool {
    let Ok(message) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let params = &message["params"];
    message["method"] == "initialize"
        && message.get("id").is_some()
        && params["protocolVersion"].is_string()
        && params["capabilities"].is_object()
        && params["clientInfo"].is_object()
}

/// Whether a DiscoverResult lists the 2026-07-28 revision.
fn names_modern(result: &Value) -> bool {
    result["supportedVersions"]
        .as_array()
        .is_some_and(|versions| versions.iter().any(|v| v.as_str() == Some(MODERN)))
}

/// A request of the 2026-07-28 revision of holdfast's own: `method` with `params` (an object)
/// and the revision's `_meta`, no capabilities, `client` as the client's name. The probe's and
/// the bridge's, so both ask a server alike.
pub fn modern_request(id: u64, method: &str, mut params: Value, client: &str) -> Value {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {
            "name": client,
            "version": env!("CARGO_PKG_VERSION"),
        },
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// The `server/discover` the bridge asks with.
pub fn discover(id: u64) -> Vec<u8> {
    let message = modern_request(
        id,
        "server/discover",
        serde_json::json!({}),
        "holdfast-bridge",
    );
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_discover_result_naming_the_revision_is_modern() {
        let ok = StatusCode::OK;
        let modern = Reply::Result(json!({"supportedVersions": ["2026-07-28"]}));
        assert_eq!(from_discover(ok, &modern), Era::Modern);
        let other = Reply::Result(json!({"supportedVersions": ["2027-01-01"]}));
        assert_eq!(from_discover(ok, &other), Era::Legacy);
        assert_eq!(from_discover(ok, &Reply::Result(json!({}))), Era::Legacy);
    }

    #[test]
    fn a_2025_servers_refusals_are_legacy_and_failures_say_nothing() {
        // The TypeScript SDK 1.x server: 400 with JSON-RPC -32000 "Server not initialized".
        let refused = Reply::Error(-32000, "Bad Request: Server not initialized".into());
        assert_eq!(
            from_discover(StatusCode::BAD_REQUEST, &refused),
            Era::Legacy
        );
        // A server that knows no such method.
        let unknown = Reply::Error(-32601, "Method not found".into());
        assert_eq!(from_discover(StatusCode::OK, &unknown), Era::Legacy);
        assert_eq!(
            from_discover(StatusCode::NOT_ACCEPTABLE, &Reply::Nothing),
            Era::Legacy
        );
        // An outage's 503 or a crashing server decide nothing.
        let unavailable = Reply::Error(-32603, "unavailable".into());
        assert_eq!(
            from_discover(StatusCode::SERVICE_UNAVAILABLE, &unavailable),
            Era::Unknown
        );
        assert_eq!(from_discover(StatusCode::OK, &Reply::Nothing), Era::Unknown);
        // An answer about the client decides nothing, with a JSON-RPC error body or without.
        let unauthorized = Reply::Error(-32001, "Unauthorized".into());
        for status in [401, 403, 407, 408, 429] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                from_discover(status, &unauthorized),
                Era::Unknown,
                "{status}"
            );
            assert_eq!(
                from_discover(status, &Reply::Nothing),
                Era::Unknown,
                "{status}"
            );
        }
    }

    #[test]
    fn a_handshake_taken_refused_or_about_the_client() {
        let result = Reply::Result(json!({"protocolVersion": "2025-11-25"}));
        assert_eq!(from_handshake(StatusCode::OK, &result), Some(Era::Both));
        let refused = Reply::Error(-32600, "send a 2026-07-28 request".into());
        assert_eq!(
            from_handshake(StatusCode::BAD_REQUEST, &refused),
            Some(Era::ModernOnly)
        );
        assert_eq!(
            from_handshake(StatusCode::METHOD_NOT_ALLOWED, &Reply::Nothing),
            Some(Era::ModernOnly)
        );
        // The unauthenticated first request of an OAuth login, a rate limit, an outage.
        let unauthorized = Reply::Error(-32001, "Unauthorized".into());
        assert_eq!(
            from_handshake(StatusCode::UNAUTHORIZED, &unauthorized),
            None
        );
        assert_eq!(
            from_handshake(StatusCode::TOO_MANY_REQUESTS, &Reply::Nothing),
            None
        );
        assert_eq!(
            from_handshake(StatusCode::SERVICE_UNAVAILABLE, &unauthorized),
            None
        );
        // A 2xx that is no initialize result says nothing either.
        assert_eq!(from_handshake(StatusCode::OK, &Reply::Nothing), None);
    }

    #[test]
    fn only_a_well_formed_initialize_is_one_whose_refusal_counts() {
        let whole = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        assert!(well_formed_initialize(whole));
        for lacking in [
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"capabilities":{},"clientInfo":{}}}"#,
            b"not json",
        ] {
            assert!(!well_formed_initialize(lacking), "{}", String::from_utf8_lossy(lacking));
        }
    }

    #[test]
    fn the_discover_request_is_a_2026_request() {
        let body = discover(7);
        let message: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(message["method"], "server/discover");
        assert_eq!(message["id"], 7);
        assert_eq!(
            message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            MODERN
        );
    }
}
