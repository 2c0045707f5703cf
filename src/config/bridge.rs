//! `[bridge]`: the era bridge (src/bridge, docs/design/era-bridge.md), off unless `mode` says.
//!
//! Off by default, a choice written in the README ("The era bridge"): turned on, holdfast asks
//! the server's revision with a `server/discover` of its own and reads a 2025 client's first
//! request whole before it knows the answer, which every deployment would see.

use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// Upstream sessions the bridge keeps open when nothing says otherwise: one per principal (a
/// client's credentials and capabilities), so a sidecar serves a few.
pub const DEFAULT_MAX_SESSIONS: usize = 1000;

/// Most sessions that may be said: each is a session on the server as well.
const MAX_SESSIONS: usize = 1 << 20;

/// `[bridge]` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawBridge {
    /// `off` or `auto`.
    pub mode: String,
    /// Most upstream sessions opened for 2026-07-28 clients kept at once.
    pub max_sessions: usize,
    /// Answer a 2026-07-28 client's `server/discover` for a 2025 server.
    pub answer_discover: bool,
}

impl Default for RawBridge {
    fn default() -> Self {
        RawBridge {
            mode: "off".into(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            answer_discover: false,
        }
    }
}

/// Whether requests are bridged between the protocol's eras.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgeMode {
    /// Every request passes in the era its client speaks.
    Off,
    /// A request the server cannot read in its client's era is translated to the server's.
    Auto,
}

/// Validated `[bridge]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    pub mode: BridgeMode,
    pub max_sessions: usize,
    /// A dual-era client's `server/discover` is answered (it then speaks 2026-07-28 through the
    /// bridge) rather than refused by the 2025 server (it then falls back to the handshake).
    pub answer_discover: bool,
}

impl Default for Bridge {
    fn default() -> Self {
        Bridge {
            mode: BridgeMode::Off,
            max_sessions: DEFAULT_MAX_SESSIONS,
            answer_discover: false,
        }
    }
}

impl Validator<'_> {
    /// Checks `[bridge]`; `None` when a problem was recorded.
    pub(super) fn bridge(&mut self, raw: &RawBridge) -> Option<Bridge> {
        let mode = match raw.mode.trim().to_ascii_lowercase().as_str() {
            "off" => BridgeMode::Off,
            "auto" => BridgeMode::Auto,
            other => {
                return self.fail(
                    "bridge.mode",
                    format!("expected \"off\" or \"auto\", got {other:?}"),
                )
            }
        };
        if !(1..=MAX_SESSIONS).contains(&raw.max_sessions) {
            let got = raw.max_sessions;
            return self.fail(
                "bridge.max_sessions",
                format!("expected 1 to {MAX_SESSIONS} sessions, got {got}"),
            );
        }
        Some(Bridge {
            mode,
            max_sessions: raw.max_sessions,
            answer_discover: raw.answer_discover,
        })
    }
}
