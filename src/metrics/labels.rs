//! The label sets of holdfast's metrics: every value a bounded enum (or a status code), so no
//! label value ever comes from a path, a session id or any other unbounded input.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};

use crate::classify::{FailReason, RewriteReason};
use crate::idempotent::SafeKind;
use crate::session::TokenRefusal;
use crate::upstream::ClientBodyFault;

/// Label set of `holdfast_mcp_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpMethodLabel {
    /// The MCP method, folded into the spec's names and `other`.
    pub method: crate::mcp_method::McpMethod,
}

/// Label set of `holdfast_safe_retries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabel {
    /// Why running it twice is safe.
    pub kind: RetryKind,
}

/// Bounded values of `kind` (mirrors [`SafeKind`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RetryKind {
    /// A read-only JSON-RPC method.
    read_only_method,
    /// A tool the server announced read-only or idempotent.
    annotated_tool,
    /// A tool in `retry.idempotent_tools`.
    configured_tool,
}

impl From<SafeKind> for RetryLabel {
    fn from(kind: SafeKind) -> Self {
        let kind = match kind {
            SafeKind::ReadOnlyMethod => RetryKind::read_only_method,
            SafeKind::AnnotatedTool => RetryKind::annotated_tool,
            SafeKind::ConfiguredTool => RetryKind::configured_tool,
        };
        RetryLabel { kind }
    }
}

/// Label set of `holdfast_upstream_closed_connections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabel {
    /// When the close was found.
    pub when: ClosedWhen,
}

/// Bounded values of `when`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ClosedWhen {
    /// A pooled connection, before it carried the request: the request took another one.
    idle,
    /// A new connection closed before the request was written: held (or answered 503).
    before_request,
    /// Written, none of it acknowledged by the upstream's TCP: held (or answered 503).
    unacknowledged,
}

/// Label set of `holdfast_session_resumes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResumeLabel {
    /// What became of the session.
    pub outcome: ResumeOutcome,
}

/// Bounded resume outcomes.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ResumeOutcome {
    /// Re-established upstream; the request went out again on the new session.
    resumed,
    /// Re-establishing failed (refused, an error, the server forgot again): the client got the
    /// server's 404 (or the 503 of a missing backend).
    failed,
    /// A 404 for a session holdfast never saw opened (or already forgot): passed through.
    not_tracked,
}

impl From<ResumeOutcome> for ResumeLabel {
    fn from(outcome: ResumeOutcome) -> Self {
        ResumeLabel { outcome }
    }
}

/// Label set of `holdfast_server_changes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerChangeLabel {
    /// What differed from what the client was told.
    pub what: ServerChange,
}

/// What a re-established session found changed in the server (a deploy).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ServerChange {
    tools,
    prompts,
    resources,
    resource_templates,
    protocol_version,
    capabilities,
    instructions,
    server_info,
}

impl ServerChange {
    pub const ALL: [ServerChange; 8] = [
        ServerChange::tools,
        ServerChange::prompts,
        ServerChange::resources,
        ServerChange::resource_templates,
        ServerChange::protocol_version,
        ServerChange::capabilities,
        ServerChange::instructions,
        ServerChange::server_info,
    ];
}

impl From<crate::session::told::Change> for ServerChangeLabel {
    fn from(change: crate::session::told::Change) -> Self {
        use crate::session::told::{Change, List};
        let what = match change {
            Change::List(List::Tools) => ServerChange::tools,
            Change::List(List::Prompts) => ServerChange::prompts,
            Change::List(List::Resources) => ServerChange::resources,
            Change::List(List::Templates) => ServerChange::resource_templates,
            Change::ProtocolVersion => ServerChange::protocol_version,
            Change::Capabilities => ServerChange::capabilities,
            Change::Instructions => ServerChange::instructions,
            Change::ServerInfo => ServerChange::server_info,
        };
        ServerChangeLabel { what }
    }
}

/// Label set of `holdfast_session_reestablished_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReestablishLabel {
    /// Why the upstream did not know the session.
    pub cause: ReestablishCause,
}

/// Bounded causes of a re-establishment.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReestablishCause {
    /// This holdfast saw the session start, or already re-established it: the backend
    /// restarted since.
    backend_restart,
    /// Opened from its token here and not yet re-established here: the session started at
    /// another replica, or before this holdfast (and its backend) restarted.
    unknown_to_this_replica,
}

/// Label set of `holdfast_session_tokens_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabel {
    /// Why the token was not used.
    pub reason: TokenReason,
}

/// Bounded reasons a session token was not used.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum TokenReason {
    /// Not the shape of a token (cut short, altered characters, too long).
    malformed,
    /// No key opens it (a key rotated away, another deployment's key, or altered).
    unopened,
    /// Its session was ended with DELETE.
    ended,
    /// Older than `sessions.token_max_age_secs`: its session is not re-established.
    expired,
}

impl From<TokenRefusal> for TokenLabel {
    fn from(why: TokenRefusal) -> Self {
        let reason = match why {
            TokenRefusal::Malformed => TokenReason::malformed,
            TokenRefusal::Unopened => TokenReason::unopened,
            TokenRefusal::Ended => TokenReason::ended,
            TokenRefusal::Expired => TokenReason::expired,
        };
        TokenLabel { reason }
    }
}

/// Label set of `holdfast_holds_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabel {
    /// How the hold ended.
    pub outcome: HoldOutcome,
}

/// Bounded hold outcomes.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum HoldOutcome {
    /// The outage ended (or the request went out as the probe): sent.
    released,
    /// Held for `hold.timeout_secs`: answered 503.
    timed_out,
    /// The client went away while held: never sent.
    cancelled,
    /// The hold was full (requests or bytes): answered 503 at once.
    queue_full,
    /// The body was larger than `hold.max_body_bytes`, so it could not be replayed: 503.
    body_too_large,
    /// holdfast is shutting down: 503.
    shutdown,
}

impl From<HoldOutcome> for HoldLabel {
    fn from(outcome: HoldOutcome) -> Self {
        HoldLabel { outcome }
    }
}

/// Label set of `holdfast_response_aborts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AbortLabel {
    /// Why the response was cut off.
    pub reason: Abort,
}

/// Bounded abort reasons.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Abort {
    /// The upstream's body failed (reset, EOF mid-body).
    upstream_error,
    /// No frame within `streams.idle_timeout_secs`.
    idle_timeout,
}

/// Label set of `holdfast_rewrites_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the backend counted as missing.
    pub reason: Reason,
    /// What the client got instead of the upstream's answer.
    pub action: RewriteAction,
}

/// What holdfast did instead of passing a "backend missing" to the client. Bounded.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RewriteAction {
    /// The client was answered 503 + Retry-After.
    answered_503,
    /// The request was held, to be sent again once the backend is back.
    held,
}

impl RewriteAction {
    /// Every value, for pre-creating the series.
    pub const ALL: [RewriteAction; 2] = [RewriteAction::answered_503, RewriteAction::held];
}

/// Bounded rewrite reasons (mirrors [`RewriteReason`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reason {
    /// Connection refused.
    connect_refused,
    /// Connect timed out.
    connect_timeout,
    /// Name did not resolve.
    dns,
    /// Host or network unreachable.
    unreachable,
    /// Other connect failure.
    connect_error,
    /// The connection closed before the upstream read the request.
    connection_closed,
    /// A router's route-missing 404.
    route_missing_404,
    /// A router's own 5xx.
    router_unavailable,
    /// Held through a planned restart (`holdfast pause`).
    paused,
    /// An event stream ended without the request's answer (a server shutting down).
    unanswered,
    /// A request safe to run twice broke the connection twice (a server dying under it).
    upstream_reset,
}

impl ReasonLabel {
    /// The series for `reason` and `action`.
    pub fn new(r: RewriteReason, action: RewriteAction) -> Self {
        let reason = match r {
            RewriteReason::ConnectRefused => Reason::connect_refused,
            RewriteReason::ConnectTimeout => Reason::connect_timeout,
            RewriteReason::Dns => Reason::dns,
            RewriteReason::Unreachable => Reason::unreachable,
            RewriteReason::ConnectError => Reason::connect_error,
            RewriteReason::ConnectionClosed => Reason::connection_closed,
            RewriteReason::RouteMissing404 => Reason::route_missing_404,
            RewriteReason::RouterUnavailable => Reason::router_unavailable,
            RewriteReason::Paused => Reason::paused,
            RewriteReason::Unanswered => Reason::unanswered,
            RewriteReason::UpstreamReset => Reason::upstream_reset,
        };
        ReasonLabel { reason, action }
    }
}

/// Label set of `holdfast_upstream_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailLabel {
    /// Why the request failed.
    pub reason: Fail,
}

/// Bounded failure reasons (mirrors [`FailReason`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Fail {
    /// No response head in time.
    response_timeout,
    /// Connection broke after sending.
    upstream_reset,
    /// Not HTTP.
    upstream_protocol,
    /// TLS to the upstream failed (certificate not trusted, wrong name, protocol mismatch).
    upstream_tls,
    /// An event stream ended without the request's answer (a server shutting down).
    unanswered,
}

impl From<FailReason> for FailLabel {
    fn from(r: FailReason) -> Self {
        let reason = match r {
            FailReason::ResponseTimeout => Fail::response_timeout,
            FailReason::UpstreamReset => Fail::upstream_reset,
            FailReason::Protocol => Fail::upstream_protocol,
            FailReason::UpstreamTls => Fail::upstream_tls,
            FailReason::Unanswered => Fail::unanswered,
        };
        FailLabel { reason }
    }
}

/// Label set of `holdfast_router_passthrough_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabel {
    /// Why the router's answer was not masked.
    pub reason: Pass,
}

/// Bounded pass-through reasons.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Pass {
    /// The path is not one the application is known to serve.
    route_not_expected,
    /// Missing for longer than the horizon.
    horizon_exceeded,
}

/// Label set of `holdfast_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Request method, folded into a bounded set.
    pub method: Method,
    /// Status code the client saw (bounded by HTTP: 100..=999).
    pub status: u16,
}

/// Methods as a bounded label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(clippy::upper_case_acronyms)]
pub enum Method {
    /// GET.
    GET,
    /// POST.
    POST,
    /// DELETE.
    DELETE,
    /// PUT.
    PUT,
    /// PATCH.
    PATCH,
    /// HEAD.
    HEAD,
    /// OPTIONS.
    OPTIONS,
    /// Anything else (extension methods are unbounded).
    OTHER,
}

impl Method {
    /// Every value, in declaration order (the order `as usize` follows).
    pub const ALL: [Method; 8] = [
        Method::GET,
        Method::POST,
        Method::DELETE,
        Method::PUT,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::OTHER,
    ];
}

impl From<&http::Method> for Method {
    fn from(m: &http::Method) -> Self {
        match *m {
            http::Method::GET => Method::GET,
            http::Method::POST => Method::POST,
            http::Method::DELETE => Method::DELETE,
            http::Method::PUT => Method::PUT,
            http::Method::PATCH => Method::PATCH,
            http::Method::HEAD => Method::HEAD,
            http::Method::OPTIONS => Method::OPTIONS,
            _ => Method::OTHER,
        }
    }
}

/// Label set of `holdfast_pauses_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PauseLabel {
    /// How the pause's drain ended.
    pub outcome: PauseOutcome,
}

/// Bounded drain outcomes of a pause.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PauseOutcome {
    /// Nothing was in flight any more before the drain timeout.
    drained,
    /// Requests or streams were still in flight when the drain timeout passed.
    drain_timeout,
}

impl From<PauseOutcome> for PauseLabel {
    fn from(outcome: PauseOutcome) -> Self {
        PauseLabel { outcome }
    }
}

/// `holdfast_client_body_failures_total{reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientBodyLabel {
    /// How the client's body failed.
    pub reason: ClientBodyReason,
}

/// How a client's request body failed once its upload had begun (mirrors
/// [`ClientBodyFault`](crate::upstream::ClientBodyFault)).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ClientBodyReason {
    /// It did not decode, or ended before its length (400).
    malformed,
    /// The client stopped sending for the idle timeout (408).
    idle_timeout,
}

impl From<ClientBodyFault> for ClientBodyLabel {
    fn from(fault: ClientBodyFault) -> Self {
        let reason = match fault {
            ClientBodyFault::Malformed => ClientBodyReason::malformed,
            ClientBodyFault::Stalled => ClientBodyReason::idle_timeout,
        };
        ClientBodyLabel { reason }
    }
}

/// How a terminating holdfast's hand-off of a request ended. Bounded: a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Handoff {
    /// A peer answered it; its answer went to the client.
    answered,
    /// A peer failed after it may have read it: 502.
    failed,
    /// No peer could take it: 503.
    no_peer,
}

/// Label set of `holdfast_handoffs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoffLabel {
    /// How it ended.
    pub outcome: Handoff,
}

impl From<Handoff> for HandoffLabel {
    fn from(outcome: Handoff) -> Self {
        HandoffLabel { outcome }
    }
}
