//! Prometheus metrics, without a global registry.
//!
//! [`Metrics::register`] creates every metric and registers it in the caller's registry; the
//! proxy gets an `Arc<Metrics>` passed down. Every label is a bounded enum or a status code: no
//! label value ever comes from a path, a session id or any other unbounded input.
//!
//! Names are fixed (dashboards and alert rules rely on them) and listed in the README.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::classify::RewriteReason;
use crate::idempotent::SafeKind;
use crate::upstream::ClosedCounters;

mod atomic;
mod bridge;
mod labels;
pub mod process;
mod server;
pub mod text;
mod trace;
pub use atomic::{AtomicHistogram, McpRequestCounters, RequestCounters};
pub use bridge::{BridgeMetrics, BridgeOutcome};
pub use labels::*;
pub use server::{
    AtCap, ClientConnections, OpenConnection, Protocol, ReloadResult, ServerMetrics, Transport,
};
pub use trace::{SpanCounts, SpanOutcome};

/// Buckets of `holdfast_request_duration_seconds`, in seconds: from 1 ms (a proxied answer on
/// loopback) to 5 min (a long tool call answered as JSON). Measured to the response *head*: a
/// stream's lifetime is not a request's latency.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Buckets of `holdfast_hold_duration_seconds`: from a probe's first backoff (25 ms) to past the
/// longest sensible hold timeout.
pub const HOLD_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0,
];

/// Buckets of `holdfast_outage_duration_seconds`: a container recreation takes from under a
/// second to minutes (image pulls).
pub const OUTAGE_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// All of holdfast's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// `holdfast_rewrites_total{reason,action}`: every "backend missing" kept from the client
    /// (a route-missing 404, a router's 5xx, a failed connection), answered 503 or held.
    pub rewrites: Family<ReasonLabel, Counter>,
    /// `holdfast_requests_total{method,status}`: every answer, by the status the client saw.
    pub requests: RequestCounters,
    /// `holdfast_mcp_requests_total{method}`: POSTs by the MCP method they carry.
    pub mcp_requests: McpRequestCounters,
    /// `holdfast_request_duration_seconds`: time to the response head.
    pub request_duration: AtomicHistogram,
    /// `holdfast_upstream_up`: 1 unless an outage is open.
    pub upstream_up: Gauge,
    /// `holdfast_upstream_connections`: connections to the upstream open now, idle in the pool
    /// or carrying a request.
    pub upstream_connections: Gauge,
    /// `holdfast_sse_streams_active`: SSE responses being streamed now.
    pub sse_streams_active: Gauge,
    /// `holdfast_passthrough_404_total`: the application's own 404s, passed through.
    pub passthrough_404: Counter,
    /// `holdfast_router_passthrough_total{reason}`: a router's 404 passed through unmasked.
    pub router_passthrough: Family<PassLabel, Counter>,
    /// `holdfast_upstream_failures_total{reason}`: requests answered 502 after they may have
    /// reached the application.
    pub upstream_failures: Family<FailLabel, Counter>,
    /// `holdfast_client_body_failures_total{reason}`: request bodies the client broke off,
    /// sent malformed or let stall once their upload had begun (the client's failure, not the
    /// upstream's).
    pub client_body_failures: Family<ClientBodyLabel, Counter>,
    /// `holdfast_response_aborts_total{reason}`: responses cut off after their head was sent.
    pub response_aborts: Family<AbortLabel, Counter>,
    /// `holdfast_holds_total{outcome}`: every exit from the hold (or refusal to enter it).
    pub holds: Family<HoldLabel, Counter>,
    /// `holdfast_held_requests`: requests held now.
    pub held_requests: Gauge,
    /// `holdfast_hold_duration_seconds`: time each hold lasted.
    pub hold_duration: Histogram,
    /// `holdfast_outages_total`: outages opened.
    pub outages: Counter,
    /// `holdfast_outage_duration_seconds`: how long closed outages lasted.
    pub outage_duration: Histogram,
    /// `holdfast_replays_total`: requests sent again after a hold.
    pub replays: Counter,
    /// `holdfast_sessions_tracked`: MCP sessions holdfast could re-establish now.
    pub sessions_tracked: Gauge,
    /// `holdfast_session_resumes_total{outcome}`: the application's session 404s, by what
    /// holdfast made of them.
    pub session_resumes: Family<ResumeLabel, Counter>,
    /// `holdfast_session_reestablished_total{cause}`: sessions re-established upstream, by why
    /// the upstream did not know them.
    pub session_reestablished: Family<ReestablishLabel, Counter>,
    /// `holdfast_server_changes_total{what}`: what re-established sessions found changed in
    /// the server since their client was told (a deploy).
    pub server_changes: Family<ServerChangeLabel, Counter>,
    /// `holdfast_sse_streams_reopened_total`: clients' standalone event streams holdfast
    /// reopened upstream instead of ending them with the server's.
    pub sse_streams_reopened: Counter,
    /// `holdfast_session_tokens_refused_total{reason}`: session tokens not used, by why.
    pub session_tokens_refused: Family<TokenLabel, Counter>,
    /// `holdfast_session_store_errors_total`: commands to `sessions.store` that failed.
    pub session_store_errors: Counter,
    /// `holdfast_safe_retries_total{kind}`: requests sent once more after an ambiguous failure,
    /// because running them twice is safe.
    pub safe_retries: Family<RetryLabel, Counter>,
    /// `holdfast_upstream_closed_connections_total{when}`: upstream connections found closed
    /// before the upstream read a request on them (plain `http://` upstreams).
    pub upstream_closed: ClosedCounters,
    /// `holdfast_paused`: 1 while a pause (`holdfast pause`) holds new requests.
    pub paused: Gauge,
    /// `holdfast_pauses_total{outcome}`: pauses, by how their drain ended.
    pub pauses: Family<PauseLabel, Counter>,
    /// `holdfast_handoffs_total{outcome}`: requests that never reached a server handed to a
    /// peer by a terminating holdfast.
    pub handoffs: Family<HandoffLabel, Counter>,
    /// `holdfast_shutdown_cut_requests_total`: requests still waiting for their answer when
    /// holdfast's drain ended (cut by holdfast, not by their clients).
    pub shutdown_cut: Counter,
    /// `holdfast_trace_spans_total{outcome}`: spans finished with tracing on, by outcome.
    pub trace_spans: SpanCounts,
    /// `holdfast_bridge_requests_total{outcome}`, `holdfast_bridge_sessions`: the era bridge.
    pub bridge: BridgeMetrics,
}

impl Metrics {
    /// Creates every metric and registers it under the `holdfast_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let (mut m, closed) = Metrics::new();
        m.precreate();
        let r = registry.sub_registry_with_prefix("holdfast");
        m.register_traffic(r);
        m.register_upstream(r, closed);
        m.register_hold(r);
        m.register_sessions(r);
        m.trace_spans = SpanCounts::register(r);
        m.bridge = BridgeMetrics::register(r);
        m
    }

    /// Every metric, unregistered, and the family behind `upstream_closed`'s counters.
    fn new() -> (Metrics, Family<ClosedLabel, Counter>) {
        let closed = Family::<ClosedLabel, Counter>::default();
        let when = |when| closed.get_or_create(&ClosedLabel { when }).clone();
        let m = Metrics {
            rewrites: Family::default(),
            requests: RequestCounters::new(Family::default()),
            mcp_requests: McpRequestCounters::default(),
            request_duration: AtomicHistogram::new(DURATION_BUCKETS),
            upstream_up: Gauge::default(),
            upstream_connections: Gauge::default(),
            sse_streams_active: Gauge::default(),
            passthrough_404: Counter::default(),
            router_passthrough: Family::default(),
            upstream_failures: Family::default(),
            client_body_failures: Family::default(),
            response_aborts: Family::default(),
            holds: Family::default(),
            held_requests: Gauge::default(),
            hold_duration: Histogram::new(HOLD_BUCKETS),
            outages: Counter::default(),
            outage_duration: Histogram::new(OUTAGE_BUCKETS),
            replays: Counter::default(),
            sessions_tracked: Gauge::default(),
            session_resumes: Family::default(),
            session_reestablished: Family::default(),
            server_changes: Family::default(),
            sse_streams_reopened: Counter::default(),
            session_tokens_refused: Family::default(),
            session_store_errors: Counter::default(),
            safe_retries: Family::default(),
            upstream_closed: ClosedCounters {
                idle: when(ClosedWhen::idle),
                before_request: when(ClosedWhen::before_request),
                unacknowledged: when(ClosedWhen::unacknowledged),
            },
            paused: Gauge::default(),
            pauses: Family::default(),
            shutdown_cut: Counter::default(),
            handoffs: Family::default(),
            trace_spans: SpanCounts::default(),
            bridge: BridgeMetrics::default(),
        };
        (m, closed)
    }

    /// Every labelled series that alerts or dashboards read, created at 0 (and `upstream_up` at
    /// 1), so `increase()` sees their first event and dashboards show zeros instead of gaps.
    fn precreate(&self) {
        let m = self;
        // Start "up": holdfast has no evidence of an outage until a request meets one.
        m.upstream_up.set(1);
        // Pre-create every reason so dashboards show zeros instead of gaps.
        for r in RewriteReason::ALL {
            for action in RewriteAction::ALL {
                let _ = m.rewrites.get_or_create(&ReasonLabel::new(r, action));
            }
        }
        for o in [
            HoldOutcome::released,
            HoldOutcome::timed_out,
            HoldOutcome::cancelled,
            HoldOutcome::queue_full,
            HoldOutcome::body_too_large,
            HoldOutcome::shutdown,
        ] {
            let _ = m.holds.get_or_create(&o.into());
        }
        // Alert rules use increase() on these: a series that appears already at 1 would hide its
        // first event.
        for reason in [Pass::route_not_expected, Pass::horizon_exceeded] {
            let _ = m.router_passthrough.get_or_create(&PassLabel { reason });
        }
        for reason in [
            Fail::response_timeout,
            Fail::upstream_reset,
            Fail::upstream_protocol,
            Fail::upstream_tls,
            Fail::unanswered,
        ] {
            let _ = m.upstream_failures.get_or_create(&FailLabel { reason });
        }
        for reason in [ClientBodyReason::malformed, ClientBodyReason::idle_timeout] {
            let _ = m
                .client_body_failures
                .get_or_create(&ClientBodyLabel { reason });
        }
        for reason in [Abort::upstream_error, Abort::idle_timeout] {
            let _ = m.response_aborts.get_or_create(&AbortLabel { reason });
        }
        for outcome in [
            ResumeOutcome::resumed,
            ResumeOutcome::failed,
            ResumeOutcome::not_tracked,
        ] {
            let _ = m.session_resumes.get_or_create(&outcome.into());
        }
        for cause in [
            ReestablishCause::backend_restart,
            ReestablishCause::unknown_to_this_replica,
        ] {
            let _ = m
                .session_reestablished
                .get_or_create(&ReestablishLabel { cause });
        }
        for what in ServerChange::ALL {
            let _ = m.server_changes.get_or_create(&ServerChangeLabel { what });
        }
        for reason in [
            TokenReason::malformed,
            TokenReason::unopened,
            TokenReason::ended,
            TokenReason::expired,
        ] {
            let _ = m
                .session_tokens_refused
                .get_or_create(&TokenLabel { reason });
        }
        for kind in [
            SafeKind::ReadOnlyMethod,
            SafeKind::AnnotatedTool,
            SafeKind::ConfiguredTool,
        ] {
            let _ = m.safe_retries.get_or_create(&kind.into());
        }
        for outcome in [PauseOutcome::drained, PauseOutcome::drain_timeout] {
            let _ = m.pauses.get_or_create(&outcome.into());
        }
    }

    /// Registers what clients sent and got: requests, their MCP methods, latency, streams.
    fn register_traffic(&self, r: &mut Registry) {
        r.register(
            "requests",
            "Requests answered, by method and the status the client saw",
            self.requests.family().clone(),
        );
        r.register(
            "mcp_requests",
            "POSTs by the MCP method they carry (the Mcp-Method header, else the body's method); \
             other for a method the spec does not name, a response, a batch or an unkept body",
            self.mcp_requests.family().clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from receiving a request to sending the response head",
            self.request_duration.clone(),
        );
        r.register(
            "sse_streams_active",
            "SSE responses currently streaming to clients",
            self.sse_streams_active.clone(),
        );
        r.register(
            "client_body_failures",
            "Request bodies the client sent malformed or cut short (answered 400) or let stall \
             (408) once their upload had begun: the client's failures, not the upstream's",
            self.client_body_failures.clone(),
        );
        r.register(
            "response_aborts",
            "Responses cut off after their head was sent (upstream failure or idle timeout)",
            self.response_aborts.clone(),
        );
    }

    /// Registers what the upstream did and what holdfast made of it.
    fn register_upstream(&self, r: &mut Registry, closed: Family<ClosedLabel, Counter>) {
        r.register(
            "upstream_up",
            "1 while the upstream answers, 0 while an outage is open",
            self.upstream_up.clone(),
        );
        r.register(
            "upstream_connections",
            "Connections to the upstream open now, idle in the pool or carrying a request",
            self.upstream_connections.clone(),
        );
        r.register(
            "upstream_failures",
            "Requests answered 502 after they may have reached the application",
            self.upstream_failures.clone(),
        );
        r.register(
            "upstream_closed_connections",
            "Upstream connections found closed before the upstream read a request on them",
            closed,
        );
        r.register(
            "safe_retries",
            "Requests sent again after the upstream failed once they may have reached it, \
             because running them twice is safe (read-only methods, idempotent tools)",
            self.safe_retries.clone(),
        );
        r.register(
            "passthrough_404",
            "The MCP server's own 404s, passed through untouched",
            self.passthrough_404.clone(),
        );
        r.register(
            "router_passthrough",
            "Router 404s passed through unmasked (path not expected, or horizon exceeded)",
            self.router_passthrough.clone(),
        );
        r.register(
            "rewrites",
            "Backend-missing answers kept from the client, by reason and by what it got instead (a 503, or a hold)",
            self.rewrites.clone(),
        );
    }

    /// Registers outages, the hold and pauses.
    fn register_hold(&self, r: &mut Registry) {
        r.register(
            "holds",
            "Exits from the hold, by outcome",
            self.holds.clone(),
        );
        r.register(
            "held_requests",
            "Requests held now, waiting for the upstream",
            self.held_requests.clone(),
        );
        r.register(
            "hold_duration_seconds",
            "How long each hold lasted",
            self.hold_duration.clone(),
        );
        r.register("outages", "Upstream outages opened", self.outages.clone());
        r.register(
            "outage_duration_seconds",
            "How long closed upstream outages lasted",
            self.outage_duration.clone(),
        );
        r.register(
            "replays",
            "Requests sent again after being held",
            self.replays.clone(),
        );
        r.register(
            "paused",
            "1 while holdfast is paused for a planned restart (new requests are held)",
            self.paused.clone(),
        );
        for outcome in [Handoff::answered, Handoff::failed, Handoff::no_peer] {
            let _ = self.handoffs.get_or_create(&outcome.into());
        }
        r.register(
            "handoffs",
            "Requests that never reached a server, handed to a peer at shutdown, by outcome",
            self.handoffs.clone(),
        );
        r.register(
            "shutdown_cut_requests",
            "Requests still waiting for their answer when the drain ended, cut by holdfast",
            self.shutdown_cut.clone(),
        );
        r.register(
            "pauses",
            "Pauses for a planned restart, by how their drain ended",
            self.pauses.clone(),
        );
    }

    /// Registers the sessions carried across restarts.
    fn register_sessions(&self, r: &mut Registry) {
        r.register(
            "sessions_tracked",
            "MCP sessions holdfast could re-establish after a backend restart",
            self.sessions_tracked.clone(),
        );
        r.register(
            "session_resumes",
            "The application's 404s to requests on a session, by what holdfast made of them",
            self.session_resumes.clone(),
        );
        r.register(
            "session_reestablished",
            "MCP sessions re-established upstream, by why the upstream did not know them",
            self.session_reestablished.clone(),
        );
        r.register(
            "server_changes",
            "What re-established MCP sessions found changed in the server since their client was told (a deploy)",
            self.server_changes.clone(),
        );
        r.register(
            "sse_streams_reopened",
            "Clients' standalone event streams reopened upstream when the server's ended, instead of ending them",
            self.sse_streams_reopened.clone(),
        );
        r.register(
            "session_tokens_refused",
            "Session tokens not used (passed through as opaque ids or not re-established), by why",
            self.session_tokens_refused.clone(),
        );
        r.register(
            "session_store_errors",
            "Commands to the shared session store (sessions.store) that failed",
            self.session_store_errors.clone(),
        );
    }
}

/// Metrics of the TLS listener, registered only when `[tls]` is on (an expiry gauge at 0 would
/// read as "expired" to an alert rule).
#[derive(Debug, Clone, Default)]
pub struct TlsMetrics {
    /// `holdfast_tls_handshake_failures_total{reason}`: inbound handshakes that failed.
    pub handshake_failures: Family<HandshakeLabel, Counter>,
    /// `holdfast_tls_cert_expiry_timestamp_seconds`: the serving certificate's notAfter, as Unix
    /// time, set on each (re)load.
    pub cert_expiry: Gauge,
}

/// Label set of `holdfast_tls_handshake_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabel {
    /// Why the handshake failed.
    pub reason: HandshakeFailure,
}

/// Bounded handshake failure reasons.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum HandshakeFailure {
    /// `tls.client_ca` is set and the client sent no certificate.
    no_certificate,
    /// The client's certificate failed verification (unknown CA, expired, not for clients).
    bad_certificate,
    /// The client aborted with a certificate alert: it does not trust holdfast's certificate
    /// (wrong CA, expired, wrong name).
    rejected_by_client,
    /// Not TLS, or no common version, cipher suite or ALPN protocol, or a malformed handshake.
    protocol,
    /// The handshake did not finish within `limits.header_read_timeout_secs`.
    timeout,
    /// The client closed or reset the connection during the handshake (TCP health checks do).
    closed,
    /// Anything else.
    other,
}

impl HandshakeFailure {
    /// Every reason, for pre-creating the series.
    pub const ALL: [HandshakeFailure; 7] = [
        HandshakeFailure::no_certificate,
        HandshakeFailure::bad_certificate,
        HandshakeFailure::rejected_by_client,
        HandshakeFailure::protocol,
        HandshakeFailure::timeout,
        HandshakeFailure::closed,
        HandshakeFailure::other,
    ];
}

impl TlsMetrics {
    /// Creates the TLS metrics and registers them under the `holdfast_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = TlsMetrics::default();
        // Pre-create every reason so dashboards show zeros instead of gaps.
        for reason in HandshakeFailure::ALL {
            let _ = m
                .handshake_failures
                .get_or_create(&HandshakeLabel { reason });
        }
        let r = registry.sub_registry_with_prefix("holdfast");
        r.register(
            "tls_handshake_failures",
            "Inbound TLS handshakes that failed, by reason",
            m.handshake_failures.clone(),
        );
        r.register(
            "tls_cert_expiry_timestamp_seconds",
            "notAfter of the serving certificate as Unix time, set on each (re)load",
            m.cert_expiry.clone(),
        );
        m
    }

    /// Counts one failed handshake.
    pub fn handshake_failed(&self, reason: HandshakeFailure) {
        self.handshake_failures
            .get_or_create(&HandshakeLabel { reason })
            .inc();
    }
}
