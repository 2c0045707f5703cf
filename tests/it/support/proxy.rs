//! Runs holdfast in process on 127.0.0.1:0 with a test configuration.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast::config::{Config, RawConfig};
use tokio::time::Instant;

/// Every outcome of `holdfast_holds_total{outcome}`.
pub const HOLD_OUTCOMES: [&str; 6] = [
    "released",
    "timed_out",
    "cancelled",
    "queue_full",
    "body_too_large",
    "shutdown",
];

/// A running holdfast.
pub struct Holdfast {
    /// Proxy address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    running: holdfast::server::Spawned,
}

/// A raw configuration pointing at `upstream`, with every listener on port 0 and the check at
/// rest off: it is traffic of holdfast's own on a clock of its own (an outage it opens at start
/// would hold a test's first request before it is sent). The tests of the check itself turn it
/// on (`health.rs`).
pub fn raw_config(upstream: &str) -> RawConfig {
    let mut raw = RawConfig {
        upstream: upstream.to_string(),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    raw.hold.check_interval_secs = 0.0;
    raw
}

impl Holdfast {
    /// Starts holdfast with default settings in front of `upstream`.
    pub async fn start(upstream: &str) -> Holdfast {
        Holdfast::start_with(raw_config(upstream)).await
    }

    /// Starts holdfast with `raw` (its listen addresses are replaced by port 0).
    pub async fn start_with(mut raw: RawConfig) -> Holdfast {
        raw.listen = "127.0.0.1:0".into();
        raw.admin = "127.0.0.1:0".into();
        let config = Config::from_raw(&raw, &|_| "test".into()).expect("valid test config");
        let running = holdfast::server::spawn(config)
            .await
            .expect("holdfast starts");
        Holdfast {
            addr: running.addr,
            admin: running.admin,
            running,
        }
    }

    /// `http://addr` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts shutting down (as SIGTERM does) without waiting.
    pub fn begin_shutdown(&mut self) {
        self.running.begin_shutdown();
    }

    /// Takes `raw` (its listen addresses replaced by port 0, as at start) as SIGHUP takes a
    /// configuration read again, and waits until the reload is counted.
    pub async fn reload(&self, mut raw: RawConfig) {
        raw.listen = "127.0.0.1:0".into();
        raw.admin = "127.0.0.1:0".into();
        let series = "holdfast_config_reloads_total{result=\"ok\"}";
        let before = self.metric(series).await;
        let config = Config::from_raw(&raw, &|_| "test".into()).expect("valid test config");
        self.running.reload(config);
        self.metric_until(series, |n| n > before).await;
    }

    /// Shuts down and waits until holdfast has stopped.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        self.wait().await;
    }

    /// Waits for a shutdown begun earlier to finish.
    pub async fn wait(&mut self) {
        self.running.wait().await.expect("holdfast run");
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let resp = super::http::get_metrics(&format!("http://{}/metrics", self.admin)).await;
        String::from_utf8(resp.body.to_vec()).unwrap()
    }

    /// The value of one sample line in `/metrics` (`name{labels}` exactly as encoded). Fails the
    /// test when the series is absent: see [`metric_value`].
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    /// Like [`Holdfast::metric`], for a series created on first use: see [`metric_or_zero`].
    pub async fn metric_or_zero(&self, series: &str) -> f64 {
        metric_or_zero(&self.metrics().await, series)
    }

    /// Waits until `series` satisfies `ok` and returns its value; panics with the last value
    /// after 10 s. When `ok(0.0)` holds, the series must exist (see [`metric_value`]): a wait for
    /// "back to 0" must not pass on a misspelt name or label. For what holdfast records on its own time (a request entering the hold, a
    /// stream's end, a handshake failing): there is no event the test could await, so the metric
    /// that shows it is polled, with a deadline.
    pub async fn metric_until(&self, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
        metric_until_at(&self.admin.to_string(), series, ok).await
    }
}

/// [`Holdfast::metric_until`] for any holdfast's admin listener at `admin` (`host:port`): the
/// real binary's, in the tests that run it.
pub async fn metric_until_at(admin: &str, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let url = format!("http://{admin}/metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = super::http::get_metrics(&url).await.text().to_owned();
        // The series may appear only with the event the test waits for (a family with no series
        // yet is not in the text at all), so an absent series reads 0 while waiting; but a wait
        // for 0 must not end on a series that does not exist (a misspelt label), so it needs
        // the series.
        let value = if ok(0.0) {
            metric_value(&text, series)
        } else {
            find_sample(&text, series).unwrap_or(0.0)
        };
        if ok(value) {
            return value;
        }
        if Instant::now() >= deadline {
            // A misspelt name fails here with what /metrics holds.
            let value = metric_or_zero(&text, series);
            panic!("{series} stayed at {value}, never reaching what the test waits for");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Finds `series` (name with labels, as encoded) in OpenMetrics text. Fails the test when it is
/// absent: holdfast pre-creates every labelled series it has, so a missing one is a misspelt name
/// or label, and an "equals 0" check must not pass on it.
pub fn metric_value(text: &str, series: &str) -> f64 {
    find_sample(text, series)
        .unwrap_or_else(|| panic!("no series {series} in /metrics (misspelt?):\n{text}"))
}

/// For a series created on first use (`holdfast_requests_total` by method and status, which are
/// unbounded in advance): 0 while absent. Its metric family must exist, so a misspelt metric
/// name still fails.
pub fn metric_or_zero(text: &str, series: &str) -> f64 {
    let name = series.split('{').next().unwrap_or(series);
    let family = ["_total", "_count", "_sum", "_bucket"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    assert!(
        text.lines().any(|l| l
            .strip_prefix("# TYPE ")
            .is_some_and(|t| t.split(' ').next() == Some(family))),
        "no metric family {family} in /metrics (misspelt?):\n{text}"
    );
    find_sample(text, series).unwrap_or(0.0)
}

fn find_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map(|v| v.trim().parse().unwrap())
}

/// The sum of every sample of `holdfast_requests_total` answered with `status`, any method.
pub fn requests_with_status(metrics: &str, status: u16) -> f64 {
    let label = format!("status=\"{status}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("holdfast_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
