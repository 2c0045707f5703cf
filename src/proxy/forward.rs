//! The executor of one request's life ([`super::life`]): it tells the machine what happened and
//! carries out the step it returns. This file sends attempts and reads the application's answer;
//! `moves.rs` holds, opens outages, hands off and answers; `twice.rs` judges and counts resends.
//! It owns parts that know nothing of it ([`Upstream`](super::attempt::Upstream),
//! [`Answers`](super::answer::Answers), [`Keeper`](super::sessions::Keeper), the peers, the
//! hold): a step is a call on one of them.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HOST;
use http::{Method, Request, Response, StatusCode, Version};
use tokio::time::Instant;

mod asks;
mod bridged;
mod build;
mod cancel;
mod control;
mod listen;
mod modern;
mod moves;
mod reopen;
mod rounds;
mod service;
#[cfg(test)]
mod sizes;
mod twice;

use super::answer::Answer;
use super::body::ProxyBody;
use super::ending::Phase;
use super::in_flight::Flight;
use super::life::{Event, Exit, Facts, Life, Step};
use super::sessions::After;
use super::told::{Beside, Heard};
use super::unanswered::{self, First};
use super::{
    answer, attempt, ending, handoff, in_flight, sessions, Bodies, Carried, Destination, Note,
    Target, Timeouts,
};
use crate::classify::{FailReason, PassReason, Verdict};
use crate::errors::ErrorChain;
use crate::hold::{OutageRoutes, RouteOutage, Ticket};
use crate::mcp_method::McpMethod;
use crate::metrics::Metrics;
use crate::metrics::{Pass, PassLabel};
use crate::replay::BodyHandle;
use crate::session::forgotten;

/// The forwarding service, shared by every connection.
pub struct Proxy {
    /// Where requests go, and how a client's head becomes the upstream's.
    dest: Destination,
    /// The upstream as an attempt meets it: its client, how its answers are read.
    upstream: attempt::Upstream,
    /// What builds the client's answer.
    answers: answer::Answers,
    timeouts: Timeouts,
    /// Request bodies kept for a replay.
    bodies: Bodies,
    /// Outages, per route (carried over a reload, as everything in an `Arc` here).
    hold: Arc<OutageRoutes>,
    /// MCP sessions carried across backend restarts.
    keeper: sessions::Keeper,
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
    request_ids: super::request_id::RequestIds,
    /// OpenTelemetry traces, when on (`[tracing]`).
    tracing: Option<Arc<crate::telemetry::trace::Tracing>>,
    /// The era bridge (`[bridge]`): its verdict and sessions outlive a reload.
    bridge: Arc<crate::bridge::Bridge>,
    metrics: Arc<Metrics>,
    /// This proxy, once in its `Arc` ([`Proxy::shared`]): what a kept event stream reopens
    /// through.
    this: std::sync::Weak<Proxy>,
}

/// Bytes of a request body scanned for its MCP method.
const MCP_METHOD_SCAN: usize = 4096;

/// One client request on its way through its life.
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
    /// Where its life stands: the only place that decides whether it goes again.
    life: Life,
    /// In flight (for a pause's drain) from its first attempt until its answer's body ends;
    /// not while it waits in the hold.
    flight: Option<Flight>,
    /// Its MCP method, found once ([`Proxy::mcp_method`]).
    mcp: std::sync::OnceLock<McpMethod>,
    /// What the access log and the trace tell of it, found once it is answered (with either
    /// on).
    pub(super) described: Option<Box<super::access::Described>>,
    /// Its spans, with tracing on: given by the service, taken back once it is answered.
    pub(super) trace: Option<Box<crate::telemetry::trace::RequestSpan>>,
    /// It is holdfast's own GET, reopening a kept event stream ([`crate::proxy::kept`]).
    reopens: bool,
}

/// What the executor does after carrying out a step.
enum Next {
    /// Answer the client.
    Answer((Response<ProxyBody>, Note)),
    /// Carry out this step.
    Go(Step),
}

/// What an attempt's verdict leads to: known at once, or only after more waiting (the answer's
/// first event, a session brought back), in a future of its own.
enum Deferred<'a> {
    Now(Next),
    Later(std::pin::Pin<Box<dyn std::future::Future<Output = Next> + Send + 'a>>),
}

/// What the machine asks of the executor: about the request's body, and whether it is safe to
/// run twice.
struct Ask<'a> {
    proxy: &'a Proxy,
    handle: &'a BodyHandle,
    target: &'a Target,
}

impl Facts for Ask<'_> {
    fn replayable(&self) -> bool {
        self.handle.is_replayable()
    }

    fn safe(&mut self) -> Option<crate::idempotent::SafeKind> {
        self.proxy.safe_to_repeat(self.handle, self.target)
    }
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
            .dest
            .prepare(parts, peer)
            .map_err(|why| (Some(why), version))?;
        if handed {
            target.headers.remove(super::handoff::HANDOFF);
        }
        let handle = BodyHandle::new(
            body,
            self.bodies.replay_cap,
            self.bodies.copy_budget.clone(),
            self.timeouts.stream_idle,
        );
        Ok(self.exchange_of(target, handle, version, handed))
    }

    /// Forwards one request begun by [`Proxy::begin`]: attempts until one is answered, held
    /// through a missing backend and a forgotten session.
    pub(super) async fn forward(&self, ex: &mut Exchange) -> (Response<ProxyBody>, Note) {
        let answer = self.exchange(ex).await;
        let mcp = (ex.target.method == Method::POST).then(|| self.mcp_method(ex));
        if let Some(method) = mcp {
            self.metrics.mcp_requests.inc(method);
        }
        let traced = ex.trace.as_ref().is_some_and(|span| span.is_recording());
        if self.access_log || traced {
            let (handle, headers) = (&ex.handle, &ex.target.headers);
            let described = super::access::Described::of(mcp, handle, headers, &self.idempotency);
            ex.described = Some(described);
        }
        // Answered: the request's header map goes back for the next head on this thread.
        crate::http1::maps::recycle(std::mem::take(&mut ex.target.headers));
        answer
    }

    /// One request's life, carried out: each step of the machine until it leaves. Cold steps
    /// are boxed: the request's future stays small, and hyper moves it.
    async fn exchange(&self, ex: &mut Exchange) -> (Response<ProxyBody>, Note) {
        // Nothing is sent into a known gap: with an outage open on its way the request waits
        // before it is sent, and its body needs no copy for a replay.
        if !ex.outages.is_active() && self.hold.routes_out() {
            ex.outages = self.route(ex).clone();
        }
        // A cancellation of a request held here goes no further (forward/cancel.rs).
        if let Some(answer) = self.cancels_held(ex).await {
            return answer;
        }
        let outage_holds = self.hold.enabled()
            && ex
                .outages
                .holds_before_dispatch(self.upstream.reading.horizon);
        let mut step = self.tell(ex, Event::Arrived { outage_holds });
        loop {
            let next = match step {
                Step::Send(send) => {
                    // Taken apart before the await: only the boxed future lives across it, not
                    // an answer's room.
                    let later = match self.send(ex, send).await {
                        Deferred::Now(Next::Answer(answer)) => return answer,
                        Deferred::Now(Next::Go(next)) => {
                            step = next;
                            continue;
                        }
                        Deferred::Later(later) => later,
                    };
                    later.await
                }
                Step::HoldBeforeDispatch => Next::Go(Box::pin(self.wait_held(ex)).await),
                Step::Missing(missing) => Box::pin(self.missing(ex, missing, None)).await,
                Step::HandOff => Box::pin(self.hand_off_held(ex)).await,
                Step::Exit(exit) => Next::Answer(Box::pin(self.leave(ex, exit, None)).await),
                Step::Read => unreachable!("only an attempt's verdict leads to reading an answer"),
            };
            match next {
                Next::Answer(answer) => return answer,
                Next::Go(next) => step = next,
            }
        }
    }

    /// Tells the request's life what happened: its next step.
    fn tell(&self, ex: &mut Exchange, event: Event) -> Step {
        let mut facts = Ask {
            proxy: self,
            handle: &ex.handle,
            target: &ex.target,
        };
        let step = ex.life.on(event, &mut facts);
        if let Some(span) = ex.trace.as_deref() {
            super::traced::record(span, &event, &step);
        }
        step
    }

    /// Sends one attempt and acts on its verdict (or on its body being gone).
    async fn send<'a>(&'a self, ex: &'a mut Exchange, send: super::life::Send) -> Deferred<'a> {
        if send.supersede {
            ex.handle.supersede();
        }
        if let Some(resend) = send.resend {
            self.count_resend(resend);
        }
        // Gone only after a hold or a resume: the body turned out unsendable while it waited (it
        // failed, or was superseded). Nothing of it went out again.
        let Some(body) = ex.handle.attempt() else {
            return Deferred::Now(Next::Go(self.tell(ex, Event::Unsendable)));
        };
        if send.replay {
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
        if let (Some(tracing), Some(span)) = (&self.tracing, ex.trace.as_deref_mut()) {
            let target = &mut ex.target;
            span.attempt(tracing, &target.method, &target.uri, &mut target.headers);
        }
        let route = self.hold.routes_out().then(|| self.route(ex).as_ref());
        // Boxed: the attempt (the upstream exchange's state) is the largest part of the
        // request's future, and a held request, waiting before it, should not carry it.
        let (verdict, response) = Box::pin(self.upstream.attempt(&ex.target, route, body)).await;
        // The verdict is acted on outside this future: only a boxed future of what follows
        // lives across the await, not the answer (a few hundred bytes that every request's
        // future, a held one's included, would otherwise carry).
        self.act_on(ex, verdict, response)
    }

    /// What one attempt's verdict leads to: an answer for the client, or the next step, now or
    /// once the application's answer was read on.
    fn act_on<'a>(
        &'a self,
        ex: &'a mut Exchange,
        verdict: Verdict,
        response: Option<Answer>,
    ) -> Deferred<'a> {
        // A HEAD's answer has no body, so no body signature could be checked: a router's 404
        // to it looks like the application's. It passes, but proves nothing.
        let proves = verdict == Verdict::Application
            && !response
                .as_ref()
                .is_some_and(|(head, _)| self.unprovable_head(&ex.target, head.status));
        if let Some(span) = ex.trace.as_deref_mut() {
            let status = response.as_ref().map(|(head, _)| head.status);
            span.attempt_ended(super::traced::attempt_end(&verdict, status));
        }
        // A probe that met the gap again reports from the hold, once it is queued again.
        if !matches!(verdict, Verdict::Missing(_)) {
            ex.ticket.report_probe(proves);
        }
        let step = self.tell(ex, Event::Verdict { verdict, proves });
        let Some(answer) = response else {
            return Deferred::Now(match step {
                Step::Exit(exit) => Next::Answer(self.leave_now(ex, exit, None)),
                step => Next::Go(step),
            });
        };
        Deferred::Now(Next::Answer(match step {
            Step::Read => return Deferred::Later(Box::pin(self.application(ex, answer))),
            Step::Exit(Exit::Pass) => {
                let (mut head, peek) = answer;
                let note = Note {
                    upstream_status: Some(head.status),
                    action: super::Action::Passed,
                };
                let is_sse = super::headers::is_event_stream(&head.headers);
                let sse = stream_ends(is_sse, &ex.target.method);
                (
                    self.answers
                        .pass(&mut head, sse, peek, None, ex.flight.take()),
                    note,
                )
            }
            Step::Exit(Exit::RouterPassed(reason)) => {
                let flight = ex.flight.take();
                self.router_passed(reason, answer, self.route(ex), flight)
            }
            Step::Exit(exit) => self.leave_now(ex, exit, Some(answer.0.status)),
            step => return Deferred::Now(Next::Go(step)),
        }))
    }

    /// The outage state of the request's route, looked up once, when first needed.
    fn route<'a>(&self, ex: &'a Exchange) -> &'a Arc<RouteOutage> {
        ex.route.get_or_init(|| self.upstream.route_of(&ex.target))
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
        target.method == Method::HEAD
            && self
                .upstream
                .reading
                .signatures
                .iter()
                .any(|s| s.status == status)
    }

    /// The application answered, and its answer shows it is there: read on where its life
    /// asks (an event stream's first event; the session of a 404 or 400), then passed, unless
    /// that reading leads elsewhere (the session re-established and the request sent again).
    ///
    /// Not an async fn: its arguments would be kept twice in its future (once as arguments,
    /// once as the locals they are moved into), and this future is allocated for every
    /// answered request. The block uses the answer where it lies.
    #[allow(clippy::manual_async_fn)]
    fn application<'a>(
        &'a self,
        ex: &'a mut Exchange,
        mut answer: Answer,
    ) -> impl std::future::Future<Output = Next> + Send + 'a {
        async move {
            let head = &mut answer.0;
            // Looked up once: the watch for an unanswered stream, a legacy GET stream and the
            // pass all ask it.
            let is_sse = super::headers::is_event_stream(&head.headers);
            // A request's event stream: its first event decides before anything reaches the
            // client (src/proxy/unanswered.rs). Until then the server has not shown it is well.
            let mut watch = None;
            if let Some(id) = unanswered::awaited_id(&ex.target.method, head, is_sse, &ex.handle) {
                let first = unanswered::first_event(&mut answer.1, unanswered::FIRST_EVENT_WAIT);
                let event;
                (event, watch) = first_says(Box::pin(first).await, id);
                if event != Event::Settled {
                    let step = self.tell(ex, event);
                    return Box::pin(self.after_reading(ex, step, head.status)).await;
                }
            }
            self.answered(ex);
            if forgotten::suspects(head.status) {
                // The server did not run a request it refused for a session it forgot, so it
                // may go again once the session is back.
                let gone = Box::pin(self.keeper.session_gone(
                    &self.upstream,
                    head.status,
                    &ex.target,
                    ex.carried.as_ref(),
                    &ex.handle,
                    &mut ex.life,
                ))
                .await;
                let step = self.tell(ex, Event::Session(gone));
                if step != Step::Exit(Exit::Pass) {
                    return Box::pin(self.after_reading(ex, step, head.status)).await;
                }
            } else {
                let step = self.tell(ex, Event::Settled);
                debug_assert_eq!(step, Step::Exit(Exit::Pass));
            }
            if head.status == StatusCode::NOT_FOUND {
                self.metrics.passthrough_404.inc();
            } else {
                self.upstream
                    .reading
                    .routes
                    .learn(ex.target.client.path(), Instant::now);
            }
            let beside = match self
                .keeper
                .after_answer(&ex.target, ex.carried.as_ref(), head, &ex.handle)
                .await
            {
                After::Pass(Some(confirm)) => Some(Beside::Confirm(confirm)),
                After::Pass(None) if ex.target.method == Method::POST => {
                    super::told::tells(ex.carried.as_ref(), head.status, &ex.handle, || {
                        self.mcp_method(ex)
                    })
                }
                After::Pass(None) => None,
                After::Opened(session) => Some(Beside::Told(Heard::Offer, session)),
                After::EndNotRecorded => {
                    let note = Note {
                        upstream_status: Some(head.status),
                        action: super::Action::SessionStore,
                    };
                    return Next::Answer((crate::respond::session_end_unrecorded(), note));
                }
            };
            let note = Note {
                upstream_status: Some(head.status),
                action: ex.life.path().into(),
            };
            let resp = self.passed(ex, head, answer.1, is_sse, watch, beside);
            Next::Answer((resp, note))
        }
    }

    /// The application's answer as the client gets it: passed (read for tool annotations when
    /// it answers `tools/list`), watched for its request's answer, its state change confirmed
    /// by its body, a legacy stream's endpoint rewritten.
    fn passed(
        &self,
        ex: &mut Exchange,
        head: &mut http::response::Parts,
        rest: super::answer::Peeked,
        is_sse: bool,
        watch: Option<(unanswered::Reader, crate::jsonrpc::Id)>,
        beside: Option<Beside>,
    ) -> Response<ProxyBody> {
        let learn = (head.status.is_success() && self.answers_tools_list(ex))
            .then(|| ex.target.headers.get(HOST).cloned());
        let legacy_stream = ex.target.method == Method::GET && head.status.is_success() && is_sse;
        let sse = stream_ends(is_sse, &ex.target.method);
        let mut resp = self.answers.pass(head, sse, rest, learn, ex.flight.take());
        if let Some((reader, id)) = watch {
            resp = self.answers.watch_unanswered(resp, reader, id);
        }
        if let Some(beside) = beside {
            resp = beside.read(resp, is_sse);
        }
        let resp = match (legacy_stream, &ex.target.client_host) {
            (true, Some(host)) => {
                let path = ex.target.client.path();
                self.dest
                    .endpoint_rewrite(resp, host, path, &self.upstream.reading.routes)
            }
            _ => resp,
        };
        self.keep(ex, resp)
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
            outages.horizon_exceeded(self.upstream.reading.horizon, &self.dest.url.original);
        }
        let note = Note {
            upstream_status: Some(head.status),
            action: super::Action::RouterPassed,
        };
        let is_sse = super::headers::is_event_stream(&head.headers);
        let sse = is_sse.then_some(Phase::Over);
        (self.answers.pass(&mut head, sse, peek, None, flight), note)
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
}

/// What a request's event stream showed before its first event reached the client: the event
/// its life is told, and the stream's reader to watch it on with the request's `id`.
fn first_says(
    first: First,
    id: crate::jsonrpc::Id,
) -> (Event, Option<(unanswered::Reader, crate::jsonrpc::Id)>) {
    match first {
        First::Unanswered => {
            tracing::warn!(
                reason = FailReason::Unanswered.as_str(),
                "the upstream ended a request's event stream without answering it (shutting \
                 down?)"
            );
            (Event::Unanswered, None)
        }
        First::Broken(err) => {
            tracing::debug!(error = %ErrorChain(err.as_ref()), "upstream event stream failed before its first event");
            (Event::StreamBroken, None)
        }
        First::Passes(reader) => (Event::Settled, reader.map(|r| (r, id))),
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
