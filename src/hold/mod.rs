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
//! - `machine`: one route's outage state as a plain state machine (events in, effects out),
//!   opened by "missing" and closed by the application's answer; a pause is a phase of it.
//! - here: the route's outage as the proxy sees it: the machine behind a lock, its effects
//!   carried out (wakes, metrics, logs, the prober).
//! - `shared`: what every route shares.
//! - `routes`: the routes, bounded, each with its own outage.
//! - `queue`: waiting in the hold, and every way out of it.
//! - `prober`: probing the upstream during an outage.
//! - `retry_after`: Retry-After from observed outages, and the horizon.
//! - `at_rest`: checking the upstream without traffic (`hold.check_interval_secs`).

use std::collections::VecDeque;
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
mod machine;
mod pause;
mod prober;
mod queue;
mod retry_after;
mod routes;
mod shared;

use machine::{Effect, Ended, Machine, WakeAs};
pub use pause::{PauseStart, PauseStatus};
pub use prober::backoff;
pub use queue::{Released, Ticket};
pub use routes::OutageRoutes;
use shared::SharedHold;

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

/// One route's outage state and the requests held for it: a [`Machine`] behind a lock, whose
/// effects are carried out here (wakes, metrics, logs, the prober). Its settings are every
/// route's, in [`SharedHold`]: a reload changes them for every route at once.
pub struct RouteOutage {
    /// What every route shares.
    shared: Arc<SharedHold>,
    /// The route, for logs (`host endpoint`).
    route: String,
    /// The Host its requests send upstream (for the health check).
    host: Option<http::HeaderValue>,
    metrics: Arc<Metrics>,
    /// The machine's [`Machine::is_open`], for requests to read without the lock (the hot
    /// path); written only by [`RouteOutage::apply`], under the lock.
    in_outage: AtomicBool,
    /// The machine's [`Machine::holds`], likewise.
    active: AtomicBool,
    state: Mutex<Machine<oneshot::Sender<Wake>>>,
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

type Held = Machine<oneshot::Sender<Wake>>;

/// What carrying out an event's effects leaves to its caller.
#[derive(Default)]
struct Applied {
    /// Start the prober (once the lock is dropped).
    start_prober: bool,
    /// The horizon's warning is due.
    horizon_warning: bool,
}

/// Now, as the machine counts time (a paused test clock included).
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

impl RouteOutage {
    /// Starts healthy: the horizon counts from now.
    fn new(shared: Arc<SharedHold>, route: String, host: Option<http::HeaderValue>) -> Self {
        // Routes have a Host; the upstream-wide outage (connection failures) has none, and
        // stays open until the application answers.
        let may_sleep = host.is_some();
        Self {
            metrics: shared.settings().metrics.clone(),
            shared,
            route,
            host,
            in_outage: AtomicBool::new(false),
            active: AtomicBool::new(false),
            state: Mutex::new(Machine::new(may_sleep)),
        }
    }

    /// The settings now (they change on a reload).
    fn settings(&self) -> Arc<Template> {
        self.shared.settings()
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.state.lock().expect("outage lock")
    }

    /// Carries out what an event asked, in order, under the lock (a wake sent after it would
    /// race with the waiter's own deadline), and mirrors the machine into the atomics.
    fn apply(&self, m: &Held, effects: Vec<Effect<oneshot::Sender<Wake>>>) -> Applied {
        let mut applied = Applied::default();
        for effect in effects {
            match effect {
                Effect::OutageStarted { reason, cause } => {
                    self.count_outage_start(reason, cause.as_deref())
                }
                Effect::RouteOutage(true) => {
                    self.shared.route_outages.fetch_add(1, Ordering::AcqRel);
                }
                Effect::RouteOutage(false) => {
                    self.shared.route_outages.fetch_sub(1, Ordering::AcqRel);
                }
                Effect::Counted(awake) => {
                    self.shared.outage_count(awake, &self.metrics.upstream_up);
                    if !awake {
                        tracing::debug!(route = self.route, "nobody waits in the outage: dormant");
                    }
                }
                Effect::Wake {
                    waiters,
                    outcome,
                    wake,
                } => self.wake(waiters, outcome, wake),
                Effect::Ended(ended) => self.ended(ended),
                Effect::PauseEnded {
                    by,
                    lasted,
                    upstream_was_gone,
                    held,
                } => {
                    self.metrics.paused.set(0);
                    tracing::info!(
                        by,
                        paused_ms = lasted.as_millis() as u64,
                        upstream_was_gone,
                        held,
                        "resumed"
                    );
                }
                Effect::GoneWhilePaused(reason) => tracing::info!(
                    reason = reason.as_str(),
                    "paused: the upstream is gone; resuming when a new instance answers"
                ),
                Effect::HorizonWarning => applied.horizon_warning = true,
                Effect::StartProber => applied.start_prober = true,
            }
        }
        self.in_outage.store(m.is_open(), Ordering::Release);
        self.active.store(m.holds(), Ordering::Release);
        applied
    }

    /// Wakes held requests that left the queue, counting each exit.
    fn wake(
        &self,
        waiters: Vec<machine::Waiter<oneshot::Sender<Wake>>>,
        outcome: HoldOutcome,
        wake: WakeAs,
    ) {
        let (count, bytes) = (waiters.len(), waiters.iter().map(|w| w.bytes).sum());
        for waiter in waiters {
            self.record_exit(&waiter, outcome);
            let _ = waiter.wake.send(match wake {
                WakeAs::Release => Wake::Release,
                WakeAs::Shutdown => Wake::Shutdown,
            });
        }
        self.shared.release(count, bytes);
        self.metrics.held_requests.set(self.shared.held());
    }

    /// Counts one exit from the hold, and gives its place back.
    fn record_exit(&self, waiter: &machine::Waiter<oneshot::Sender<Wake>>, outcome: HoldOutcome) {
        self.metrics.holds.get_or_create(&outcome.into()).inc();
        self.metrics
            .hold_duration
            .observe(now().saturating_duration_since(waiter.since).as_secs_f64());
    }

    /// An outage (or a pause that never saw the upstream gone) is over.
    fn ended(&self, ended: Ended) {
        let Ended::Outage {
            duration,
            first_reason,
            counts,
            counted,
        } = ended
        else {
            // A pause that never saw the upstream gone was no outage at all; its own line says
            // how it ended.
            return;
        };
        // A dormant outage was already counted out, and its length (a route nobody asked for
        // in hours) says nothing about how long a restart takes.
        if counted {
            self.shared.outage_count(false, &self.metrics.upstream_up);
            self.metrics.outage_duration.observe(duration.as_secs_f64());
            let mut history = self.shared.history.lock().expect("history lock");
            history.push_back(duration);
            if history.len() > OUTAGE_HISTORY {
                history.pop_front();
            }
        }
        tracing::info!(
            route = self.route,
            duration_ms = duration.as_millis() as u64,
            first_reason = first_reason.as_str(),
            held = counts.held,
            released = counts.released,
            timed_out = counts.timed_out_all(),
            cancelled = counts.cancelled,
            rejected = counts.rejected(),
            answered_503 = counts.answered_503,
            "upstream outage ended"
        );
    }

    /// Whether holding is on.
    pub fn enabled(&self) -> bool {
        self.shared.enabled()
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
        let (reason, started) = self.lock().outage()?;
        Some((reason, now().saturating_duration_since(started)))
    }

    /// The application answered: close any open outage and release every held request.
    pub fn answered(&self) {
        // The hot path (no outage): one atomic load, no lock.
        if !self.in_outage() {
            return;
        }
        let mut m = self.lock();
        let effects = m.answered(now());
        self.apply(&m, effects);
    }

    /// The open outage's (held, released, timed_out) counts, as its closing line will say them.
    #[cfg(test)]
    fn line_counts(&self) -> Option<(u64, u64, u64)> {
        let c = self.lock().counts()?;
        Some((c.held, c.released_so_far(), c.timed_out_all()))
    }

    /// A request met a missing backend: open an outage if none is open.
    pub fn missing(&self, reason: RewriteReason) {
        let mut m = self.lock();
        let effects = m.missing(reason, now(), self.shared.next_id());
        self.apply(&m, effects);
    }

    /// Keeps what a failed connection said, for the log line of the outage it is about to
    /// open; none is kept while an outage is open (its line has been written).
    pub fn note_cause(&self, cause: impl FnOnce() -> String) {
        self.lock().note_cause(cause);
    }

    /// An outage begins: counted, and said.
    fn count_outage_start(&self, reason: RewriteReason, cause: Option<&str>) {
        self.shared.outage_count(true, &self.metrics.upstream_up);
        self.metrics.outages.inc();
        let settings = self.settings();
        let upstream = settings
            .probe_uri
            .authority()
            .map(|a| a.as_str())
            .unwrap_or("");
        // `error` is recorded only when there is one (a router's 404 has none).
        tracing::warn!(
            route = self.route,
            upstream,
            reason = reason.as_str(),
            error = cause,
            "upstream outage started"
        );
    }

    /// A request is being answered 503 because the backend is missing.
    pub fn answering_503(&self) {
        self.lock().answering_503();
    }

    /// The reason of the open outage's latest failure (for requests that never got an attempt).
    pub fn current_reason(&self) -> Option<RewriteReason> {
        self.lock().last_reason()
    }

    /// A request that cannot be held because its body is too large to replay.
    pub fn body_too_large(&self) {
        self.count_refusal(HoldOutcome::body_too_large);
        self.lock().refuse();
    }

    /// Counts a request turned away at the door of the hold.
    fn count_refusal(&self, outcome: HoldOutcome) {
        self.metrics.holds.get_or_create(&outcome.into()).inc();
    }

    /// holdfast is shutting down ([`OutageRoutes::shutdown`] says so to every route): every held request
    /// gets its 503 now, and none is held again, on any route (the flag is shared; it is set
    /// before this route's lock is taken, so a request queuing meanwhile is woken here).
    fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let mut m = self.lock();
        let effects = m.shutdown();
        self.apply(&m, effects);
    }
}

#[cfg(test)]
mod tests;
