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

/// The era a `server/discover` answered with `status` and `reply` shows. Only a clear answer
/// decides: a 5xx (a server failing, holdfast's own 503 of an outage) leaves it unknown, to be
/// asked again.
pub fn from_discover(status: StatusCode, reply: &Reply) -> Era {
    if status.is_server_error() {
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
