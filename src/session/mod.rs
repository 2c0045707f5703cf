//! Session continuity: an MCP session outlives the backend's restart.
//!
//! Most MCP servers keep sessions in memory, so a recreated container has forgotten every one
//! and answers the next request on it with `404` ("Session not found"), or `400` (the reference
//! everything server, one-transport TypeScript servers). The spec tells the client
//! to start a new session then, but the official TypeScript SDK client never does: every call
//! after the restart fails. holdfast carries the session instead:
//!
//! - **Record** ([`Table::record`]): every `initialize` answered with an `Mcp-Session-Id`, its
//!   body kept verbatim, and on each session what later requests set (`logging/setLevel`,
//!   `resources/subscribe` and `resources/unsubscribe`) and the `MCP-Protocol-Version` sent.
//! - **Seal** ([`token`]): the client is handed a token instead of the upstream's id, sealed with
//!   `sessions.key_file`'s key, that carries the initialize, the protocol version and the
//!   upstream id. Any holdfast with the key opens it ([`Table::lookup`]): after its own
//!   restart, or at another replica, the session goes on from the token alone.
//! - **Detect** ([`forgotten`], acted on in [`crate::proxy`]): the application's own 404 or 400
//!   to a request carrying a tracked session id, confirmed by a `ping` on the session refused the
//!   same way, means the server no longer knows the session, and did not execute the request.
//! - **Re-establish** (in [`crate::proxy`]): the recorded `initialize` again, with the current
//!   request's credentials, `notifications/initialized`, the recorded state; then the request.
//!   From then on the client's id maps to the new upstream id, both ways ([`Session::apply`],
//!   [`Session::rewrite_response`]).
//! - **Tell** ([`told`]): what the client was told (the `initialize` result, its lists, as
//!   digests) is compared with what the new server offers; a changed list is told to the client
//!   with its `notifications/*/list_changed` ([`Session::take_news`]).
//!
//! This module keeps the records and reads JSON-RPC; the proxy does the sending.

pub mod cancels;
mod entry;
pub mod forgotten;
mod keys;
mod live;
pub mod rpc;
pub mod shared;
mod store;
pub mod token;
pub mod told;

pub use entry::{Origin, Plan, Session};
pub use keys::{spawn_key_reloader, Keys};
pub use store::{Miss, Recorded, Table, TokenRefusal};

/// The session headers (named once, in `src/http1/names.rs`).
pub use crate::http1::names::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
