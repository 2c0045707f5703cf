//! Forwarding: one client request, one or more upstream attempts, one answer.
//!
//! [`Proxy::handle`] never fails: every failure has become a response by the time it returns
//! (hyper's service error type is `Infallible`). The steps, in order:
//!
//! 1. rewrite the request for the upstream (URI, Host, hop-by-hop, X-Forwarded-*, the session
//!    id the upstream knows);
//! 2. send it, streaming the body, with a deadline on the response *head* only;
//! 3. for a status some router signature could match, peek at a bounded body prefix;
//! 4. ask [`classify`] what the outcome means, and act on the [`Verdict`]: pass through; for a
//!    missing backend hold the request and send it again once the backend is back (only if it
//!    provably never reached the application), or answer 503; for the application's 404 on a
//!    session it forgot, re-establish the session and send the request again; answer 502 for a
//!    failure after the request may have reached the application.
//!
//! # Layout
//! - `life`: one request's life as a plain state machine: what happened in, the next step out.
//! - `forward`: [`Proxy`], its executor, and the only `impl Proxy`: it carries out each step
//!   (an attempt, a hold, an outage, a 503) with the parts it owns; `forward/service` takes a
//!   request in and counts and logs it once, `forward/control` is what the rest of holdfast asks
//!   (shutdown, pause, status), `forward/build` builds it from configuration and again on a
//!   reload with its state carried over. The parts own their fields and know nothing of `Proxy`:
//! - `attempt`: the `Upstream` part: one attempt at the upstream and its verdict.
//! - `answer`: the `Answers` part: what the client gets: passed through, 503, 502.
//! - `sessions`: the `Keeper` part: the carried sessions; `resume`: re-establishing one the
//!   upstream forgot.
//! - [`current`]: the proxy new requests go to, replaced whole by a reload.
//! - [`ending`]: holdfast's own shutdown as streams and requests see it.
//! - [`headers`]: hop-by-hop removal, Host, X-Forwarded-*.
//! - `request`: the request made ready for the upstream, and what is refused with a 400 (ambiguous
//!   framing, Host, dot segments).
//! - `confirm`: state a request set on a session, recorded once its answer says it worked.
//! - `unanswered`: an event stream that ends without its request's answer (a server shutting
//!   down).
//! - [`body`]: streaming response bodies under idle timeouts.
//! - [`request_id`]: each request's id, passed on or made; `access`: the access log.
//!
//! [`classify`]: crate::classify
//! [`Verdict`]: crate::classify::Verdict

mod access;
mod action;
use action::Action;
mod answer;
mod asking;
mod attempt;
pub mod body;
mod bridged;
mod confirm;
pub mod current;
pub mod ending;
mod endpoint;
mod forward;
pub mod handoff;
pub mod headers;
mod health;
pub mod in_flight;
mod kept;
mod life;
mod listening;
#[cfg(test)]
mod props;
mod request;
pub mod request_id;
mod resume;
mod sent;
mod sessions;
mod told;
mod traced;
mod unanswered;

use std::sync::Arc;
use std::time::Duration;

use http::{StatusCode, Uri};

use crate::classify::ExpectedRoutes;
use crate::config::HostHeader;
use crate::replay::CopyBudget;
pub use forward::Proxy;
pub use request::refusal;

/// Bytes of each request body kept while it streams when holding is off: enough to echo the
/// JSON-RPC id of an MCP request in a synthetic 503, and to send a request again on a
/// re-established session. (With holding on, `hold.max_body_bytes`.)
const ID_COPY_CAP: usize = 64 * 1024;

/// How long to wait for the rest of an unsent request body when building a 503 for it (or when
/// recording an `initialize`). The client has usually sent it already; this bounds a slow one.
const BODY_ID_WAIT: Duration = Duration::from_secs(1);

/// Where requests go, and how a client's request head becomes the upstream's
/// (src/proxy/request.rs).
struct Destination {
    url: crate::config::UpstreamUrl,
    /// `scheme://authority` of the upstream, lower case: what a legacy server's absolute
    /// `endpoint` URL names when it names itself (src/proxy/endpoint.rs).
    origin: Arc<str>,
    /// `http` or `https`, for every upstream URI.
    scheme: http::uri::Scheme,
    /// The upstream's `host:port` as a Host value (`client.host_header = "upstream"`).
    host: http::HeaderValue,
    host_header: HostHeader,
    /// `X-Forwarded-Proto`: what the client spoke to holdfast (`https` when the listener is TLS).
    client_proto: &'static str,
    /// Peers whose `X-Forwarded-*` are kept (`forwarded.trusted_proxies`).
    trusted_proxies: crate::config::TrustedProxies,
    /// Remember the Host of answered requests (a pause's presence check needs one a router
    /// routes): only when the client's Host goes upstream.
    note_hosts: bool,
}

/// How the upstream's answers are read: what the classifier is given.
struct Reading {
    signatures: Vec<crate::signature::Signature>,
    routes: ExpectedRoutes,
    horizon: Duration,
    max_peek_bytes: usize,
}

/// How long the proxy's own waits may last.
struct Timeouts {
    /// `streams.idle_timeout_secs`.
    stream_idle: Duration,
    /// `pause.max_secs`.
    pause_max: Duration,
}

/// Request bodies kept for a replay.
struct Bodies {
    /// Request body bytes kept for a replay (or for the JSON-RPC id of a 503).
    replay_cap: usize,
    /// All request-body copies together stay within `hold.max_buffered_bytes`.
    copy_budget: Arc<CopyBudget>,
}

/// The status counted for it (nginx's "client closed request").
const CLIENT_CLOSED_REQUEST: u16 = 499;

/// The status counted for it: the server was unavailable to finish it.
const SHUTDOWN_STATUS: u16 = 503;

/// What happened, for the access log.
struct Note {
    upstream_status: Option<StatusCode>,
    action: Action,
}

/// The request as it goes upstream (kept for replays).
#[derive(Clone)]
struct Target {
    method: http::Method,
    uri: Uri,
    headers: http::HeaderMap,
    /// The client's request target (its path decides expected routes and learning).
    client: Uri,
    /// The client's Host (or `:authority`): where a legacy server's endpoint must point.
    client_host: Option<http::HeaderValue>,
}

/// The session a request carries, when holdfast tracks it.
struct Carried {
    session: Arc<crate::session::Session>,
    /// The upstream id the last attempt sent: a resume is needed only while it is current.
    sent: http::HeaderValue,
}
