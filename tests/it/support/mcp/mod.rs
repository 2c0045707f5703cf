//! Real rmcp peers: an MCP server on a real socket and an rmcp client.
//!
//! [`McpServer`] (tools `count`, `echo`, `wait`, and the ledger tools) is rmcp's own Streamable HTTP server
//! (`StreamableHttpService` with a `LocalSessionManager`), served by hyper-util straight from a
//! tokio `TcpListener`, so the bytes a proxy sees are exactly what an rmcp backend sends. Around
//! rmcp sits one thin layer that routes only `/mcp`, records every request it saw, and can answer
//! the next POSTs with an injected status (a router's 503, say) before rmcp sees them.
//!
//! [`connect`] builds an rmcp client on `StreamableHttpClientTransport` (reqwest), the client
//! whose reactions to 404, 5xx and refused connections holdfast has to account for.
//!
//! Layout: `server` (the socket, the recording layer, the injections), `tools` (what the server
//! runs), `client` (the rmcp client and its calls), `raw` (requests and responses as bytes).

mod client;
mod raw;
mod server;
mod tools;

pub use client::{
    call_count, call_echo, call_ledger, call_wait, connect, connect_with, is_connection_refused,
    transport_error, Client,
};
pub use raw::{mcp_post, raw_http, RawResponse};
pub use server::{tool_call, McpServer, Mode, Options, SeenRequest};

/// The one path the server answers; anything else gets an empty 404, as behind a real router.
pub const MCP_PATH: &str = "/mcp";

/// The Accept value every Streamable HTTP POST must carry; rmcp answers 406 without both types.
pub const MCP_ACCEPT: &str = "application/json, text/event-stream";
