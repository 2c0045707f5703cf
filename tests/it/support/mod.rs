//! Test support: in-process peers the tests drive.

pub mod http;
pub mod mcp;
pub mod proxy;
