//! `[sessions.on_change]`: what holdfast does when a re-established session finds a server that
//! offers something else than its client was told (a deploy), per kind of change
//! (docs/sessions.md "When the server changed").

use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// `[sessions.on_change]` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawOnChange {
    /// A list the client received (tools, prompts, resources, templates) differs.
    pub lists: String,
    /// The server agreed on another protocol version than the client did.
    pub protocol_version: String,
    /// The server's capabilities differ.
    pub capabilities: String,
    /// The server's instructions differ.
    pub instructions: String,
    /// `serverInfo` (name, version) differs.
    pub server_info: String,
}

impl Default for RawOnChange {
    fn default() -> Self {
        let d = OnChange::default();
        RawOnChange {
            lists: d.lists.as_str().into(),
            protocol_version: d.protocol_version.as_str().into(),
            capabilities: d.capabilities.as_str().into(),
            instructions: d.instructions.as_str().into(),
            server_info: d.server_info.as_str().into(),
        }
    }
}

/// What is done about one kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// The client is sent the list's `notifications/*/list_changed` (lists only).
    Notify,
    /// The session goes on; the change is logged and counted.
    Carry,
    /// The session is ended the specification's way: the new server's session is closed and
    /// the client gets the server's answer for a session it does not know (404), as it would
    /// without holdfast; a client that re-initializes then learns everything anew.
    End,
}

impl Act {
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Notify => "notify",
            Act::Carry => "carry",
            Act::End => "end",
        }
    }
}

/// Validated `[sessions.on_change]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnChange {
    pub lists: Act,
    pub protocol_version: Act,
    pub capabilities: Act,
    pub instructions: Act,
    pub server_info: Act,
}

impl Default for OnChange {
    /// Measured clients (docs/sessions.md): the TypeScript SDK's, the Python SDK's and
    /// fastmcp's never re-initialize after a 404, so ending a session costs them every later
    /// call; they do list again when told. Only another protocol version ends it: the client
    /// goes on sending the version the new server did not agree to, which that server refuses
    /// on every request anyway, and the clients that re-initialize (mcp-remote, rmcp, the Java
    /// SDK) then recover.
    fn default() -> Self {
        OnChange {
            lists: Act::Notify,
            protocol_version: Act::End,
            capabilities: Act::Carry,
            instructions: Act::Carry,
            server_info: Act::Carry,
        }
    }
}

impl Validator<'_> {
    /// Checks `[sessions.on_change]`; `None` when a problem was recorded.
    pub(super) fn on_change(&mut self, raw: &RawOnChange) -> Option<OnChange> {
        let lists = self.act("sessions.on_change.lists", &raw.lists, true);
        let protocol_version = self.act(
            "sessions.on_change.protocol_version",
            &raw.protocol_version,
            false,
        );
        let capabilities = self.act("sessions.on_change.capabilities", &raw.capabilities, false);
        let instructions = self.act("sessions.on_change.instructions", &raw.instructions, false);
        let server_info = self.act("sessions.on_change.server_info", &raw.server_info, false);
        Some(OnChange {
            lists: lists?,
            protocol_version: protocol_version?,
            capabilities: capabilities?,
            instructions: instructions?,
            server_info: server_info?,
        })
    }

    /// One key's act: `notify` (where a notification exists: `lists`), `carry` or `end`.
    fn act(&mut self, key: &str, value: &str, notifies: bool) -> Option<Act> {
        match value.trim().to_ascii_lowercase().as_str() {
            "notify" if notifies => Some(Act::Notify),
            "carry" => Some(Act::Carry),
            "end" => Some(Act::End),
            other if notifies => self.fail(
                key,
                format!("expected \"notify\", \"carry\" or \"end\", got {other:?}"),
            ),
            other => self.fail(
                key,
                format!(
                    "expected \"carry\" or \"end\", got {other:?} (no notification tells a \
                     client of this change)"
                ),
            ),
        }
    }
}
