//! The era bridge (issue 48, docs/design/era-bridge.md): 2026-07-28 clients in front of 2025
//! servers, and 2025 clients in front of 2026-07-28-only servers.
//!
//! Built so far: [`wire`], the pure translations of build order step 1 (a 2026 `tools/list` or
//! `tools/call` on a 2025 session, and its answer back). Not yet wired into the proxy: nothing
//! here is reached by a request until the bridge's exchange (step 1's second part) lands behind
//! a `[bridge] mode` setting that is off by default.

pub mod wire;
