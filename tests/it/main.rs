//! holdfast's integration tests: one binary (link time matters on small machines), one module per
//! concern, every server in process on 127.0.0.1:0.

mod cli;
mod config;
mod demo;
mod deploy_container;
mod deploy_nginx;
mod deploy_observability;
mod deploy_pause;
mod exactly_once;
mod forwarding;
mod graceful;
mod health;
mod held_memory;
mod hold;
mod hold_e2e;
mod legacy;
mod limits;
mod logs;
mod mcp_e2e;
mod oracle;
mod pause;
mod per_route;
mod probe;
mod retry;
mod rmcp_smoke;
mod rows;
mod session;
mod session_ts;
mod shutdown;
mod smuggling;
mod sse;
mod strict;
mod support;
mod tls;
mod upstream_pool;
