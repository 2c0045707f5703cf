//! holdfast: a reverse-proxy sidecar that keeps MCP clients connected while their backend's
//! container is recreated.
//!
//! When the backend is missing (connection refused, DNS failure, a router's route-missing 404),
//! holdfast answers `503` with `Retry-After` instead of the 404 that MCP clients read as "session
//! expired". The MCP server's own answers, its own 404s included, pass through byte for byte, and
//! SSE streams flow frame by frame.
//!
//! # Layout
//! - [`config`]: two-phase configuration (figment layers, then validation).
//! - [`cli`]: command-line flags and subcommands.
//! - [`server`]: accept loop, TLS handshakes, connection limits, graceful shutdown; the
//!   client's HTTP/1 connection served by holdfast itself.
//! - [`listener`]: binding and accepting on the listening sockets (proxy and admin).
//! - [`http1`]: HTTP/1.1 on `httparse`, both ways (heads, body framing, buffers), held as
//!   strict as hyper by a differential test.
//! - [`tls`]: rustls configurations, the listener's certificate reloading, handshake failures.
//! - [`proxy`]: forwarding one request; acts on the classifier's verdict; its headers and
//!   streaming bodies; re-establishing forgotten sessions, telling their clients what a deploy
//!   changed, and keeping their event streams open through the server's restart.
//! - [`session`]: the MCP sessions carried across backend restarts, and the JSON-RPC they need.
//! - [`replay`]: the request body, forwarded as it streams and kept (capped) for a replay.
//! - [`upstream`]: connecting (TCP, then TLS; typed failures), our own HTTP/1 pool, sending.
//! - [`classify`]: the one flat decision of what an upstream outcome means.
//! - [`errors`]: reading error chains (a cause of one type; the whole chain for logs).
//! - [`signature`]: router signatures (presets and user-defined), matched by [`classify`].
//! - [`hold`]: outages, holding requests through them, probing, Retry-After from history; one
//!   route's outage is a plain state machine (`hold/machine`), its effects carried out beside it.
//! - [`idempotent`]: which MCP requests are safe to send twice (read-only methods, annotated tools).
//! - [`respond`]: every synthetic response.
//! - [`sse`]: the `text/event-stream` format, read incrementally: the one event reader.
//! - [`jsonrpc`]: JSON-RPC 2.0 messages as MCP sends them: the one message reader.
//! - [`mcp_method`]: the bounded MCP method label of a POST.
//! - [`rlimit`]: raising the open-file limit at start.
//! - [`metrics`]: Prometheus metrics, registered explicitly.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, and the readiness flag the server sets.
//! - [`telemetry`]: logging setup, request ids on log lines, OpenTelemetry traces.
//! - [`bridge`]: the era bridge's translations (issue 48; not yet reached by requests).
//! - [`probe`]: `holdfast probe`, diagnosing an MCP endpoint.
//! - [`demo`]: `holdfast demo`, a self-contained demonstration.

pub mod admin;
pub mod bridge;
pub mod classify;
pub mod cli;
pub mod config;
pub mod demo;
pub mod errors;
pub mod hold;
pub mod http1;
pub mod idempotent;
pub mod jsonrpc;
pub mod listener;
pub mod mcp_method;
pub mod metrics;
pub mod probe;
pub mod proxy;
pub mod replay;
pub mod respond;
pub mod rlimit;
pub mod server;
pub mod session;
pub mod signature;
pub mod sse;
pub mod telemetry;
pub mod tls;
pub mod upstream;
