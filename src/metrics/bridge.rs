//! The era bridge's metrics (src/bridge, src/proxy/forward/bridged.rs): what became of the
//! requests of 2026-07-28 clients it took, and the upstream sessions it keeps for them.
//! Registered always, at 0 with the bridge off.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What the bridge did with a 2026-07-28 client's request.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum BridgeOutcome {
    /// Sent on a 2025 session, translated both ways.
    translated,
    /// Sent as the client sent it: the server speaks the client's revision, or the request is
    /// one the bridge passes (`server/discover`, what is not a JSON-RPC request).
    passed,
    /// A notification, answered 202 by holdfast (it has nowhere to go on a 2025 session).
    accepted,
    /// No session could be opened for it: the client got the server's refusal or a 502.
    failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BridgeLabel {
    pub outcome: BridgeOutcome,
}

/// The bridge's counters and gauge.
#[derive(Clone, Debug, Default)]
pub struct BridgeMetrics {
    pub translated: Counter,
    pub passed: Counter,
    pub accepted: Counter,
    pub failed: Counter,
    /// `holdfast_bridge_sessions`: upstream sessions kept for 2026-07-28 clients.
    pub sessions: Gauge,
}

impl BridgeMetrics {
    /// Counts one request.
    pub fn count(&self, outcome: BridgeOutcome) {
        match outcome {
            BridgeOutcome::translated => self.translated.inc(),
            BridgeOutcome::passed => self.passed.inc(),
            BridgeOutcome::accepted => self.accepted.inc(),
            BridgeOutcome::failed => self.failed.inc(),
        };
    }

    /// Creates the series and registers them in `r` (holdfast's prefix).
    pub(super) fn register(r: &mut Registry) -> BridgeMetrics {
        let family = Family::<BridgeLabel, Counter>::default();
        let of = |outcome| family.get_or_create(&BridgeLabel { outcome }).clone();
        let metrics = BridgeMetrics {
            translated: of(BridgeOutcome::translated),
            passed: of(BridgeOutcome::passed),
            accepted: of(BridgeOutcome::accepted),
            failed: of(BridgeOutcome::failed),
            sessions: Gauge::default(),
        };
        r.register(
            "bridge_requests",
            "Requests of 2026-07-28 clients the era bridge took, by what it did: translated onto \
             a 2025 session, passed as sent, accepted (a notification) or failed (no session \
             could be opened)",
            family,
        );
        r.register(
            "bridge_sessions",
            "Upstream sessions the era bridge keeps open for 2026-07-28 clients, one per principal",
            metrics.sessions.clone(),
        );
        metrics
    }
}
