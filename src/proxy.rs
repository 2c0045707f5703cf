//! Forwarding: one client request, one or more upstream attempts, one answer.
//!
//! [`Proxy::handle`] never fails: every failure has become a response by the time it returns
//! (hyper's service error type is `Infallible`). The steps, in order:
//!
//! 1. rewrite the request for the upstream (URI, Host, hop-by-hop, X-Forwarded-*);
//! 2. send it, streaming the body, with a deadline on the response *head* only;
//! 3. for a status some router signature could match, peek at a bounded body prefix;
//! 4. ask [`classify`] what the outcome means, and act on the [`Verdict`]: pass through; for a
//!    missing backend hold the request and send it again once the backend is back (only if it
//!    provably never reached the application), or answer 503; answer 502 for a failure after
//!    the request may have reached the application.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use crate::body::{IdleTimeout, ProxyBody, Timed};
use crate::classify::{
    self, ErrorChain, ExpectedRoutes, FailReason, Outcome, PassReason, RewriteReason, Verdict,
};
use crate::config::{Config, HostHeader};
use crate::headers;
use crate::hold::{Outages, Released, Ticket};
use crate::metrics::{Metrics, Pass, PassLabel, RequestLabels};
use crate::replay::{BodyHandle, CopyBudget, ReplayBody};
use crate::respond;
use crate::upstream::{self, Client};

/// Bytes of each request body kept while it streams when holding is off: enough to echo the
/// JSON-RPC id of an MCP request in a synthetic 503. (With holding on, `hold.max_body_bytes`.)
const ID_COPY_CAP: usize = 64 * 1024;

/// How long to wait for the rest of an unsent request body when building a 503 for it. The
/// client has usually sent it already; this bounds a slow one.
const BODY_ID_WAIT: Duration = Duration::from_secs(1);

/// Header added to SSE responses so nginx in front does not buffer them.
const X_ACCEL_BUFFERING: &str = "x-accel-buffering";

/// The forwarding service, shared by every connection.
pub struct Proxy {
    upstream: crate::config::UpstreamUrl,
    host_header: HostHeader,
    response_timeout: Duration,
    stream_idle_timeout: Duration,
    horizon: Duration,
    max_peek_bytes: usize,
    access_log: bool,
    signatures: Vec<classify::Signature>,
    routes: ExpectedRoutes,
    client: Client,
    /// `X-Forwarded-Proto`: what the client spoke to holdfast (`https` when the listener is TLS).
    client_proto: &'static str,
    /// Request body bytes kept for a replay (or for the JSON-RPC id of a 503).
    replay_cap: usize,
    /// All request-body copies together stay within `hold.max_buffered_bytes`.
    copy_budget: Arc<CopyBudget>,
    outages: Arc<Outages>,
    metrics: Arc<Metrics>,
}

/// What happened, for the access log.
struct Note {
    upstream_status: Option<StatusCode>,
    action: &'static str,
}

impl Proxy {
    /// Builds the proxy from validated configuration.
    pub fn new(cfg: &Config, metrics: Arc<Metrics>) -> Self {
        Self {
            upstream: cfg.upstream.clone(),
            host_header: cfg.host_header,
            response_timeout: cfg.response_timeout,
            stream_idle_timeout: cfg.stream_idle_timeout,
            horizon: cfg.routes.horizon,
            max_peek_bytes: cfg.routes.max_peek_bytes,
            access_log: cfg.access_log,
            signatures: cfg.routes.signatures.clone(),
            routes: ExpectedRoutes::new(
                cfg.routes.endpoints.clone(),
                cfg.routes.learn,
                cfg.routes.learn_ttl,
            ),
            client: upstream::client(
                cfg.connect_timeout,
                cfg.pool_idle_timeout,
                cfg.upstream_tls.as_ref().map(|t| t.config.clone()),
            ),
            client_proto: if cfg.tls.is_some() { "https" } else { "http" },
            replay_cap: if cfg.hold.enabled {
                cfg.hold.max_body_bytes
            } else {
                ID_COPY_CAP
            },
            copy_budget: CopyBudget::new(cfg.hold.max_buffered_bytes),
            outages: Arc::new(Outages::new(
                cfg.hold.clone(),
                cfg.retry_after,
                cfg.upstream.base_uri(),
                upstream::Connector::new(cfg.connect_timeout),
                metrics.clone(),
            )),
            metrics,
        }
    }

    /// Answers one client request. Never fails.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        let start = Instant::now();
        let method = req.method().clone();
        // Copied only for the access log: the hot path needs no second copy of the path.
        let path = self.access_log.then(|| req.uri().path().to_owned());
        let (resp, note) = self.forward(req, peer).await;
        let elapsed = start.elapsed();
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                method: (&method).into(),
                status: resp.status().as_u16(),
            })
            .inc();
        self.metrics.request_duration.observe(elapsed.as_secs_f64());
        if self.access_log {
            // Path only: a query may carry tokens. Never headers or bodies.
            tracing::info!(
                target: "holdfast::access",
                method = %method,
                path = path.as_deref().unwrap_or_default(),
                status = resp.status().as_u16(),
                upstream_status = note.upstream_status.map(|s| s.as_u16()),
                action = note.action,
                duration_ms = elapsed.as_secs_f64() * 1000.0,
            );
        }
        resp
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> (Response<ProxyBody>, Note) {
        let version = req.version();
        let (parts, body) = req.into_parts();
        let target = match self.prepare(parts, peer) {
            Ok(t) => t,
            Err(why) => {
                return (
                    respond::bad_request(why, version),
                    Note {
                        upstream_status: None,
                        action: "bad_request",
                    },
                )
            }
        };
        let handle = BodyHandle::new(
            body,
            self.replay_cap,
            self.copy_budget.clone(),
            self.stream_idle_timeout,
        );
        let mut ticket = Ticket::default();

        // Hold before dispatch while an outage is known: nothing is sent into a known gap, and
        // the body needs no copy for a replay because it was never sent.
        if self.outages.enabled() && self.outages.holds_before_dispatch(self.horizon) {
            match self.outages.wait(&mut ticket, &handle).await {
                Released::Go | Released::NotHeld => {}
                Released::Cancelled => return client_gone(version),
                Released::TimedOut | Released::QueueFull | Released::Shutdown => {
                    let reason = self
                        .outages
                        .current_reason()
                        .unwrap_or(RewriteReason::ConnectError);
                    return self.unavailable(reason, &ticket, &handle).await;
                }
            }
        }

        let mut replay = false;
        loop {
            let Some(body) = handle.attempt() else {
                // Only after a hold: the body turned out unsendable while it waited (it failed,
                // or was superseded). Nothing of it went out again.
                let reason = self
                    .outages
                    .current_reason()
                    .unwrap_or(RewriteReason::ConnectError);
                return self.unavailable(reason, &ticket, &handle).await;
            };
            if replay {
                self.metrics.replays.inc();
            }
            let (verdict, response) = self.attempt(&target, body).await;
            // A probe that met the gap again reports from the hold, once it is queued again.
            if !matches!(verdict, Verdict::Missing(_)) {
                ticket.report_probe(verdict == Verdict::Application);
            }
            let status = response.as_ref().map(|(head, _)| head.status);
            let note = |action| Note {
                upstream_status: status,
                action,
            };
            match (verdict, response) {
                (Verdict::Application, Some((mut head, peek))) => {
                    self.outages.answered();
                    if head.status == StatusCode::NOT_FOUND {
                        self.metrics.passthrough_404.inc();
                    } else {
                        self.routes.learn(&target.path, Instant::now());
                    }
                    return (self.pass(&mut head, peek), note("passed"));
                }
                (Verdict::RouterPassthrough(reason), Some((mut head, peek))) => {
                    self.metrics
                        .router_passthrough
                        .get_or_create(&PassLabel {
                            reason: match reason {
                                PassReason::RouteNotExpected => Pass::route_not_expected,
                                PassReason::HorizonExceeded => Pass::horizon_exceeded,
                            },
                        })
                        .inc();
                    if reason == PassReason::HorizonExceeded {
                        self.outages
                            .horizon_exceeded(self.horizon, &self.upstream.original);
                    }
                    return (self.pass(&mut head, peek), note("router_passed"));
                }
                (Verdict::Failed(reason), _) => {
                    // A TLS failure is the upstream answering (with a certificate holdfast does
                    // not accept): it is there. Close any outage so held requests get their
                    // answer now instead of one at a time as probes. (A reset after sending
                    // proves nothing: a port proxy may accept and then reset while the backend
                    // is still starting.)
                    if reason == FailReason::UpstreamTls {
                        self.outages.answered();
                    }
                    return self.failed(reason, version, status);
                }
                (Verdict::Missing(missing), _) => {
                    // The one decision about a missing backend: hold and replay, or 503.
                    self.outages.missing(missing.reason);
                    // Replay only what provably never reached the application: a connection
                    // that failed before the request was written, or a router that answered by
                    // itself. A router's 502/504 may follow a request the backend did read.
                    if !self.outages.enabled() || !missing.is_safe_to_replay() {
                        return self.unavailable(missing.reason, &ticket, &handle).await;
                    }
                    // Stop the failed attempt's body if its connection still reads it.
                    handle.supersede();
                    if !handle.is_replayable() {
                        // The body outgrew hold.max_body_bytes while it was sent: no copy.
                        self.outages.body_too_large();
                        return self.unavailable(missing.reason, &ticket, &handle).await;
                    }
                    match self.outages.wait(&mut ticket, &handle).await {
                        Released::Go | Released::NotHeld => replay = true,
                        Released::Cancelled => return client_gone(version),
                        Released::TimedOut | Released::QueueFull | Released::Shutdown => {
                            return self.unavailable(missing.reason, &ticket, &handle).await
                        }
                    }
                }
                (Verdict::Application | Verdict::RouterPassthrough(_), None) => {
                    unreachable!("the classifier passes responses only")
                }
            }
        }
    }

    /// Rewrites the client's request head for the upstream.
    fn prepare(
        &self,
        mut parts: http::request::Parts,
        peer: SocketAddr,
    ) -> Result<Target, &'static str> {
        let uri = self.upstream_uri(&parts.uri)?;
        // The client's host: `Host` on HTTP/1.1, `:authority` on HTTP/2.
        let client_host = parts
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
            .or_else(|| parts.uri.authority().map(|a| a.to_string()));
        headers::strip_hop_by_hop(&mut parts.headers);
        headers::add_forwarded(
            &mut parts.headers,
            peer.ip(),
            self.client_proto,
            client_host.as_deref(),
        );
        match (self.host_header, &client_host) {
            (HostHeader::Preserve, Some(host)) => headers::set_host(&mut parts.headers, host),
            _ => headers::set_host(&mut parts.headers, self.upstream.authority.as_str()),
        }
        Ok(Target {
            path: parts.uri.path().to_owned(),
            method: parts.method,
            uri,
            headers: parts.headers,
        })
    }

    /// One attempt at the upstream and its verdict. The response comes back with verdicts that
    /// pass it through.
    async fn attempt(&self, target: &Target, body: ReplayBody) -> (Verdict, Option<Answer>) {
        let mut req = Request::new(body);
        *req.method_mut() = target.method.clone();
        *req.uri_mut() = target.uri.clone();
        // The upstream connection speaks HTTP/1.1 whatever the client spoke, unless it is TLS
        // and the upstream picked h2 by ALPN: hyper's client then sends the request as HTTP/2.
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = target.headers.clone();
        let sent = tokio::time::timeout(self.response_timeout, self.client.request(req)).await;

        // The horizon matters only for a 404 (and costs a lock): asked only then.
        let cx = |route_expected, status: Option<StatusCode>| classify::Context {
            signatures: &self.signatures,
            route_expected,
            beyond_horizon: status == Some(StatusCode::NOT_FOUND)
                && self.outages.beyond_horizon(self.horizon),
        };
        let resp = match sent {
            Err(_elapsed) => {
                return (
                    classify::classify(&Outcome::ResponseTimeout, &cx(true, None)),
                    None,
                )
            }
            Ok(Err(err)) => {
                let verdict = classify::classify(&Outcome::Error(&err), &cx(true, None));
                if verdict == Verdict::Failed(FailReason::UpstreamTls) {
                    // A configuration error: say what is wrong, every time, loudly.
                    tracing::error!(
                        upstream = %self.upstream.original,
                        error = %ErrorChain(&err),
                        "TLS to the upstream failed; check its certificate against client.ca \
                         (or the system roots) and its name, and client.cert/client.key"
                    );
                } else {
                    tracing::debug!(error = %ErrorChain(&err), ?verdict, "upstream request failed");
                }
                return (verdict, None);
            }
            Ok(Ok(resp)) => resp,
        };
        let (head, body) = resp.into_parts();
        let peek = if self.signatures.iter().any(|s| s.status == head.status) {
            match self.peek(&head.headers, body).await {
                Ok(p) => p,
                Err(err) => {
                    // The upstream broke (or stalled) before its small body arrived: nothing
                    // reached the client yet, and the request did reach the upstream.
                    tracing::debug!(error = %ErrorChain(err.as_ref()), "upstream body failed while peeking");
                    let reason = if err.is::<IdleTimeout>() {
                        FailReason::ResponseTimeout
                    } else {
                        FailReason::UpstreamReset
                    };
                    return (Verdict::Failed(reason), None);
                }
            }
        } else {
            Peeked {
                complete: None,
                prefix: None,
                rest: body,
            }
        };
        let verdict = classify::classify(
            &Outcome::Response {
                status: head.status,
                headers: &head.headers,
                body: peek.complete.as_deref(),
            },
            &cx(
                self.routes.is_expected(&target.path, Instant::now()),
                Some(head.status),
            ),
        );
        (verdict, Some((head, peek)))
    }

    /// Answers 503 + Retry-After for a missing backend: at once, or after a hold that ended
    /// without a release.
    async fn unavailable(
        &self,
        reason: RewriteReason,
        ticket: &Ticket,
        handle: &BodyHandle,
    ) -> (Response<ProxyBody>, Note) {
        self.metrics.rewrites.get_or_create(&reason.into()).inc();
        self.outages.answering_503();
        let retry_after = self.outages.retry_after(ticket.waited());
        let body = handle.read_whole(BODY_ID_WAIT).await;
        (
            respond::unavailable(reason, retry_after, body.as_deref()),
            Note {
                upstream_status: None,
                action: "rewritten",
            },
        )
    }

    /// Starts shutting down: held requests get their 503 now.
    pub fn begin_shutdown(&self) {
        self.outages.shutdown();
    }

    fn failed(
        &self,
        reason: FailReason,
        version: Version,
        upstream_status: Option<StatusCode>,
    ) -> (Response<ProxyBody>, Note) {
        self.metrics
            .upstream_failures
            .get_or_create(&reason.into())
            .inc();
        match reason {
            // A client that went away is not worth a warning: nobody reads this answer.
            FailReason::ClientBody => {
                tracing::debug!("the client's request body failed; answering 502")
            }
            // Already logged as an error, with its cause, where the cause was at hand.
            FailReason::UpstreamTls => {}
            _ => tracing::warn!(
                reason = reason.as_str(),
                "upstream failed after the request may have reached it; answering 502"
            ),
        }
        (
            respond::bad_gateway(reason, version),
            Note {
                upstream_status,
                action: "failed",
            },
        )
    }

    /// Passes an upstream response through: hop-by-hop headers removed, body streamed under the
    /// idle timeout, SSE marked unbuffered and counted while it lives.
    fn pass(&self, head: &mut http::response::Parts, peek: Peeked) -> Response<ProxyBody> {
        headers::strip_hop_by_hop(&mut head.headers);
        let is_sse = head
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.trim_start()
                    .get(..17)
                    .is_some_and(|p| p.eq_ignore_ascii_case("text/event-stream"))
            });
        let prefix = peek.complete.or(peek.prefix);
        let timed = Timed::new(prefix, peek.rest, self.stream_idle_timeout)
            .counting_aborts(&self.metrics.response_aborts);
        let body = if is_sse {
            head.headers
                .entry(X_ACCEL_BUFFERING)
                .or_insert(HeaderValue::from_static("no"));
            timed
                .with_guard(SseGuard::new(&self.metrics.sse_streams_active))
                .boxed_unsync()
        } else {
            timed.boxed_unsync()
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.headers_mut() = std::mem::take(&mut head.headers);
        resp
    }

    /// Reads a candidate error body, up to `max_peek_bytes`. A larger body (by Content-Length or
    /// by what arrives) is not matched and passes through intact: the bytes read so far are kept
    /// as a prefix.
    async fn peek(
        &self,
        headers: &http::HeaderMap,
        mut body: Incoming,
    ) -> Result<Peeked, crate::body::BoxError> {
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_peek_bytes as u64) {
            return Ok(Peeked {
                complete: None,
                prefix: None,
                rest: body,
            });
        }
        let mut buf = BytesMut::new();
        let deadline = Instant::now() + self.stream_idle_timeout;
        loop {
            if body.is_end_stream() {
                return Ok(Peeked {
                    complete: Some(buf.freeze()),
                    prefix: None,
                    rest: body,
                });
            }
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(frame) => frame,
                Err(_) => return Err(Box::new(crate::body::IdleTimeout(self.stream_idle_timeout))),
            };
            match frame {
                None => {
                    return Ok(Peeked {
                        complete: Some(buf.freeze()),
                        prefix: None,
                        rest: body,
                    })
                }
                Some(Err(e)) => return Err(Box::new(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                    // Trailers on an error body are dropped: no router sends them.
                    if buf.len() > self.max_peek_bytes {
                        return Ok(Peeked {
                            complete: None,
                            prefix: Some(buf.freeze()),
                            rest: body,
                        });
                    }
                }
            }
        }
    }

    /// The upstream URI for a client request URI: the upstream's authority, its path prefix, then
    /// the client's path and query.
    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, &'static str> {
        let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        if !pq.starts_with('/') {
            // `OPTIONS *` or an absolute-form oddity: nothing to forward to one upstream.
            return Err("the request target must be an absolute path");
        }
        Uri::builder()
            .scheme(self.upstream.scheme())
            .authority(self.upstream.authority.clone())
            .path_and_query(format!("{}{}", self.upstream.path_prefix, pq))
            .build()
            .map_err(|_| "the request target cannot be forwarded")
    }
}

/// The request as it goes upstream (kept for replays).
struct Target {
    method: http::Method,
    uri: Uri,
    headers: http::HeaderMap,
    /// The client-facing path (for expected routes and learning).
    path: String,
}

/// A response head with its (peeked) body.
type Answer = (http::response::Parts, Peeked);

/// A response body after a peek.
struct Peeked {
    /// The complete body when it was read to its end.
    complete: Option<Bytes>,
    /// Bytes read before giving up on a too-large body.
    prefix: Option<Bytes>,
    /// The unread rest.
    rest: Incoming,
}

/// Counts one live SSE stream in `holdfast_sse_streams_active`.
struct SseGuard(Gauge);

impl SseGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        SseGuard(gauge.clone())
    }
}

impl Drop for SseGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The client went away while its request was held: nothing was sent, and nobody reads this.
/// Not a 502 (no upstream failed), not counted as one.
fn client_gone(version: Version) -> (Response<ProxyBody>, Note) {
    (
        respond::bad_request("the client went away while its request was held", version),
        Note {
            upstream_status: None,
            action: "cancelled",
        },
    )
}
