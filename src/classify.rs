//! What an upstream outcome means: the one flat, ordered decision.
//!
//! [`classify`] turns one attempt at the upstream (an error, or a response head with at most a
//! peeked body) into a [`Verdict`]. It reads top to bottom in the order of the behaviour table in
//! the README; the proxy acts on the verdict and nothing else decides what the client sees.
//!
//! The distinction that matters most is between *the backend is missing* (the request provably
//! never reached the application: nothing answered, or a router answered by itself) and *the
//! request may have reached the application* (it was sent and then something went wrong). Only the
//! first may be held and replayed. The 503 + Retry-After goes to "missing" verdicts, which
//! include a router's own 502/504 (the row 3: Traefik sends them for dial failures too);
//! those are never replayed, because Traefik also sends them after the backend read the request.

use http::header::HeaderMap;
use http::StatusCode;

use crate::signature::Signature;
use crate::upstream::{ClientBodyFault, ConnectErrorKind, FailedSend};

/// What one attempt at the upstream means for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The application answered: its response passes through untouched.
    Application,
    /// A router answered by itself, but its answer must reach the client as it is.
    RouterPassthrough(PassReason),
    /// The backend is missing: the client gets a 503 with Retry-After.
    Missing(Missing),
    /// The request may have reached the application and then failed, or it cannot be sent for
    /// a reason that waiting does not fix (TLS): 502, never held or replayed.
    Failed(FailReason),
    /// The client broke its own request body once the upload had begun: its fault, answered as
    /// nginx and HAProxy answer it (400, or 408 for a stall), never counted against the
    /// upstream, never held or replayed.
    ClientBody(ClientBodyFault),
}

/// Why a router's own answer is passed through rather than rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// The path is not one the application is known to serve, so the 404 is the truth.
    RouteNotExpected,
    /// The route has been missing for longer than the horizon: likely a wrong upstream URL.
    HorizonExceeded,
}

/// A "backend missing" verdict: why, and whether the request provably never reached the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missing {
    /// The reason, also the `reason` label of `holdfast_rewrites_total`.
    pub reason: RewriteReason,
    /// True when the request provably never reached the application.
    pub never_reached_app: bool,
}

impl Missing {
    /// Whether sending this request again cannot execute it twice.
    pub fn is_safe_to_replay(&self) -> bool {
        self.never_reached_app
    }
}

/// Why a response was rewritten to 503. A bounded set: it is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RewriteReason {
    /// TCP connection refused: nothing listens (container gone or starting).
    ConnectRefused,
    /// TCP connect did not complete in time.
    ConnectTimeout,
    /// The upstream host name did not resolve (container removed from DNS).
    Dns,
    /// No route to the host or network.
    Unreachable,
    /// Any other failure while connecting, before a byte of the request was sent.
    ConnectError,
    /// The connection closed before the upstream read any byte of the request: a pooled
    /// connection that a stopped (or killed) backend had closed, or a port that accepted and
    /// closed at once.
    ConnectionClosed,
    /// A router said "no route" with a known 404 signature.
    RouteMissing404,
    /// A router said "no server" / could not dial with a known 5xx signature.
    RouterUnavailable,
    /// holdfast is paused for a planned restart (`holdfast pause`): never a verdict of the
    /// classifier, only the reason of a request held through a pause that got its 503.
    Paused,
    /// The server answered a request with an event stream and ended it without the request's
    /// answer: it is going away (a graceful shutdown ends every stream at once). Never a verdict
    /// of the classifier (it shows only once the stream ends, src/proxy/unanswered.rs); the
    /// upstream-wide outage it opens is probed, like a failed connection, by connecting.
    Unanswered,
    /// The connection broke after a request that is safe to run twice was sent (reset, closed
    /// before the answer), twice in a row: the server is dying or restarting under it. Never a
    /// verdict of the classifier (the same break of any other request is a 502); the proxy
    /// decides it from the request (src/proxy/life.rs, `broke`). The upstream-wide outage it
    /// opens is probed, like a failed connection, by connecting.
    UpstreamReset,
}

impl RewriteReason {
    /// Every reason, for pre-registering metrics and for docs.
    pub const ALL: [RewriteReason; 11] = [
        RewriteReason::ConnectRefused,
        RewriteReason::ConnectTimeout,
        RewriteReason::Dns,
        RewriteReason::Unreachable,
        RewriteReason::ConnectError,
        RewriteReason::ConnectionClosed,
        RewriteReason::RouteMissing404,
        RewriteReason::RouterUnavailable,
        RewriteReason::Paused,
        RewriteReason::Unanswered,
        RewriteReason::UpstreamReset,
    ];

    /// The reason a failed connection gives: none for a TLS handshake refused on its
    /// certificate or protocol (a configuration error, not a missing backend).
    pub fn of_connect(kind: ConnectErrorKind) -> Option<RewriteReason> {
        Some(match kind {
            ConnectErrorKind::Refused => RewriteReason::ConnectRefused,
            ConnectErrorKind::Timeout => RewriteReason::ConnectTimeout,
            ConnectErrorKind::Dns => RewriteReason::Dns,
            ConnectErrorKind::Unreachable => RewriteReason::Unreachable,
            ConnectErrorKind::Other => RewriteReason::ConnectError,
            ConnectErrorKind::Tls => return None,
        })
    }

    /// Whether the request failed to connect (as opposed to a router answering).
    pub fn is_connect_failure(&self) -> bool {
        !matches!(
            self,
            RewriteReason::RouteMissing404
                | RewriteReason::RouterUnavailable
                | RewriteReason::Paused
        )
    }

    /// The label value and the `holdfast-reason` header value.
    pub fn as_str(&self) -> &'static str {
        match self {
            RewriteReason::ConnectRefused => "connect_refused",
            RewriteReason::ConnectTimeout => "connect_timeout",
            RewriteReason::Dns => "dns",
            RewriteReason::Unreachable => "unreachable",
            RewriteReason::ConnectError => "connect_error",
            RewriteReason::ConnectionClosed => "connection_closed",
            RewriteReason::RouteMissing404 => "route_missing_404",
            RewriteReason::RouterUnavailable => "router_unavailable",
            RewriteReason::Paused => "paused",
            RewriteReason::Unanswered => "unanswered",
            RewriteReason::UpstreamReset => "upstream_reset",
        }
    }
}

/// Why a request failed with a 502: it may have reached the application, or (TLS) it cannot be
/// sent at all until someone fixes a certificate or the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// No response headers within `client.response_timeout_secs`.
    ResponseTimeout,
    /// The connection broke after the request was (partly) sent.
    UpstreamReset,
    /// The upstream sent something that is not HTTP.
    Protocol,
    /// TLS to the upstream failed: its certificate is not trusted or not for its name, it
    /// refused holdfast's client certificate, or no protocol version or cipher suite is shared.
    /// A configuration error that no retry fixes.
    UpstreamTls,
    /// The server answered with an event stream and ended it without the request's answer (a
    /// graceful shutdown): the request reached it and may have run.
    Unanswered,
}

impl FailReason {
    /// Short name for logs and the `holdfast-reason` header.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailReason::ResponseTimeout => "response_timeout",
            FailReason::UpstreamReset => "upstream_reset",
            FailReason::Protocol => "upstream_protocol",
            FailReason::UpstreamTls => "upstream_tls",
            FailReason::Unanswered => "unanswered",
        }
    }
}

/// One attempt's outcome, as the classifier sees it.
pub enum Outcome<'a> {
    /// Sending failed, as decided where it failed.
    Failed(FailedSend),
    /// The response headers arrived waiting longer than allowed.
    ResponseTimeout,
    /// A response arrived. `body` is the complete body when it was peeked (a candidate status
    /// with a small enough body), `None` when it was not read.
    Response {
        /// Response status.
        status: StatusCode,
        /// Response headers.
        headers: &'a HeaderMap,
        /// The complete body, if peeked.
        body: Option<&'a [u8]>,
    },
}

/// What the classifier needs to know about the request and the upstream's recent history.
pub struct Context<'a> {
    /// Active signatures, in order.
    pub signatures: &'a [Signature],
    /// Whether the application is expected to serve this request's path.
    pub route_expected: bool,
    /// Whether the last healthy answer is older than the horizon.
    pub beyond_horizon: bool,
}

/// The decision, top to bottom. The first matching row wins.
pub fn classify(outcome: &Outcome<'_>, cx: &Context<'_>) -> Verdict {
    match outcome {
        // 1a. The TLS handshake with the upstream failed on a certificate or the protocol
        //     (untrusted, wrong name, expired, client certificate refused, nothing in common).
        //     Nothing was sent, but a restarting container does not cause this and waiting does
        //     not fix it: it is a configuration error, answered 502 at once and never held.
        //     (A TLS connection that fails on I/O, refused or timed out, is row 1.)
        // 1. The connection failed before anything was sent: the backend is missing, and the
        //    request certainly never reached it.
        Outcome::Failed(FailedSend::NotConnected(kind)) => match RewriteReason::of_connect(*kind) {
            None => Verdict::Failed(FailReason::UpstreamTls),
            Some(reason) => Verdict::Missing(Missing {
                reason,
                never_reached_app: true,
            }),
        },

        // 1b. The connection closed before the upstream read any byte of the request, as the
        //     kernel shows (the pooled connection handed it back unwritten, or the upstream's TCP acknowledged
        //     none of it): the backend stopped or is starting, and the request never reached it.
        Outcome::Failed(FailedSend::NeverRead) => Verdict::Missing(Missing {
            reason: RewriteReason::ConnectionClosed,
            never_reached_app: true,
        }),

        // 2. and 3. A router answered by itself (a known signature).
        Outcome::Response {
            status,
            headers,
            body,
        } => match cx
            .signatures
            .iter()
            .find(|s| s.matches(*status, headers, *body))
        {
            // A router's 404 on a path the application is not known to serve is the truth
            // (e.g. OAuth discovery under /.well-known/ when only /mcp is routed).
            Some(sig) if sig.is_route_missing() && !cx.route_expected => {
                Verdict::RouterPassthrough(PassReason::RouteNotExpected)
            }
            // Missing for longer than the horizon: a wrong upstream must surface, not hide.
            Some(sig) if sig.is_route_missing() && cx.beyond_horizon => {
                Verdict::RouterPassthrough(PassReason::HorizonExceeded)
            }
            Some(sig) => Verdict::Missing(Missing {
                reason: if sig.is_route_missing() {
                    RewriteReason::RouteMissing404
                } else {
                    RewriteReason::RouterUnavailable
                },
                never_reached_app: sig.replay_safe,
            }),
            // 4. Everything else is the application's own answer, whatever its status.
            None => Verdict::Application,
        },

        // 5. Sent, then no answer in time: it may be executing right now.
        Outcome::ResponseTimeout => Verdict::Failed(FailReason::ResponseTimeout),
        // 6. The client's body broke while it was forwarded: the client's failure, whatever
        //    the upstream made of an upload cut short.
        Outcome::Failed(FailedSend::ClientBody(fault)) => Verdict::ClientBody(*fault),
        // 7. Sent, then failed: the application may have executed it.
        Outcome::Failed(FailedSend::Tls) => Verdict::Failed(FailReason::UpstreamTls),
        Outcome::Failed(FailedSend::Protocol) => Verdict::Failed(FailReason::Protocol),
        Outcome::Failed(FailedSend::Broke) => Verdict::Failed(FailReason::UpstreamReset),
    }
}

mod routes;
pub use routes::{ExpectedRoutes, LegacyPaths};

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests;
