//! The tokio runtime the proxy runs on.
//!
//! With one CPU to run on (its affinity mask, or a cgroup quota of one CPU or less: a sidecar's
//! usual lot), the proxy runs on tokio's current-thread scheduler. The multi-thread one with a
//! single worker does the same work with a scheduler built for several: a run queue others may
//! steal from, wake-ups that look for a worker to unpark. Measured side by side, the
//! current-thread scheduler costs 7 % less CPU per proxied request (user time -9 %, system -6 %;
//! benches/RESULTS.md). With more CPUs, the multi-thread scheduler, a worker per CPU.
//! `TOKIO_WORKER_THREADS`, tokio's own variable, asks for the multi-thread scheduler with that
//! many workers whatever the CPUs.

use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Handle, Runtime, RuntimeFlavor};

/// tokio's variable for its number of workers.
const WORKERS: &str = "TOKIO_WORKER_THREADS";

/// The runtime for the proxy, chosen by the CPUs this process may use.
pub fn build() -> std::io::Result<Runtime> {
    let cpus = std::thread::available_parallelism()
        .ok()
        .map(NonZeroUsize::get);
    let mut builder = if one_thread(cpus, std::env::var_os(WORKERS).is_some()) {
        Builder::new_current_thread()
    } else {
        Builder::new_multi_thread()
    };
    builder.enable_all().build()
}

/// Whether `cpus` (unknown: `None`) calls for the current-thread scheduler, unless workers were
/// asked for.
fn one_thread(cpus: Option<usize>, workers_asked: bool) -> bool {
    cpus == Some(1) && !workers_asked
}

/// The running runtime in words, for the start line: `one thread` or `N workers`.
pub fn described() -> String {
    let handle = Handle::current();
    match handle.runtime_flavor() {
        RuntimeFlavor::CurrentThread => "one thread".to_owned(),
        _ => format!("{} workers", handle.metrics().num_workers()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_is_one_thread_unless_workers_are_asked_for() {
        assert!(one_thread(Some(1), false));
        assert!(!one_thread(Some(1), true), "TOKIO_WORKER_THREADS wins");
        assert!(!one_thread(Some(2), false));
        assert!(
            !one_thread(None, false),
            "unknown: as before, the multi-thread scheduler"
        );
    }
}
