//! holdfast's integration tests: one binary (link time matters on small machines), one module per
//! concern, every server in process on 127.0.0.1:0.

mod forwarding;
mod limits;
mod rmcp_smoke;
mod rows;
mod shutdown;
mod sse;
mod support;
