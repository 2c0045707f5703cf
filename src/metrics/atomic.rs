//! Metrics on the path of every request, without a lock.
//!
//! prometheus-client's `Histogram::observe` takes a mutex and `Family::get_or_create` a read
//! lock and a hash of the labels: twice per request, on every request. These two keep the same
//! names, types and encodings in `/metrics`, and cost an atomic add or two on the hot path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;

use super::{McpMethodLabel, Method, RequestLabels};
use crate::mcp_method::McpMethod;

/// A histogram whose `observe` is two atomic operations: a bucket's count and the sum.
#[derive(Clone, Debug)]
pub struct AtomicHistogram(Arc<Buckets>);

#[derive(Debug)]
struct Buckets {
    /// Upper bounds, ascending, the last one `+Inf`.
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative).
    counts: Vec<AtomicU64>,
    /// Sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds (ascending) plus `+Inf`.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let mut bounds: Vec<f64> = bounds.into_iter().collect();
        bounds.push(f64::INFINITY);
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram(Arc::new(Buckets {
            bounds,
            counts,
            sum: AtomicU64::new(0f64.to_bits()),
        }))
    }

    /// Records one observation.
    pub fn observe(&self, value: f64) {
        let b = &self.0;
        // NaN lands in +Inf, as in prometheus-client.
        let i = b
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(b.bounds.len() - 1);
        b.counts[i].fetch_add(1, Ordering::Relaxed);
        let _ = b
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let b = &self.0;
        let buckets: Vec<(f64, u64)> = b
            .bounds
            .iter()
            .zip(&b.counts)
            .map(|(bound, count)| (*bound, count.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' total, so the two always agree in one scrape.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = f64::from_bits(b.sum.load(Ordering::Relaxed));
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Statuses with a cached counter: every status an HTTP server normally sends. Others go
/// through the family's lookup.
const CACHED_STATUSES: std::ops::Range<u16> = 100..600;

/// `holdfast_requests_total{method,status}`: each series is looked up in the family once, then
/// incremented through its cached handle.
#[derive(Debug)]
pub struct RequestCounters {
    family: Family<RequestLabels, Counter>,
    cache: Box<[OnceLock<Counter>]>,
}

impl RequestCounters {
    /// Counters over `family` (the registered one).
    pub fn new(family: Family<RequestLabels, Counter>) -> Self {
        let slots = Method::ALL.len() * CACHED_STATUSES.len();
        RequestCounters {
            family,
            cache: (0..slots).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Counts one answer.
    pub fn inc(&self, method: Method, status: u16) {
        let labels = || RequestLabels { method, status };
        if !CACHED_STATUSES.contains(&status) {
            self.family.get_or_create(&labels()).inc();
            return;
        }
        let slot =
            method as usize * CACHED_STATUSES.len() + usize::from(status - CACHED_STATUSES.start);
        self.cache[slot]
            .get_or_init(|| self.family.get_or_create(&labels()).clone())
            .inc();
    }

    /// The family, to register it.
    pub fn family(&self) -> &Family<RequestLabels, Counter> {
        &self.family
    }
}

/// `holdfast_mcp_requests_total{method}`: every series created at start (the label set is
/// bounded and small), each incremented through its handle.
#[derive(Debug)]
pub struct McpRequestCounters {
    family: Family<McpMethodLabel, Counter>,
    counters: Box<[Counter]>,
}

impl Default for McpRequestCounters {
    fn default() -> Self {
        let family = Family::<McpMethodLabel, Counter>::default();
        let counters = McpMethod::ALL
            .iter()
            .map(|&method| family.get_or_create(&McpMethodLabel { method }).clone())
            .collect();
        McpRequestCounters { family, counters }
    }
}

impl McpRequestCounters {
    /// Counts one POST carrying `method`.
    pub fn inc(&self, method: McpMethod) {
        self.counters[method as usize].inc();
    }

    /// The family, to register it.
    pub fn family(&self) -> &Family<McpMethodLabel, Counter> {
        &self.family
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    const BOUNDS: [f64; 3] = [0.001, 0.01, 0.1];

    fn text(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn encodes_as_prometheus_clients_histogram_does() {
        let ours = AtomicHistogram::new(BOUNDS);
        let theirs = Histogram::new(BOUNDS);
        for v in [0.0005, 0.001, 0.05, 0.05, 3.0, f64::NAN] {
            ours.observe(v);
            theirs.observe(v);
        }
        let ours = text(|r| r.register("d", "h", ours));
        let theirs = text(|r| r.register("d", "h", theirs));
        // The sums differ only by the NaN, which prometheus-client adds and we do too.
        assert_eq!(ours, theirs);
    }

    #[test]
    fn cached_and_uncached_statuses_count_in_the_same_family() {
        let counters = RequestCounters::new(Family::default());
        counters.inc(Method::POST, 200);
        counters.inc(Method::POST, 200);
        counters.inc(Method::GET, 999);
        let family = counters.family().clone();
        let out = text(|r| r.register("requests", "h", family));
        assert!(
            out.contains("requests_total{method=\"POST\",status=\"200\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("requests_total{method=\"GET\",status=\"999\"} 1"),
            "{out}"
        );
    }
}
