//! The two protocol eras an endpoint may answer, asked as dual-era clients ask them: the final
//! 2026-07-28 revision's `server/discover` first (stateless; every request names its method in
//! `Mcp-Method` and its version in `MCP-Protocol-Version` and `_meta`), then the 2025 `initialize`
//! handshake. A server may answer either or both; the report says which.

use ::http::header::{HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::Value;

use super::http::Answer;
use super::verdict::{self, Kind, Verdict};
use crate::session::rpc::Reply;

/// The revision `server/discover` is asked at.
pub use crate::bridge::wire::MODERN;

use crate::http1::names::{MCP_METHOD, MCP_PROTOCOL_VERSION};

/// Which eras answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Eras {
    /// The versions `server/discover` named, when it answered with them.
    pub discover: Option<Vec<String>>,
    /// The version the `initialize` handshake settled on, when it succeeded.
    pub initialize: Option<String>,
}

impl Eras {
    /// `server/discover (2026-07-28), initialize (2025-11-25)`, or what answered of it.
    pub fn line(&self) -> String {
        let discover = match &self.discover {
            Some(versions) => format!("server/discover ({})", versions.join(", ")),
            None => "server/discover not answered".to_owned(),
        };
        let initialize = match &self.initialize {
            Some(version) => format!("initialize ({version})"),
            None => "initialize not answered".to_owned(),
        };
        format!("{discover}; {initialize}")
    }
}

impl Eras {
    /// What holdfast's era bridge (`[bridge]`) would do for this server's clients, once the
    /// eras it answers are known.
    pub fn bridge(&self) -> Option<&'static str> {
        match (&self.discover, &self.initialize) {
            (None, Some(_)) => Some(concat!(
                "2025 only: clients of the 2026-07-28 revision fail at it by themselves; with ",
                "[bridge] mode = \"auto\" holdfast bridges them (a 2025 session opened for each ",
                "principal, carried through restarts)",
            )),
            (Some(_), None) => Some(concat!(
                "2026-07-28 only: 2025 clients (the handshake) fail at it by themselves; with ",
                "[bridge] mode = \"auto\" holdfast bridges them (it answers their initialize and ",
                "gives each request the revision's envelope)",
            )),
            (Some(_), Some(_)) => {
                Some("both eras: holdfast passes each client through in its own, bridge on or off")
            }
            (None, None) => None,
        }
    }
}

/// A 2026-07-28 request: `method` with `params` (an object) and the revision's `_meta`.
pub fn request(id: u64, method: &str, params: Value) -> Value {
    crate::bridge::era::modern_request(id, method, params, "holdfast-probe")
}

/// The headers a 2026-07-28 request carries.
pub fn headers(method: &'static str) -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (MCP_PROTOCOL_VERSION, HeaderValue::from_static(MODERN)),
        (MCP_METHOD, HeaderValue::from_static(method)),
    ]
}

/// The versions a `server/discover` answer names: a result whose `supportedVersions` lists at
/// least one (anything else, an error or a 4xx, is a server that does not speak the revision).
pub fn discovered(answer: &Answer) -> Option<Vec<String>> {
    if !answer.status.is_success() {
        return None;
    }
    let Reply::Result(result) = verdict::rpc_reply(answer) else {
        return None;
    };
    let versions: Vec<String> = result["supportedVersions"]
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    (!versions.is_empty()).then_some(versions)
}

/// A server that answers `server/discover` and not the handshake.
pub fn modern_only(versions: &[String], put_in_front: String) -> Verdict {
    Verdict {
        kind: Kind::McpServer,
        finding: format!(
            "a Streamable HTTP MCP server of the 2026-07-28 revision only (server/discover names \
             {}; the initialize handshake is refused)",
            versions.join(", ")
        ),
        holdfast: "holdfast would forward it and hold requests through its restarts; the \
                   revision is stateless, so there are no sessions to carry, and its own 404 with \
                   JSON-RPC error -32601 (an unknown method) passes unchanged. Tools marked \
                   readOnlyHint or idempotentHint are the ones holdfast may send twice after an \
                   ambiguous failure"
            .into(),
        next: put_in_front,
    }
}
