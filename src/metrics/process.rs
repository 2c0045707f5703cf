//! holdfast's own footprint, read from `/proc/self` at each scrape: the `process_*` metrics
//! every Prometheus client library exports under these names (so existing dashboards and
//! alerts apply), and `holdfast_build_info`. Users run holdfast in every pod; what it costs
//! there is the first thing they look for.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The commit holdfast was built from (`build.rs`; `unknown` outside a git checkout).
pub const COMMIT: &str = env!("HOLDFAST_COMMIT");

/// Registers the process metrics and `holdfast_build_info` (a gauge of 1 whose labels carry
/// the version and commit).
pub fn register(registry: &mut Registry) {
    let info = prometheus_client::metrics::info::Info::new(vec![
        ("version", env!("CARGO_PKG_VERSION")),
        ("commit", COMMIT),
    ]);
    registry.sub_registry_with_prefix("holdfast").register(
        "build",
        "holdfast's version and commit",
        info,
    );
    registry.register_collector(Box::new(Process {
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    }));
}

/// Reads `/proc/self` when scraped.
#[derive(Debug)]
struct Process {
    /// Close enough to the process's start: metrics are registered first thing at start.
    started: f64,
}

/// What `/proc/self` says now; `None` for what it could not tell (not Linux).
#[derive(Debug, Default, PartialEq)]
struct Sample {
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    cpu_seconds: Option<f64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

impl Sample {
    fn now() -> Sample {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        Sample {
            resident_bytes: status_kib(&status, "VmRSS").map(|k| k * 1024),
            virtual_bytes: status_kib(&status, "VmSize").map(|k| k * 1024),
            cpu_seconds: cpu_seconds(&stat, clock_ticks()),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok()),
        }
    }
}

/// A `VmRSS:   1234 kB` line's number.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// User plus system CPU time from `/proc/self/stat` (fields 14 and 15, in clock ticks). The
/// command name (field 2) may hold spaces and parentheses: fields are counted after its `)`.
fn cpu_seconds(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / ticks_per_second)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; it touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = Sample::now();
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            ("process_open_fds", "Open file descriptors", s.open_fds),
            (
                "process_max_fds",
                "Most file descriptors (the soft limit)",
                s.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v as i64);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Some(cpu) = s.cpu_seconds {
            let c = ConstCounter::new(cpu);
            // The `_total` suffix is added by the encoder for a counter.
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds",
                None,
                c.metric_type(),
            )?)?;
        }
        let start = ConstGauge::new(self.started);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process, in seconds since the Unix epoch",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_a_command_name_with_spaces_and_parentheses() {
        // Fields 3..13, then utime 250 and stime 150 ticks.
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0";
        assert_eq!(cpu_seconds(stat, 100.0), Some(4.0));
        assert_eq!(cpu_seconds("garbage", 100.0), None);
    }

    #[test]
    fn this_process_is_measured() {
        let s = Sample::now();
        assert!(s.resident_bytes.is_some_and(|b| b > 1024 * 1024), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap()), "{s:?}");
        assert!(s.cpu_seconds.is_some(), "{s:?}");
    }
}
