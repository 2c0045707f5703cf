//! What the behaviour-table tests (`rows_*.rs`) share: a call and a configuration that answers
//! at once.

use crate::support::proxy::raw_config;

pub const CALL: &str =
    r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"count"}}"#;

/// A configuration with holding off: these rows pin what is answered *at once* (the hold tests
/// cover what happens instead while holding is on).
pub fn immediate(upstream: &str) -> holdfast::config::RawConfig {
    let mut raw = raw_config(upstream);
    raw.hold.enabled = false;
    raw
}
