//! The proxy as a service: one client request in, its answer out, counted and logged once.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;

use super::Proxy;
use crate::mcp_method::McpMethod;
use crate::proxy::access;
use crate::proxy::body::ProxyBody;
use crate::proxy::{Action, Note, CLIENT_CLOSED_REQUEST, SHUTDOWN_STATUS};
use crate::replay::ClientBody;
use crate::telemetry::trace::{Answered, CutHandle, Incoming, RequestSpan};

/// A request not yet counted and logged. Every request is, exactly once: when its answer is
/// ready ([`Unfinished::finish`]), or, if its client goes away first and its future is dropped,
/// when this is dropped.
struct Unfinished<'a> {
    proxy: &'a Proxy,
    start: Instant,
    method: http::Method,
    /// What the access log needs of the request (only with the log on).
    access: Option<Box<access::Entry>>,
    /// Its spans (only with tracing on), lent to the exchange while it is forwarded.
    span: Option<Box<RequestSpan>>,
    /// The server span's other handle, to end it if the request's future is dropped while the
    /// exchange holds the span.
    cut: Option<CutHandle>,
    done: bool,
}

impl Unfinished<'_> {
    /// Counts and logs the request, answered with `resp`, which goes on (watched to its end for
    /// the access log and the trace). `described`: what the exchange found in the request.
    fn finish(
        &mut self,
        resp: Response<ProxyBody>,
        note: &Note,
        described: Option<Box<access::Described>>,
    ) -> Response<ProxyBody> {
        self.done = true;
        // A client that went away while held got no answer at all: counted as nginx logs it,
        // 499 "client closed request", not as the 400 its closed connection was handed.
        let status = if note.action == Action::Cancelled {
            CLIENT_CLOSED_REQUEST
        } else {
            resp.status().as_u16()
        };
        let took = self.proxy.record(self.start, &self.method, status);
        if let Some(span) = self.span.as_deref_mut() {
            span.answered(&answered(status, note, described.as_deref()));
        }
        let is_sse = crate::proxy::headers::is_event_stream(resp.headers());
        let method = &self.method;
        let tail = (self.access.take())
            .map(|entry| entry.answered(method, status, note, took, described, is_sse));
        crate::proxy::sent::watched(resp, tail, self.span.take(), is_sse, &self.proxy.ending)
    }
}

/// How a request is carried: its exchange (or why it has none), or the era bridge's future.
// The exchange is every request's and lies in the request's future unboxed (boxing it would
// cost an allocation per request); the bridge's rare future is the boxed one.
#[allow(clippy::large_enum_variant)]
enum Begun<B> {
    Exchange(Result<super::Exchange, (Option<&'static str>, http::Version)>),
    Bridged(std::pin::Pin<Box<B>>),
}

/// What the server span is told of a request answered with `status`.
fn answered<'a>(
    status: u16,
    note: &Note,
    described: Option<&'a access::Described>,
) -> Answered<'a> {
    Answered {
        status,
        action: note.action.as_str(),
        mcp_method: described.and_then(|d| d.mcp).map(McpMethod::as_str),
        tool: described.and_then(|d| d.tool.as_deref()),
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Dropped at the drain's end: holdfast cut it, not its client.
            let (status, action) = if self.proxy.ending.is_over() {
                self.proxy.metrics.shutdown_cut.inc();
                (SHUTDOWN_STATUS, Action::Shutdown)
            } else {
                (CLIENT_CLOSED_REQUEST, Action::ClientGone)
            };
            let note = Note {
                upstream_status: None,
                action,
            };
            let took = self.proxy.record(self.start, &self.method, status);
            if let Some(entry) = &self.access {
                entry.unanswered(&self.method, status, &note, took);
            }
            if let Some(cut) = self.cut.take() {
                cut.cut(status, action.as_str());
            }
        }
    }
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
        // Every line logged while it is served names its id (crate::telemetry), at any level.
        let logged_as = id.clone();
        // The client after the trusted proxies in front, for the access log and the trace.
        let client = (self.access_log || self.tracing.is_some())
            .then(|| access::client_addr(peer.ip(), req.headers(), &self.dest.trusted_proxies));
        let mut unfinished = Unfinished {
            proxy: self,
            start: Instant::now(),
            method: req.method().clone(),
            // Only for the access log: the hot path needs no copy of the path.
            access: (self.access_log)
                .then(|| access::Entry::new(id.clone(), req.uri(), client.expect("computed"))),
            span: self.tracing.as_ref().map(|tracing| {
                tracing.serve(&Incoming {
                    method: req.method(),
                    path: req.uri().path(),
                    version: req.version(),
                    client: client.expect("computed"),
                    headers: req.headers(),
                    request_id: &id,
                })
            }),
            cut: None,
            done: false,
        };
        unfinished.cut = unfinished.span.as_ref().map(|span| span.cut_handle());
        // A 2026-07-28 client's request the bridge may translate is read whole first; every
        // other begins its exchange here. The bridged future is boxed: rare, and large; the
        // request's own future keeps a pointer where an exchange would be.
        let route = (self.bridge).route(req.method(), req.headers(), |t| self.open_token(t));
        let mut begun = match route {
            Some(direction) => Begun::Bridged(Box::pin(self.bridged(req, peer, direction))),
            None => Begun::Exchange(self.begin(req, peer)),
        };
        let answer = async move {
            // The exchange is used where it lies (moved into a local it would take room twice).
            let (resp, note) = match &mut begun {
                Begun::Bridged(bridged) => bridged.as_mut().await,
                Begun::Exchange(Ok(ex)) => {
                    ex.trace = unfinished.span.take();
                    let answer = self.forward(ex).await;
                    unfinished.span = ex.trace.take();
                    answer
                }
                Begun::Exchange(Err((Some(why), version))) => (
                    crate::respond::bad_request(why, *version),
                    Note {
                        upstream_status: None,
                        action: Action::BadRequest,
                    },
                ),
                // A hand-off of this holdfast's own: its sender tries the next peer.
                Begun::Exchange(Err((None, _))) => (
                    crate::respond::handoff_to_self(),
                    Note {
                        upstream_status: None,
                        action: Action::HandoffSelf,
                    },
                ),
            };
            let mut resp = resp;
            crate::respond::stamp(&mut resp, self.request_ids.header(), &id);
            let described = match &mut begun {
                Begun::Exchange(Ok(ex)) => ex.described.take(),
                _ => None,
            };
            unfinished.finish(resp, &note, described)
        };
        crate::telemetry::with_request_id(logged_as, answer)
    }

    /// Counts one request: answered with `status`, or (499) given up by its client. Returns how
    /// long it took to its answer's head.
    fn record(&self, start: Instant, method: &http::Method, status: u16) -> Duration {
        let elapsed = start.elapsed();
        self.metrics.requests.inc(method.into(), status);
        self.metrics.request_duration.observe(elapsed.as_secs_f64());
        elapsed
    }
}
