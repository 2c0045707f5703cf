//! Test support: in-process peers the tests drive, child processes, and bounded waits.

pub mod clients;
pub mod config;
pub mod deploy;
pub mod files;
pub mod forgetful;
pub mod hold;
pub mod http;
pub mod jail;
pub mod mcp;
pub mod modern;
pub mod nginx;
pub mod node;
pub mod observability;
pub mod pod;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod router;
pub mod rows;
pub mod script;
pub mod stacks;
pub mod tls;

use std::future::Future;
use std::time::Duration;

/// How long one step may take before [`within`] fails the test. Generous: a loaded two-core
/// machine must not fail a test that would pass, and a test that hangs fails after this anyway.
/// It is also above holdfast's default hold timeout (15 s), so a request held until that timeout
/// fails with its 503, not as a hang.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Turns a hang into a failure: `future`'s output, or a panic after [`LIMIT`].
pub async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out")
}

/// [`within`] with a bound of `secs` seconds, for a step whose taking longer is itself the
/// failure (a request answered at once by design, say, that was held instead).
pub async fn within_secs<T>(secs: u64, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), future)
        .await
        .expect("timed out")
}
