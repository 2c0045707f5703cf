//! The attempt loop: send, classify, act on the verdict, perhaps send again.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HOST;
use http::{Method, Request, Response, StatusCode, Version};
use tokio::time::Instant;

#[cfg(test)]
mod sizes;
mod twice;

use super::answer::{client_gone, Answer};
use super::attempts::Attempts;
use super::body::ProxyBody;
use super::ending::Phase;
use super::in_flight::Flight;
use super::resume::Gone;
use super::sessions::After;
use super::unanswered::{self, First};
use super::{Carried, Note, Proxy, Target};
use crate::classify::{FailReason, Missing, PassReason, RewriteReason, Verdict};
use crate::errors::ErrorChain;
use crate::hold::{Released, RouteOutage, Ticket};
use crate::mcp_method::McpMethod;
use crate::metrics::{Pass, PassLabel, ReasonLabel, RewriteAction};
use crate::replay::BodyHandle;
use crate::session;
use crate::session::forgotten;

/// Bytes of a request body scanned for its MCP method.
const MCP_METHOD_SCAN: usize = 4096;

/// One client request on its way through the attempt loop.
pub(super) struct Exchange {
    /// The request as it goes upstream.
    target: Target,
    /// Its body, kept (capped) for a replay.
    handle: BodyHandle,
    /// Its place in the hold.
    ticket: Ticket,
    /// The tracked session it carries, if any.
    carried: Option<Carried>,
    /// The outage state of its route (a router's answers), looked up only when an outage is
    /// open somewhere: see [`Proxy::route`].
    route: std::sync::OnceLock<Arc<RouteOutage>>,
    /// The outage it waits in, or last met: its route's, or the upstream-wide one.
    outages: Arc<RouteOutage>,
    /// The client's HTTP version (for synthetic answers).
    version: Version,
    /// What happened to its attempts so far: the only place that decides whether it goes again.
    attempts: Attempts,
    /// In flight (for a pause's drain) from its first attempt until its answer's body ends;
    /// not while it waits in the hold.
    flight: Option<Flight>,
    /// Its MCP method, found once ([`Proxy::mcp_method`]).
    mcp: std::sync::OnceLock<McpMethod>,
    /// A peer handed it off at its own shutdown: it is never handed on again.
    handed: bool,
}

/// What the attempt loop does after one attempt.
enum Next {
    /// Answer the client.
    Answer((Response<ProxyBody>, Note)),
    /// Send the request again.
    Again,
}

/// What an attempt's verdict leads to: known at once, or only after more waiting (the answer's
/// first event, a hold, a session brought back), in a future of its own.
enum Step<'a> {
    Now(Next),
    Later(std::pin::Pin<Box<dyn std::future::Future<Output = Next> + Send + 'a>>),
}

impl Proxy {
    /// Takes one request in: the exchange that will forward it, or why it is refused (a 400). Not async: nothing of the request but what the exchange keeps lives on in the
    /// request's future (an async function's arguments stay in its future for as long as it
    /// runs, a held request's included).
    pub(super) fn begin(
        &self,
        req: Request<crate::replay::ClientBody>,
        peer: SocketAddr,
    ) -> Result<Exchange, (Option<&'static str>, http::Version)> {
        let version = req.version();
        let (parts, body) = req.into_parts();
        // A peer's hand-off (proxy/handoff.rs): its own comes back refused (`None`), another's
        // is taken but never handed on.
        let handed = match parts.headers.get(super::handoff::HANDOFF) {
            Some(sender) if sender == self.peers.me() => return Err((None, version)),
            Some(_) => true,
            None => false,
        };
        let mut target = self
            .prepare(parts, peer)
            .map_err(|why| (Some(why), version))?;
        if handed {
            target.headers.remove(super::handoff::HANDOFF);
        }
        Ok(Exchange {
            carried: self.carried(&target),
            route: std::sync::OnceLock::new(),
            outages: self.hold.upstream().clone(),
            target,
            handle: BodyHandle::new(
                body,
                self.bodies.replay_cap,
                self.bodies.copy_budget.clone(),
                self.timeouts.stream_idle,
            ),
            ticket: Ticket::default(),
            version,
            attempts: Attempts::default(),
            flight: None,
            mcp: std::sync::OnceLock::new(),
            handed,
        })
    }

    /// Forwards one request begun by [`Proxy::begin`]: attempts until one is answered, held
    /// through a missing backend and a forgotten session.
    pub(super) async fn forward(&self, ex: &mut Exchange) -> (Response<ProxyBody>, Note) {
        let answer = self.exchange(ex).await;
        if ex.target.method == Method::POST {
            self.metrics.mcp_requests.inc(self.mcp_method(ex));
        }
        // Answered: the request's header map goes back for the next head on this thread.
        crate::http1::maps::recycle(std::mem::take(&mut ex.target.headers));
        answer
    }

    /// The attempt loop of one request: the hold before dispatch while an outage is known,
    /// then attempts until one is answered.
    async fn exchange(&self, ex: &mut Exchange) -> (Response<ProxyBody>, Note) {
        if let Some(answer) = self.hold_before_dispatch(ex).await {
            return answer;
        }
        loop {
            let Some(body) = ex.handle.attempt() else {
                // Only after a hold or a resume: the body turned out unsendable while it
                // waited (it failed, or was superseded). Nothing of it went out again.
                return Box::pin(self.unavailable_now(ex)).await;
            };
            if ex.attempts.sending() {
                self.metrics.replays.inc();
            }
            // Every attempt asks again which upstream session stands for the client's: another
            // request may have re-established it meanwhile.
            if let Some(c) = ex.carried.as_mut() {
                let is_get = ex.target.method == Method::GET;
                c.sent = c.session.apply(&mut ex.target.headers, is_get);
            }
            if ex.flight.is_none() {
                ex.flight = Some(self.in_flight.enter(&ex.target.method));
            }
            let route = self.hold.routes_out().then(|| self.route(ex).as_ref());
            // Boxed: the attempt (the upstream exchange's state) is the largest part of the
            // request's future, and a held request, waiting before it, should not carry it.
            let (verdict, response) = Box::pin(self.attempt(&ex.target, route, body)).await;
            // The verdict is acted on outside this future: only a boxed future of what follows
            // lives across the await, not the answer (a few hundred bytes that every request's
            // future, a held one's included, would otherwise carry).
            let later = match self.act_on(ex, verdict, response) {
                Step::Now(Next::Answer(answer)) => return answer,
                Step::Now(Next::Again) => continue,
                Step::Later(later) => later,
            };
            if let Next::Answer(answer) = later.await {
                return answer;
            }
        }
    }

    /// Holds the request before it is sent while an outage is known: nothing is sent into a
    /// known gap, and the body needs no copy for a replay because it was never sent. The answer,
    /// when the hold ends in one (the client went away, the hold timed out, was full, or holdfast
    /// is shutting down).
    async fn hold_before_dispatch(&self, ex: &mut Exchange) -> Option<(Response<ProxyBody>, Note)> {
        if !ex.outages.is_active() && self.hold.routes_out() {
            ex.outages = self.route(ex).clone();
        }
        if !self.hold.enabled() || !ex.outages.holds_before_dispatch(self.reading.horizon) {
            return None;
        }
        // Cold paths are boxed: the request's future stays small, and hyper moves it.
        match Box::pin(ex.outages.wait(&mut ex.ticket, &ex.handle)).await {
            Released::Go => {
                ex.attempts.held_before_sending();
                None
            }
            Released::NotHeld => None,
            Released::Cancelled => Some(client_gone(ex.version)),
            Released::Shutdown => Some(Box::pin(self.shut_out(ex)).await),
            Released::TimedOut | Released::QueueFull => {
                Some(Box::pin(self.unavailable_now(ex)).await)
            }
        }
    }

    /// What one attempt's verdict leads to: an answer for the client, or another attempt, now
    /// or once what it waits for is done.
    fn act_on<'a>(
        &'a self,
        ex: &'a mut Exchange,
        verdict: Verdict,
        response: Option<Answer>,
    ) -> Step<'a> {
        let version = ex.version;
        // A HEAD's answer has no body, so no body signature could be checked: a router's 404
        // to it looks like the application's. It passes, but proves nothing.
        let proves = verdict == Verdict::Application
            && !response
                .as_ref()
                .is_some_and(|(head, _)| self.unprovable_head(&ex.target, head.status));
        // A probe that met the gap again reports from the hold, once it is queued again.
        if !matches!(verdict, Verdict::Missing(_)) {
            ex.ticket.report_probe(proves);
        }
        match (verdict, response) {
            (Verdict::Application, Some(answer)) => {
                Step::Later(Box::pin(self.application(ex, answer, proves)))
            }
            (Verdict::RouterPassthrough(reason), Some(answer)) => {
                let flight = ex.flight.take();
                Step::Now(Next::Answer(self.router_passed(
                    reason,
                    answer,
                    self.route(ex),
                    flight,
                )))
            }
            // Sent, then broken before any answer: the application may have run it.
            (Verdict::Failed(FailReason::UpstreamReset), None) => {
                Step::Later(Box::pin(self.broke(ex, None)))
            }
            (Verdict::Failed(reason), answer) => {
                // A TLS failure is the upstream answering (with a certificate holdfast does
                // not accept): it is there. Close any outage so held requests get their
                // answer now instead of one at a time as probes. (A reset after sending
                // proves nothing: a port proxy may accept and then reset while the backend
                // is still starting.)
                if reason == FailReason::UpstreamTls {
                    self.answered(ex);
                }
                let status = answer.map(|(head, _)| head.status);
                Step::Now(Next::Answer(self.failed(reason, version, status)))
            }
            // The client broke its body mid-upload; the upstream got an upload cut short.
            (Verdict::ClientBody(fault), _) => {
                Step::Now(Next::Answer(self.client_body_failed(fault, version)))
            }
            // A connection that closed before the upstream read the request: most often a
            // keep-alive race with a healthy server, so once at once on another connection
            // before calling it an outage.
            (Verdict::Missing(missing), _)
                if missing.reason == RewriteReason::ConnectionClosed
                    && ex.attempts.closed_unread(ex.handle.is_replayable()) =>
            {
                ex.handle.supersede();
                Step::Now(Next::Again)
            }
            (Verdict::Missing(missing), _) => {
                let replayable = missing.is_safe_to_replay() || self.held_anyway(ex);
                Step::Later(Box::pin(self.hold_for(missing, replayable, ex)))
            }
            (Verdict::Application | Verdict::RouterPassthrough(_), None) => {
                unreachable!("the classifier passes responses only")
            }
        }
    }

    /// The outage state of the request's route, looked up once, when first needed.
    fn route<'a>(&self, ex: &'a Exchange) -> &'a Arc<RouteOutage> {
        ex.route.get_or_init(|| self.route_of(&ex.target))
    }

    /// The application answered the request: its route's outage, and the upstream-wide one,
    /// are over. (With no outage open anywhere, two atomic loads.)
    fn answered(&self, ex: &Exchange) {
        if self.dest.note_hosts {
            if let Some(host) = ex.target.headers.get(HOST) {
                self.in_flight.note_host(host);
            }
        }
        if self.hold.routes_out() {
            self.route(ex).answered();
        }
        self.hold.upstream().answered();
    }

    /// Whether `status` to a HEAD could be a router's answer that only its (absent) body would
    /// tell apart: some signature matches that status.
    fn unprovable_head(&self, target: &Target, status: StatusCode) -> bool {
        target.method == Method::HEAD && self.reading.signatures.iter().any(|s| s.status == status)
    }

    /// The application answered (`proves`: and the answer shows it is there). Its answer
    /// passes, unless it is the 404 of a session the server forgot: then the session is
    /// re-established and the request goes again.
    ///
    /// Not an async fn: its arguments would be kept twice in its future (once as arguments,
    /// once as the locals they are moved into), and this future is allocated for every
    /// answered request. The block uses the answer where it lies.
    #[allow(clippy::manual_async_fn)]
    fn application<'a>(
        &'a self,
        ex: &'a mut Exchange,
        mut answer: Answer,
        proves: bool,
    ) -> impl std::future::Future<Output = Next> + Send + 'a {
        async move {
            let head = &mut answer.0;
            // Looked up once: the watch for an unanswered stream, a legacy GET stream and the
            // pass all ask it.
            let is_sse = super::headers::is_event_stream(&head.headers);
            if !proves {
                let note = Note {
                    upstream_status: Some(head.status),
                    action: "passed",
                };
                let sse = stream_ends(is_sse, &ex.target.method);
                let resp = self.pass(head, sse, answer.1, None, ex.flight.take());
                return Next::Answer((resp, note));
            }
            // A request's event stream: its first event decides before anything reaches the
            // client (src/proxy/unanswered.rs). Until then the server has not shown it is well.
            let mut watch = None;
            if let Some(id) = unanswered::awaited_id(&ex.target.method, head, is_sse, &ex.handle) {
                let first = unanswered::first_event(&mut answer.1, unanswered::FIRST_EVENT_WAIT);
                match Box::pin(first).await {
                    First::Unanswered => return Box::pin(self.unanswered(ex, head.status)).await,
                    First::Broken(err) => {
                        tracing::debug!(error = %ErrorChain(err.as_ref()), "upstream event stream failed before its first event");
                        return Box::pin(self.broke(ex, Some(head.status))).await;
                    }
                    First::Passes(reader) => watch = reader.map(|r| (r, id)),
                }
            }
            self.answered(ex);
            if forgotten::suspects(head.status) {
                // The server did not run a request it refused for a session it forgot, so it
                // may go again once the session is back.
                let gone = Box::pin(self.session_gone(
                    head.status,
                    &ex.target,
                    ex.carried.as_ref(),
                    &ex.handle,
                    &mut ex.attempts.resumes,
                ))
                .await;
                match gone {
                    Gone::SendAgain => return Next::Again,
                    Gone::Missing(missing) => {
                        let replayable = missing.is_safe_to_replay();
                        return Box::pin(self.hold_for(missing, replayable, ex)).await;
                    }
                    Gone::Pass => {}
                };
            }
            if head.status == StatusCode::NOT_FOUND {
                self.metrics.passthrough_404.inc();
            } else {
                self.reading
                    .routes
                    .learn(ex.target.client.path(), Instant::now);
            }
            let confirm = match self
                .after_answer(&ex.target, ex.carried.as_ref(), head, &ex.handle)
                .await
            {
                After::Pass(confirm) => confirm,
                After::EndNotRecorded => {
                    let note = Note {
                        upstream_status: Some(head.status),
                        action: "session_store",
                    };
                    return Next::Answer((crate::respond::session_end_unrecorded(), note));
                }
            };
            let note = Note {
                upstream_status: Some(head.status),
                action: ex.attempts.path().as_str(),
            };
            let learn = (head.status.is_success() && self.answers_tools_list(ex))
                .then(|| ex.target.headers.get(HOST).cloned());
            let legacy_stream =
                ex.target.method == Method::GET && head.status.is_success() && is_sse;
            let sse = stream_ends(is_sse, &ex.target.method);
            let mut resp = self.pass(head, sse, answer.1, learn, ex.flight.take());
            if let Some((reader, id)) = watch {
                resp = self.watch_unanswered(resp, reader, id);
            }
            if let Some(pending) = confirm {
                resp = resp.map(|body| {
                    http_body_util::BodyExt::boxed_unsync(super::confirm::Confirm::new(
                        body, pending, is_sse,
                    ))
                });
            }
            let resp = match (legacy_stream, &ex.target.client_host) {
                (true, Some(host)) => self.endpoint_rewrite(resp, host, ex.target.client.path()),
                _ => resp,
            };
            Next::Answer((resp, note))
        }
    }

    /// A router answered by itself with something the client must see as it is.
    fn router_passed(
        &self,
        reason: PassReason,
        answer: Answer,
        outages: &RouteOutage,
        flight: Option<Flight>,
    ) -> (Response<ProxyBody>, Note) {
        let (mut head, peek) = answer;
        let label = match reason {
            PassReason::RouteNotExpected => Pass::route_not_expected,
            PassReason::HorizonExceeded => Pass::horizon_exceeded,
        };
        self.metrics
            .router_passthrough
            .get_or_create(&PassLabel { reason: label })
            .inc();
        if reason == PassReason::HorizonExceeded {
            outages.horizon_exceeded(self.reading.horizon, &self.dest.url.original);
        }
        let note = Note {
            upstream_status: Some(head.status),
            action: "router_passed",
        };
        let is_sse = super::headers::is_event_stream(&head.headers);
        let sse = is_sse.then_some(Phase::Over);
        (self.pass(&mut head, sse, peek, None, flight), note)
    }

    /// The 503 for a request that could not be sent (again): the outage's reason, if one is open.
    async fn unavailable_now(&self, ex: &Exchange) -> (Response<ProxyBody>, Note) {
        let reason = ex
            .outages
            .current_reason()
            .unwrap_or(RewriteReason::ConnectError);
        self.unavailable(reason, &ex.outages, &ex.ticket, &ex.handle)
            .await
    }

    /// The one decision about a missing backend: hold the request and send it again once the
    /// backend is back, or answer 503 now.
    /// `replayable`: the request provably never reached the application, or is safe to run
    /// twice.
    async fn hold_for(&self, missing: Missing, replayable: bool, ex: &mut Exchange) -> Next {
        // A failed connection is the upstream's; a router's answer is its route's.
        let outages = if missing.reason.is_connect_failure() {
            self.hold.upstream().clone()
        } else {
            self.route(ex).clone()
        };
        ex.outages = outages.clone();
        outages.missing(missing.reason);
        if !Arc::ptr_eq(&outages, self.hold.upstream()) {
            // A route's outage is news to a pause too: the old instance is gone.
            self.hold.upstream().saw_gone(missing.reason);
        }
        let (ticket, handle) = (&mut ex.ticket, &ex.handle);
        // Stop the failed attempt's body first, if its connection still reads it: whatever
        // comes next (a 503 that reads the rest of the body for its JSON-RPC id, or a hold) is
        // the body's only reader, and the abandoned upstream connection closes now instead of
        // waiting out its idle timer.
        handle.supersede();
        // Replay only what provably never reached the application: a connection that failed
        // before the request was written, or a router that answered by itself. A router's
        // 502/504 may follow a request the backend did read.
        if !self.hold.enabled() || !replayable {
            let answer = self.unavailable(missing.reason, &outages, ticket, handle);
            return Next::Answer(answer.await);
        }
        if !handle.is_replayable() {
            // The body outgrew hold.max_body_bytes while it was sent: no copy.
            outages.body_too_large();
            let answer = self.unavailable(missing.reason, &outages, ticket, handle);
            return Next::Answer(answer.await);
        }
        // Waiting in the hold is not being in flight: a pause's drain does not wait for it.
        ex.flight = None;
        // The upstream's "missing" is kept from the client: counted as intercepted and held.
        self.metrics
            .rewrites
            .get_or_create(&ReasonLabel::new(missing.reason, RewriteAction::held))
            .inc();
        match outages.wait(ticket, handle).await {
            Released::Go | Released::NotHeld => {
                ex.attempts.released();
                Next::Again
            }
            Released::Cancelled => Next::Answer(client_gone(ex.version)),
            Released::Shutdown => Next::Answer(Box::pin(self.shut_out(ex)).await),
            Released::TimedOut | Released::QueueFull => {
                let answer = self.unavailable(missing.reason, &outages, ticket, handle);
                Next::Answer(answer.await)
            }
        }
    }

    /// A held request at holdfast's shutdown: it never reached a server, so a peer takes it
    /// ([`super::handoff`]) unless a peer handed it here; else its 503.
    async fn shut_out(&self, ex: &mut Exchange) -> (Response<ProxyBody>, Note) {
        if !ex.handed {
            let mut headers = ex.target.headers.clone();
            // The peer carries the session from the client's own id, not this upstream's.
            if let Some(c) = &ex.carried {
                headers.insert(session::MCP_SESSION_ID, c.session.client_id().clone());
            }
            let handing = super::handoff::Handing {
                method: &ex.target.method,
                client: &ex.target.client,
                headers,
                handle: &ex.handle,
            };
            if let Some(answer) = self.hand_off(handing).await {
                return answer;
            }
        }
        self.unavailable_now(ex).await
    }

    /// The upstream ended a request's event stream before its first event, without answering:
    /// it is going away (src/proxy/unanswered.rs). The request reached it and may have run, so
    /// it is sent again only if it is safe to run twice: held until the upstream is back (once
    /// more at once with holding off). Otherwise a 502. Either way the upstream's outage opens,
    /// so that what comes next waits instead of going into a server that drops its answers.
    async fn unanswered(&self, ex: &mut Exchange, status: StatusCode) -> Next {
        tracing::warn!(
            reason = FailReason::Unanswered.as_str(),
            "the upstream ended a request's event stream without answering it (shutting down?)"
        );
        let missing = Missing {
            reason: RewriteReason::Unanswered,
            never_reached_app: false,
        };
        if self.hold.enabled() {
            if let Some(kind) = self.safe_to_repeat(ex) {
                self.metrics.safe_retries.get_or_create(&kind.into()).inc();
                return Box::pin(self.hold_for(missing, true, ex)).await;
            }
        }
        self.hold.upstream().missing(missing.reason);
        if self.may_send_again(ex) {
            return Next::Again;
        }
        Next::Answer(self.failed(FailReason::Unanswered, ex.version, Some(status)))
    }

    /// The MCP method a POST carries, for its metric: the 2026-07-28 header when given (one
    /// comparison), else the kept copy of the body, read once the request is over.
    fn mcp_method(&self, ex: &Exchange) -> McpMethod {
        *ex.mcp.get_or_init(|| {
            if let Some(method) = ex.target.headers.get(crate::idempotent::MCP_METHOD) {
                return McpMethod::from_name(method.as_bytes());
            }
            // SDKs write `method` first: its first few KiB tell, and a large body is not
            // joined to find out.
            ex.handle
                .with_body_prefix(MCP_METHOD_SCAN, McpMethod::of_body)
                .unwrap_or(McpMethod::Other)
        })
    }

    /// Whether this request is a `tools/list`, whose answer teaches which tools are safe to
    /// call twice.
    fn answers_tools_list(&self, ex: &Exchange) -> bool {
        if ex.target.method != Method::POST || !self.idempotency.learns() {
            return false;
        }
        // The same top-level `method` the metrics count (the header's, else the body's).
        self.mcp_method(ex) == McpMethod::ToolsList
    }

    /// The tracked session a request names, if any.
    fn carried(&self, target: &Target) -> Option<Carried> {
        if !self.sessions.enabled() {
            return None;
        }
        let id = target.headers.get(session::MCP_SESSION_ID)?;
        match self.sessions.lookup(id) {
            Ok(session) => Some(Carried {
                sent: id.clone(),
                session,
            }),
            Err(session::Miss::Unknown) => None,
            Err(session::Miss::Refused(why)) => {
                // Passed through as an opaque id: the server's own, or one it will answer 404.
                self.count_token_refused(why);
                None
            }
        }
    }
}

/// When an event stream answering `method` ends at holdfast's shutdown: a standalone stream (a
/// GET) as the drain begins, a call's stream (a POST) at the drain's end.
fn stream_ends(is_sse: bool, method: &Method) -> Option<Phase> {
    is_sse.then(|| {
        if method == Method::GET {
            Phase::Draining
        } else {
            Phase::Over
        }
    })
}
