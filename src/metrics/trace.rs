//! `holdfast_trace_spans_total{outcome}`: what became of the spans holdfast finished, with
//! tracing on (src/telemetry/export.rs). Registered always, at 0 with tracing off, so an alert
//! on dropped or failed spans needs no `absent()`.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What became of a finished span.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SpanOutcome {
    /// The collector took it.
    exported,
    /// The export queue was full (`tracing.queue_size`): never sent.
    dropped,
    /// Its batch's export failed or timed out: not sent again.
    failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpanLabel {
    pub outcome: SpanOutcome,
}

/// The counters the exporter adds to, one per outcome.
#[derive(Clone, Debug, Default)]
pub struct SpanCounts {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

impl SpanCounts {
    /// Creates the family's three series and registers it in `r` (holdfast's prefix).
    pub(super) fn register(r: &mut Registry) -> SpanCounts {
        let family = Family::<SpanLabel, Counter>::default();
        let of = |outcome| family.get_or_create(&SpanLabel { outcome }).clone();
        let counts = SpanCounts {
            exported: of(SpanOutcome::exported),
            dropped: of(SpanOutcome::dropped),
            failed: of(SpanOutcome::failed),
        };
        r.register(
            "trace_spans",
            "Spans finished with tracing on, by what became of them: exported, dropped (the \
             export queue was full) or failed (their batch's export failed)",
            family,
        );
        counts
    }
}
