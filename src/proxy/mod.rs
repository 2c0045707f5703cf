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
//! - `forward`: its executor: carries out each step (an attempt, a hold, an outage, a 503).
//! - `attempt`: one attempt at the upstream and its verdict.
//! - `answer`: what the client gets: passed through, 503, 502.
//! - `resume`: re-establishing a session the upstream forgot.
//! - `build`: the proxy from configuration, and again on a reload with its state carried over.
//! - [`current`]: the proxy new requests go to, replaced whole by a reload.
//! - [`ending`]: holdfast's own shutdown as streams and requests see it.
//! - [`headers`]: hop-by-hop removal, Host, X-Forwarded-*.
//! - `request`: the request made ready for the upstream, and what is refused with a 400 (ambiguous
//!   framing, Host, dot segments).
//! - `sessions`: session bookkeeping on an answer passed through; `confirm`: state a request
//!   set on a session, recorded once its answer says it worked.
//! - `unanswered`: an event stream that ends without its request's answer (a server shutting
//!   down).
//! - [`body`]: streaming response bodies under idle timeouts.
//! - [`request_id`]: each request's id, passed on or made; `access`: the access log.
//!
//! [`classify`]: crate::classify
//! [`Verdict`]: crate::classify::Verdict

mod access;
mod answer;
mod attempt;
pub mod body;
mod build;
mod confirm;
pub mod current;
pub mod ending;
mod endpoint;
mod forward;
pub mod handoff;
pub mod headers;
mod health;
pub mod in_flight;
mod life;
#[cfg(test)]
mod props;
mod request;
pub mod request_id;
mod resume;
mod sessions;
mod unanswered;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::replay::ClientBody;
use http::{Request, Response, StatusCode, Uri};
use tokio::time::Instant;

use crate::classify::ExpectedRoutes;
use crate::config::HostHeader;
use crate::hold::{OutageRoutes, PauseStart, PauseStatus, RouteOutage};
use crate::metrics::Metrics;
use crate::replay::CopyBudget;
use crate::session::Sessions;
use body::ProxyBody;
pub use request::refusal;

/// Bytes of each request body kept while it streams when holding is off: enough to echo the
/// JSON-RPC id of an MCP request in a synthetic 503, and to send a request again on a
/// re-established session. (With holding on, `hold.max_body_bytes`.)
const ID_COPY_CAP: usize = 64 * 1024;

/// How long to wait for the rest of an unsent request body when building a 503 for it (or when
/// recording an `initialize`). The client has usually sent it already; this bounds a slow one.
const BODY_ID_WAIT: Duration = Duration::from_secs(1);

/// The forwarding service, shared by every connection.
pub struct Proxy {
    /// Where requests go, and how a client's head becomes the upstream's.
    dest: Destination,
    /// The upstream as an attempt meets it: its client, how its answers are read.
    upstream: attempt::Upstream,
    timeouts: Timeouts,
    /// Request bodies kept for a replay.
    bodies: Bodies,
    /// Outages, per route (carried over a reload, as everything in an `Arc` here).
    hold: Arc<OutageRoutes>,
    /// MCP sessions carried across backend restarts.
    sessions: Arc<Sessions>,
    /// Which requests are safe to send twice.
    idempotency: Arc<crate::idempotent::Idempotency>,
    /// Requests in flight, for a pause's drain.
    in_flight: Arc<in_flight::InFlight>,
    /// holdfast's own shutdown, as streams and waiting requests see it.
    ending: Arc<ending::Ending>,
    /// The peers a terminating holdfast hands to what never reached a server.
    peers: Arc<handoff::Peers>,
    access_log: bool,
    /// Where request ids travel (`request_id.header`).
    request_ids: request_id::RequestIds,
    metrics: Arc<Metrics>,
}

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
    /// Longest a request waits for another request's re-establishment of its session.
    resume_wait: Duration,
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

/// The access-log action of a request whose client went away while it was held.
const CANCELLED: &str = "cancelled";

/// The status counted for it (nginx's "client closed request").
const CLIENT_CLOSED_REQUEST: u16 = 499;

/// The access-log action of a request whose client went away before its answer was ready
/// (while it was sent, waited for a head, or waited for a session's re-establishment): its
/// future was dropped, and whatever it waited for with it.
const CLIENT_GONE: &str = "client_gone";

/// The access-log action of a request still waiting for its answer when the drain ended: cut by
/// holdfast's shutdown, not by its client.
const SHUTDOWN: &str = "shutdown";

/// The status counted for it: the server was unavailable to finish it.
const SHUTDOWN_STATUS: u16 = 503;

/// A request not yet counted and logged. Every request is, exactly once: when its answer is
/// ready ([`Unfinished::finish`]), or, if its client goes away first and its future is dropped,
/// when this is dropped.
struct Unfinished<'a> {
    proxy: &'a Proxy,
    start: Instant,
    method: http::Method,
    /// What the access log needs of the request (only with the log on).
    access: Option<Box<access::Entry>>,
    done: bool,
}

impl Unfinished<'_> {
    /// Counts and logs the request, answered with `resp`, which goes on (its body counted for
    /// the access log). `described`: what the exchange found in the request.
    fn finish(
        &mut self,
        resp: Response<ProxyBody>,
        note: &Note,
        described: Option<Box<access::Described>>,
    ) -> Response<ProxyBody> {
        self.done = true;
        // A client that went away while held got no answer at all: counted as nginx logs it,
        // 499 "client closed request", not as the 400 its closed connection was handed.
        let status = if note.action == CANCELLED {
            CLIENT_CLOSED_REQUEST
        } else {
            resp.status().as_u16()
        };
        let took = self.proxy.record(self.start, &self.method, status);
        match self.access.take() {
            Some(entry) => {
                let (method, ending) = (&self.method, &self.proxy.ending);
                entry.answered(method, status, note, took, described, resp, ending)
            }
            None => resp,
        }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Dropped at the drain's end: holdfast cut it, not its client.
            let (status, action) = if self.proxy.ending.is_over() {
                self.proxy.metrics.shutdown_cut.inc();
                (SHUTDOWN_STATUS, SHUTDOWN)
            } else {
                (CLIENT_CLOSED_REQUEST, CLIENT_GONE)
            };
            let note = Note {
                upstream_status: None,
                action,
            };
            let took = self.proxy.record(self.start, &self.method, status);
            if let Some(entry) = &self.access {
                entry.unanswered(&self.method, status, &note, took);
            }
        }
    }
}

/// What happened, for the access log.
struct Note {
    upstream_status: Option<StatusCode>,
    action: &'static str,
}

/// The request as it goes upstream (kept for replays).
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

impl Proxy {
    /// Answers one client request. Never fails. What can be done with the request before
    /// anything is awaited is done here, outside the future: only what lives across its awaits
    /// is in it (this future lives as long as the request, for a held one as long as the hold).
    pub fn handle(
        &self,
        mut req: Request<ClientBody>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + Send + '_ {
        // First: every copy of the request's headers (each attempt's, a re-established
        // session's own requests') carries the id from here on.
        let id = self.request_ids.take(req.headers_mut());
        // The request's span: every line logged while it is served names its id. At the error
        // level, so that it exists whenever any line about the request may be written (a
        // `log_level = "warn"` keeps the ids on the warnings); its cost is the same at any level.
        let span = tracing::error_span!(
            target: "holdfast::request",
            "request",
            request_id = request_id::as_str(&id)
        );
        let mut unfinished = Unfinished {
            proxy: self,
            start: Instant::now(),
            method: req.method().clone(),
            // Only for the access log: the hot path needs no copy of the path.
            access: self.access_log.then(|| {
                let trusted = &self.dest.trusted_proxies;
                access::Entry::new(id.clone(), req.uri(), req.headers(), peer.ip(), trusted)
            }),
            done: false,
        };
        let mut begun = self.begin(req, peer);
        let answer = async move {
            // The exchange is used where it lies (moved into a local it would take room twice).
            let (resp, note) = match &mut begun {
                Ok(ex) => self.forward(ex).await,
                Err((Some(why), version)) => (
                    crate::respond::bad_request(why, *version),
                    Note {
                        upstream_status: None,
                        action: "bad_request",
                    },
                ),
                // A hand-off of this holdfast's own: its sender tries the next peer.
                Err((None, _)) => (
                    crate::respond::handoff_to_self(),
                    Note {
                        upstream_status: None,
                        action: "handoff_self",
                    },
                ),
            };
            let mut resp = resp;
            crate::respond::stamp(&mut resp, self.request_ids.header(), &id);
            let described = begun.as_mut().ok().and_then(|ex| ex.described.take());
            unfinished.finish(resp, &note, described)
        };
        tracing::Instrument::instrument(answer, span)
    }

    /// Counts one request: answered with `status`, or (499) given up by its client. Returns how
    /// long it took to its answer's head.
    fn record(&self, start: Instant, method: &http::Method, status: u16) -> Duration {
        let elapsed = start.elapsed();
        self.metrics.requests.inc(method.into(), status);
        self.metrics.request_duration.observe(elapsed.as_secs_f64());
        elapsed
    }

    /// Starts shutting down: standalone event streams end; held requests go to a peer now
    /// (`[peers]`), or, without peers, keep waiting for the upstream until the drain ends.
    pub fn begin_shutdown(&self) {
        if self.peers.any() {
            self.hold.shutdown();
        }
        self.ending.reach(ending::Phase::Draining);
    }

    /// The drain is over: every event stream ends cleanly, what is still held gets its 503, and
    /// what still waits for its answer is cut by holdfast (logged and counted so).
    pub fn drain_over(&self) {
        self.hold.shutdown();
        self.ending.reach(ending::Phase::Over);
    }

    /// The outage state of the route `target` takes: the Host it sends upstream, and the
    /// endpoint its path falls under.
    fn route_of(&self, target: &Target) -> Arc<RouteOutage> {
        self.hold.route(
            target.headers.get(http::header::HOST),
            self.upstream
                .reading
                .routes
                .endpoint_of(target.client.path()),
        )
    }

    /// Pauses for a planned restart (`holdfast pause`): new requests are held before they are
    /// sent, while those in flight finish. `who` asked (for the log).
    pub fn pause(&self, who: &str) -> PauseStart {
        let host = if self.dest.note_hosts {
            self.in_flight.last_host()
        } else {
            None
        };
        self.hold.pause(self.timeouts.pause_max, who, host)
    }

    /// Ends a pause (`holdfast resume`). False when none was in progress.
    pub fn unpause(&self, who: &str) -> bool {
        self.hold.resume(who)
    }

    /// This process's instance id: what its hand-offs carry in `holdfast-handoff`, so that a
    /// peer's log names the sender and a holdfast knows its own.
    pub fn instance(&self) -> &str {
        self.peers.me().to_str().unwrap_or_default()
    }

    /// The pause in progress, if any.
    pub fn pause_status(&self) -> Option<PauseStatus> {
        self.hold.pause_status()
    }

    /// The upstream as configured, and the upstream-wide outage if one is open: its first
    /// reason and how long it has lasted.
    pub fn upstream_status(
        &self,
    ) -> (
        &str,
        Option<(crate::classify::RewriteReason, std::time::Duration)>,
    ) {
        (
            &self.dest.url.original,
            self.hold.upstream().outage_status(),
        )
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> &in_flight::InFlight {
        &self.in_flight
    }

    /// Counts a pause's drain (`holdfast_pauses_total`).
    pub fn count_pause(&self, outcome: crate::metrics::PauseOutcome) {
        self.metrics.pauses.get_or_create(&outcome.into()).inc();
    }

    /// The keys session tokens are sealed with (for their reloader), when sessions are
    /// carried at all.
    pub fn session_keys(&self) -> Option<Arc<crate::session::Keys>> {
        self.sessions.enabled().then(|| self.sessions.keys())
    }

    /// The check at rest of the upstream, to run as long as holdfast serves (it reads
    /// `hold.check_interval_secs` at every tick; 0 turns it off).
    pub fn checks_at_rest(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.hold.at_rest()
    }

    /// Sessions tracked now (for tests and the demo).
    pub fn sessions_tracked(&self) -> usize {
        self.sessions.len()
    }
}
