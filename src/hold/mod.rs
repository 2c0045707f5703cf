//! Outages of the upstream, and the requests held through them.
//!
//! An outage opens with the first "backend missing" verdict and closes with the first answer
//! from the application. Outages are kept **per route** (the Host sent upstream, and the
//! configured endpoint the path falls under; [`OutageRoutes`]): behind a router, one request for a route
//! the router does not know (a bogus Host) gets the router's 404 and is held, but nobody else's
//! requests are. While one is open:
//!
//! - new requests wait here *before* being sent (nothing is sent into a known gap, and their
//!   bodies need no buffering for a replay);
//! - requests that met the gap and provably never reached the application wait here too, and are
//!   sent again when released;
//! - one prober probes the upstream, one attempt at a time, with jittered exponential backoff.
//!   A probe is never a request the client did not send: a bare TCP connect where that tells
//!   enough (the outage is a connection failure), then the *oldest held request itself*. When the
//!   application answers any request, the outage closes and every held request is released at
//!   once.
//!
//! Held requests are bounded (count and buffered body bytes, over all routes together) and each waits at most
//! `hold.timeout_secs`; whatever cannot be held gets the 503 + Retry-After at once. Every exit
//! from the hold is counted in `holdfast_holds_total{outcome}`.
//!
//! # Layout
//! - here: one route's outage state, opened by "missing" and closed by the application's
//!   answer, and what every route shares.
//! - `routes`: the routes, bounded, each with its own outage.
//! - `queue`: waiting in the hold, and every way out of it.
//! - `prober`: probing the upstream during an outage.
//! - `retry_after`: Retry-After from observed outages, and the horizon.
//! - `at_rest`: checking the upstream without traffic (`hold.check_interval_secs`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::Uri;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::classify::RewriteReason;
use crate::config::{Hold as HoldConfig, RetryAfter};
use crate::metrics::{HoldOutcome, Metrics};
use crate::replay::BodyHandle;
use crate::upstream::Connector;

mod at_rest;
mod pause;
mod prober;
mod queue;
mod retry_after;
mod routes;
mod shared;

pub use pause::{PauseStart, PauseStatus};
pub use prober::backoff;
pub use queue::{Released, Ticket};
pub use routes::OutageRoutes;
use shared::Shared;

/// How many past outage durations inform an observed Retry-After.
const OUTAGE_HISTORY: usize = 16;

/// Asks the upstream whether the application is there (`hold.probe_path`), instead of sending
/// the oldest held request as the probe. Implemented where requests are sent (the proxy).
pub trait Health: Send + Sync + 'static {
    /// What the health request, sent with `host` (the route's) or the upstream's own Host,
    /// found.
    fn check<'a>(
        &'a self,
        host: Option<&'a http::HeaderValue>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Checked> + Send + 'a>>;
}

/// What one health check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The application answered, below 500: it is there.
    Up,
    /// An answer, but not the application's or not healthy (a 5xx, a router's signature).
    NotUp(http::StatusCode),
    /// No answer: refused, reset, closed, timed out (a port that accepts before anything
    /// serves it).
    NoAnswer,
}

/// What every route's outage is made from.
#[derive(Clone)]
pub struct Template {
    /// `[hold]`.
    pub cfg: HoldConfig,
    /// `retry_after_secs`: the fixed Retry-After, and the observed one's fallback.
    pub retry_after: Duration,
    /// Where the bare TCP probe connects.
    pub probe_uri: Uri,
    /// The bare TCP probe.
    pub connector: Connector,
    /// The health check, with `hold.probe_path`.
    pub health: Option<Arc<dyn Health>>,
    /// What a pause asks to see whether the application is there, without `hold.probe_path`
    /// (a request that runs nothing: `OPTIONS` on the first endpoint).
    pub presence: Option<Arc<dyn Health>>,
    /// Where to count.
    pub metrics: Arc<Metrics>,
}

/// One route's outage state and the requests held for it.
pub struct RouteOutage {
    cfg: HoldConfig,
    /// What every route shares.
    shared: Arc<Shared>,
    /// The route, for logs (`host endpoint`).
    route: String,
    /// The Host its requests send upstream (for the health check).
    host: Option<http::HeaderValue>,
    /// `retry_after_secs`: the fixed Retry-After, and the observed one's fallback.
    retry_after: Duration,
    /// Where the bare TCP probe connects.
    probe_uri: Uri,
    connector: Connector,
    health: Option<Arc<dyn Health>>,
    presence: Option<Arc<dyn Health>>,
    metrics: Arc<Metrics>,
    /// Fast path: requests read this before taking the lock. An outage exists (it may be
    /// dormant).
    in_outage: AtomicBool,
    /// The outage holds requests and counts against `holdfast_upstream_up` (it is not dormant).
    active: AtomicBool,
    /// Whether this route's outage goes dormant once nobody waits in it: a route's, not the
    /// upstream's (a refused connection stays an outage until the application answers).
    may_sleep: bool,
    state: Mutex<State>,
}

struct State {
    outage: Option<Outage>,
    /// Held requests by arrival order: the first is the oldest, the next probe.
    waiters: BTreeMap<u64, Waiter>,
    next_seq: u64,
    /// Outages opened on this route: the open one's [`Outage::id`].
    outages_opened: u64,
    prober_running: bool,
    /// A pause for a planned restart (the upstream-wide outage only).
    paused: Option<pause::Paused>,
    /// Pauses begun, to tell a pause's watcher from the next one's.
    pauses: u64,
    /// What the failure that is about to open an outage said (the OS error, the name that did
    /// not resolve), for the outage's first log line.
    cause: Option<String>,
}

struct Outage {
    /// Which of the route's outages this is (1, 2, ...; 0 for [`Outage::detached`]): a request
    /// is counted in each outage's line once, whatever its number of entries and exits.
    id: u64,
    started: Instant,
    first_reason: RewriteReason,
    last_reason: RewriteReason,
    /// Requests answered 503 during this outage.
    answered_503: u64,
    /// Requests held in this outage (each once).
    held: u64,
    /// Of them, released (a probe that met the gap and was held again is not counted twice).
    released: u64,
    timed_out: u64,
    cancelled: u64,
    rejected: u64,
    /// The horizon's warning was logged for this outage.
    horizon_warned: bool,
    /// Opened by a pause, and nothing has shown the upstream gone yet: not counted as an
    /// outage (`holdfast_upstream_up` stays 1), and it closes without an outage duration.
    paused_only: bool,
}

struct Waiter {
    wake: oneshot::Sender<Wake>,
    bytes: usize,
    since: Instant,
}

/// Why a held request stops waiting.
enum Wake {
    /// The outage is over: send it.
    Release,
    /// Send it as the probe and report whether the application answered.
    Probe(oneshot::Sender<bool>),
    /// holdfast is shutting down: answer 503.
    Shutdown,
}

impl RouteOutage {
    /// Starts healthy: the horizon counts from now.
    fn new(
        template: &Template,
        shared: Arc<Shared>,
        route: String,
        host: Option<http::HeaderValue>,
    ) -> Self {
        let t = template.clone();
        // Routes have a Host; the upstream-wide outage (connection failures) has none.
        let may_sleep = host.is_some();
        Self {
            cfg: t.cfg,
            shared,
            route,
            host,
            retry_after: t.retry_after,
            probe_uri: t.probe_uri,
            connector: t.connector,
            health: t.health,
            presence: t.presence,
            metrics: t.metrics,
            in_outage: AtomicBool::new(false),
            active: AtomicBool::new(false),
            may_sleep,
            state: Mutex::new(State {
                outage: None,
                waiters: BTreeMap::new(),
                next_seq: 0,
                outages_opened: 0,
                prober_running: false,
                paused: None,
                pauses: 0,
                cause: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("outage lock")
    }

    /// Whether holding is on.
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// Largest body kept for a replay.
    pub fn max_body_bytes(&self) -> usize {
        self.cfg.max_body_bytes
    }

    /// Whether an outage is open.
    pub fn in_outage(&self) -> bool {
        self.in_outage.load(Ordering::Acquire)
    }

    /// Whether an outage is open and not dormant: it holds requests.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The open outage's first reason and age, unless none is open (or only a pause that has
    /// not seen the upstream gone).
    pub fn outage_status(&self) -> Option<(RewriteReason, Duration)> {
        if !self.is_active() {
            return None;
        }
        let st = self.lock();
        let o = st.outage.as_ref().filter(|o| !o.paused_only)?;
        Some((o.first_reason, o.started.elapsed()))
    }

    /// The application answered: close any open outage and release every held request.
    pub fn answered(&self) {
        // The hot path (no outage): one atomic load, no lock.
        if !self.in_outage() {
            return;
        }
        let mut st = self.lock();
        if st.outage.is_none() || !self.pause_ends_on_answer(&mut st) {
            return;
        }
        self.close(&mut st);
    }

    /// Closes the open outage and releases every held request, oldest first.
    fn close(&self, st: &mut State) {
        let now = Instant::now();
        self.wake_all(st, HoldOutcome::released, || Wake::Release);
        let Some(outage) = st.outage.take() else {
            return;
        };
        self.in_outage.store(false, Ordering::Release);
        if self.may_sleep {
            self.shared.route_outages.fetch_sub(1, Ordering::AcqRel);
        }
        let duration = now.saturating_duration_since(outage.started);
        // A dormant outage was already counted out, and its length (a route nobody asked for
        // in hours) says nothing about how long a restart takes. A pause that never saw the
        // upstream gone was no outage at all.
        if self.active.swap(false, Ordering::AcqRel) && !outage.paused_only {
            self.shared.outage_count(false, &self.metrics.upstream_up);
            self.metrics.outage_duration.observe(duration.as_secs_f64());
            let mut history = self.shared.history.lock().expect("history lock");
            history.push_back(duration);
            if history.len() > OUTAGE_HISTORY {
                history.pop_front();
            }
        }
        if outage.paused_only {
            // The pause's own line says how it ended.
            return;
        }
        tracing::info!(
            route = self.route,
            duration_ms = duration.as_millis() as u64,
            first_reason = outage.first_reason.as_str(),
            held = outage.held,
            released = outage.released,
            timed_out = outage.timed_out,
            cancelled = outage.cancelled,
            rejected = outage.rejected,
            answered_503 = outage.answered_503,
            "upstream outage ended"
        );
    }

    /// The open outage's (held, released, timed_out) counts, as its closing line will say them.
    #[cfg(test)]
    fn line_counts(&self) -> Option<(u64, u64, u64)> {
        let st = self.lock();
        st.outage
            .as_ref()
            .map(|o| (o.held, o.released, o.timed_out))
    }

    /// A request met a missing backend: open an outage if none is open.
    pub fn missing(&self, reason: RewriteReason) {
        let mut st = self.lock();
        self.open(&mut st, reason).last_reason = reason;
        self.mark_gone(&mut st, reason);
    }

    /// Keeps what a failed connection said, for the log line of the outage it is about to
    /// open; none is kept while an outage is open (its line has been written).
    pub fn note_cause(&self, cause: impl FnOnce() -> String) {
        let mut st = self.lock();
        // A pause's outage has not been said yet either: the gap starts with this failure.
        if st.outage.as_ref().is_none_or(|o| o.paused_only) {
            st.cause = Some(cause());
        }
    }

    fn open<'a>(&self, st: &'a mut State, reason: RewriteReason) -> &'a mut Outage {
        let cause = st.cause.take();
        // A dormant outage wakes up: its route is still missing, and someone asks for it.
        if st.outage.is_some() && !self.active.swap(true, Ordering::AcqRel) {
            self.shared.outage_count(true, &self.metrics.upstream_up);
        }
        if st.outage.is_none() {
            st.outages_opened += 1;
        }
        let id = st.outages_opened;
        st.outage.get_or_insert_with(|| {
            self.in_outage.store(true, Ordering::Release);
            self.active.store(true, Ordering::Release);
            if self.may_sleep {
                self.shared.route_outages.fetch_add(1, Ordering::AcqRel);
            }
            let paused = reason == RewriteReason::Paused;
            if !paused {
                self.count_outage_start(reason, cause.as_deref());
            }
            Outage {
                id,
                paused_only: paused,
                ..Outage::new(reason)
            }
        })
    }

    /// An outage begins: counted, and said.
    fn count_outage_start(&self, reason: RewriteReason, cause: Option<&str>) {
        self.shared.outage_count(true, &self.metrics.upstream_up);
        self.metrics.outages.inc();
        let upstream = self.probe_uri.authority().map(|a| a.as_str()).unwrap_or("");
        // `error` is recorded only when there is one (a router's 404 has none).
        tracing::warn!(
            route = self.route,
            upstream,
            reason = reason.as_str(),
            error = cause,
            "upstream outage started"
        );
    }

    /// The prober stopped because nobody waits in this route's outage any more: it goes dormant.
    /// A route that nobody asks for again (a bogus Host, a router restart longer than the hold)
    /// must not keep `holdfast_upstream_up` at 0, nor keep its slot in the routes; it still
    /// remembers when it began, for the horizon. Only a prober's end puts it to sleep: a 503
    /// answered at once (a router's 502, which is never held) leaves the outage awake, so the
    /// next request is held before it is sent into the gap. (With holding off nothing is ever
    /// held, so a route's outage stays awake until the application answers on it.)
    fn sleep_if_idle(&self, st: &State) {
        if self.may_sleep
            && st.outage.is_some()
            && st.waiters.is_empty()
            && !st.prober_running
            && self.active.swap(false, Ordering::AcqRel)
        {
            self.shared.outage_count(false, &self.metrics.upstream_up);
            tracing::debug!(route = self.route, "nobody waits in the outage: dormant");
        }
    }

    /// A request is being answered 503 because the backend is missing.
    pub fn answering_503(&self) {
        // Counted in the open outage only: if an answer closed it meanwhile, this 503 must not
        // reopen a phantom one.
        if let Some(o) = self.lock().outage.as_mut() {
            o.answered_503 += 1;
        }
    }

    /// The reason of the open outage's latest failure (for requests that never got an attempt).
    pub fn current_reason(&self) -> Option<RewriteReason> {
        self.lock().outage.as_ref().map(|o| o.last_reason)
    }

    /// A request that cannot be held because its body is too large to replay.
    pub fn body_too_large(&self) {
        let mut st = self.lock();
        self.refuse(&mut st, HoldOutcome::body_too_large);
    }

    /// Counts a request that leaves without entering the queue (or re-entering it).
    fn refuse(&self, st: &mut State, outcome: HoldOutcome) {
        self.metrics.holds.get_or_create(&outcome.into()).inc();
        if let Some(o) = st.outage.as_mut() {
            o.count(outcome);
        }
    }

    /// holdfast is shutting down ([`OutageRoutes::shutdown`] says so to every route): every held request
    /// gets its 503 now, and none is held again, on any route (the flag is shared; it is set
    /// before this route's lock is taken, so a request queuing meanwhile is woken here).
    fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let mut st = self.lock();
        self.wake_all(&mut st, HoldOutcome::shutdown, || Wake::Shutdown);
    }
}

impl Outage {
    /// Counts one exit for the outage's closing log line.
    fn count(&mut self, outcome: HoldOutcome) {
        match outcome {
            HoldOutcome::released => self.released += 1,
            HoldOutcome::timed_out => self.timed_out += 1,
            HoldOutcome::cancelled => self.cancelled += 1,
            HoldOutcome::queue_full | HoldOutcome::body_too_large => self.rejected += 1,
            HoldOutcome::shutdown => {}
        }
    }

    /// An outage starting now, all counters at zero.
    fn new(reason: RewriteReason) -> Outage {
        Outage {
            id: 0,
            started: Instant::now(),
            first_reason: reason,
            last_reason: reason,
            answered_503: 0,
            held: 0,
            released: 0,
            timed_out: 0,
            cancelled: 0,
            rejected: 0,
            horizon_warned: false,
            paused_only: false,
        }
    }

    /// Counters for a waiter that leaves after its outage closed (nothing to log them in).
    fn detached() -> Outage {
        Outage::new(RewriteReason::ConnectError)
    }
}

#[cfg(test)]
mod tests;
