//! One route's outage state as a plain state machine: events in, effects out.
//!
//! Nothing here locks, sleeps, spawns, counts a metric or logs: [`RouteOutage`](super::RouteOutage)
//! owns a `Machine` behind its lock, feeds it events (a request met the backend missing, the
//! application answered, a request enters or leaves the hold, a pause begins or ends, the prober
//! steps) with the time they happen at, and carries out the [`Effect`]s it returns (wake these
//! requests, count that, log this, start the prober). The rules of the outage live here alone,
//! and are tested here without a runtime: every request that entered the hold leaves it once, by
//! one exit, and the outage's closing line adds up.
//!
//! ```text
//!            missing / horizon                       answered
//!   Clear ───────────────────────────▶ Outage ─────────────────────▶ Clear
//!     │                                ▲    │  (a route: nobody waits, prober stopped:
//!     │ pause                  missing │    │   dormant, counted out; missing wakes it)
//!     ▼                                │    │
//!   Paused ────────────────────────────┘    │ pause: the outage goes on, and its end ends
//!     │ resume / max_secs (never gone)      │ the pause too; resume ends only the pause
//!     ▼                                     ▼
//!   Clear (everyone released)
//! ```
//!
//! A pause is a phase of its own: until something shows the upstream gone it is no outage
//! (nothing counted, no probe, the old instance's answers end nothing); then it becomes one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::classify::RewriteReason;
use crate::metrics::HoldOutcome;

mod io;
mod pause;

use io::Effects;
pub(super) use io::{Counts, Effect, Ended, Entry, Place, ProbeStep, Waiter, WakeAs};
#[cfg(test)]
use pause::NoPause;
use pause::Pause;

/// One route's outage state: its phase, and the requests held in it.
pub(super) struct Machine<W> {
    /// A route's outage goes dormant once nobody waits in it; the upstream-wide one stays open
    /// until the application answers.
    may_sleep: bool,
    phase: Phase,
    /// Held requests by arrival order: the first is the oldest, the next probe.
    queue: BTreeMap<u64, Waiter<W>>,
    next_seq: u64,
    prober_running: bool,
    /// Pauses begun, to tell a pause's watcher from the next one's.
    pauses: u64,
    /// What the failure about to open an outage said (the OS error, the name that did not
    /// resolve), for the outage's first log line.
    cause: Option<String>,
}

/// Where the route stands.
enum Phase {
    /// Nothing is missing, nothing is paused.
    Clear,
    /// A pause before anything showed the upstream gone: the old instance still answers.
    /// `past_horizon`: a router's 404 for this route passed the horizon meanwhile (new requests
    /// are no longer held for it, and the warning was given).
    Paused {
        held: Episode,
        pause: Pause,
        past_horizon: bool,
    },
    /// The route (or the upstream) is missing.
    Outage {
        held: Episode,
        outage: Outage,
        /// Nobody waits and no prober runs: not counted against `holdfast_upstream_up`, and
        /// new requests are sent, not held (a route only).
        dormant: bool,
        /// A pause that saw the upstream gone: the outage's end ends it too.
        pause: Option<Pause>,
    },
}

struct Episode {
    /// Which stretch this is, unique over every route: a request is counted held in each once,
    /// whatever its number of entries and exits.
    id: u64,
    counts: Counts,
}

struct Outage {
    started: Instant,
    first_reason: RewriteReason,
    last_reason: RewriteReason,
    /// A router answered for the backend with a 5xx in this outage (its 502 while the route
    /// still points at a dead container): a held request sent as the probe could meet it too,
    /// and a 502 may follow a request the backend read, so the probe asks with a request that
    /// runs nothing first.
    router_5xx: bool,
    /// The horizon's warning was given for this outage.
    horizon_warned: bool,
}

impl<W> Machine<W> {
    pub(super) fn new(may_sleep: bool) -> Self {
        Machine {
            may_sleep,
            phase: Phase::Clear,
            queue: BTreeMap::new(),
            next_seq: 0,
            prober_running: false,
            pauses: 0,
            cause: None,
        }
    }

    // ---- what the owner reads --------------------------------------------------------------

    /// An outage or a pause exists (it may be dormant): requests check here first.
    pub(super) fn is_open(&self) -> bool {
        !matches!(self.phase, Phase::Clear)
    }

    /// An outage or pause that holds requests (not dormant).
    pub(super) fn holds(&self) -> bool {
        match &self.phase {
            Phase::Clear => false,
            Phase::Paused { .. } => true,
            Phase::Outage { dormant, .. } => !dormant,
        }
    }

    /// The awake outage's first reason and start (not a pause that has not seen the upstream
    /// gone).
    pub(super) fn outage(&self) -> Option<(RewriteReason, Instant)> {
        match &self.phase {
            Phase::Outage {
                outage,
                dormant: false,
                ..
            } => Some((outage.first_reason, outage.started)),
            _ => None,
        }
    }

    /// The latest failure's reason (`paused` for a pause that has not seen the upstream gone).
    pub(super) fn last_reason(&self) -> Option<RewriteReason> {
        match &self.phase {
            Phase::Clear => None,
            Phase::Paused {
                past_horizon: true, ..
            } => Some(RewriteReason::RouteMissing404),
            Phase::Paused { .. } => Some(RewriteReason::Paused),
            Phase::Outage { outage, .. } => Some(outage.last_reason),
        }
    }

    /// Since when the route is missing (or paused), for the horizon.
    pub(super) fn since(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Clear => None,
            Phase::Paused { pause, .. } => Some(pause.since),
            Phase::Outage { outage, .. } => Some(outage.started),
        }
    }

    pub(super) fn prober_running(&self) -> bool {
        self.prober_running
    }

    #[cfg(test)]
    /// Requests waiting now.
    pub(super) fn waiting(&self) -> usize {
        self.queue.len()
    }

    #[cfg(test)]
    /// The open stretch's counts, as its closing line would say them (the requests still out
    /// counted as released).
    pub(super) fn counts(&self) -> Option<Counts> {
        self.episode().map(|e| e.counts)
    }

    #[cfg(test)]
    fn episode(&self) -> Option<&Episode> {
        match &self.phase {
            Phase::Clear => None,
            Phase::Paused { held, .. } | Phase::Outage { held, .. } => Some(held),
        }
    }

    fn episode_mut(&mut self) -> Option<&mut Episode> {
        match &mut self.phase {
            Phase::Clear => None,
            Phase::Paused { held, .. } | Phase::Outage { held, .. } => Some(held),
        }
    }

    // ---- events ----------------------------------------------------------------------------

    /// Keeps what a failed connection said, for the line of the outage it is about to open:
    /// none is kept once an outage is open (its line has been written).
    pub(super) fn note_cause(&mut self, cause: impl FnOnce() -> String) {
        if !matches!(self.phase, Phase::Outage { .. }) {
            self.cause = Some(cause());
        }
    }

    /// A request met the backend missing (`reason`): an outage opens, a dormant one wakes, a
    /// pause learns the upstream is gone. `id` names the outage if one opens.
    pub(super) fn missing(&mut self, reason: RewriteReason, now: Instant, id: u64) -> Effects<W> {
        let mut fx = Vec::new();
        self.open(reason, now, id, &mut fx);
        fx
    }

    fn open(&mut self, reason: RewriteReason, now: Instant, id: u64, fx: &mut Effects<W>) {
        let router_5xx = reason == RewriteReason::RouterUnavailable;
        let outage = Outage {
            started: now,
            first_reason: reason,
            last_reason: reason,
            router_5xx,
            horizon_warned: false,
        };
        match std::mem::replace(&mut self.phase, Phase::Clear) {
            Phase::Clear => {
                fx.push(Effect::OutageStarted {
                    reason,
                    cause: self.cause.take(),
                });
                if self.may_sleep {
                    fx.push(Effect::RouteOutage(true));
                }
                self.phase = Phase::Outage {
                    held: Episode::new(id),
                    outage,
                    dormant: false,
                    pause: None,
                };
            }
            // The gap between instances begins now, not with the pause: the same held requests,
            // now in an outage.
            Phase::Paused { held, pause, .. } => {
                fx.push(Effect::GoneWhilePaused(reason));
                fx.push(Effect::OutageStarted {
                    reason,
                    cause: self.cause.take(),
                });
                self.phase = Phase::Outage {
                    held,
                    outage,
                    dormant: false,
                    pause: Some(pause),
                };
            }
            Phase::Outage {
                held,
                mut outage,
                dormant,
                pause,
            } => {
                outage.last_reason = reason;
                outage.router_5xx |= router_5xx;
                // A dormant outage wakes up: its route is still missing, and someone asks.
                if dormant {
                    fx.push(Effect::Counted(true));
                }
                self.phase = Phase::Outage {
                    held,
                    outage,
                    dormant: false,
                    pause,
                };
            }
        }
    }

    /// The application answered: an outage closes (and a pause waiting for the new instance
    /// with it), releasing everyone. Before a pause saw the upstream gone, the answer is the
    /// old instance's and ends nothing.
    pub(super) fn answered(&mut self, now: Instant) -> Effects<W> {
        let mut fx = Vec::new();
        if !matches!(self.phase, Phase::Outage { .. }) {
            return fx;
        }
        if let Some(pause) = self.take_pause() {
            fx.push(self.pause_ended(&pause, "a new instance answered", true, now));
        }
        self.close(now, &mut fx);
        fx
    }

    /// Closes whatever is open, releasing every held request, oldest first.
    fn close(&mut self, now: Instant, fx: &mut Effects<W>) {
        let waiters = self.drain(HoldOutcome::released);
        let phase = std::mem::replace(&mut self.phase, Phase::Clear);
        if !waiters.is_empty() {
            fx.push(Effect::Wake {
                waiters,
                outcome: HoldOutcome::released,
                wake: WakeAs::Release,
            });
        }
        match phase {
            Phase::Clear => {}
            Phase::Paused { .. } => {
                if self.may_sleep {
                    fx.push(Effect::RouteOutage(false));
                }
                fx.push(Effect::Ended(Ended::Pause))
            }
            Phase::Outage {
                mut held,
                outage,
                dormant,
                ..
            } => {
                if self.may_sleep {
                    fx.push(Effect::RouteOutage(false));
                }
                // Those still out did not come back: they were released.
                held.counts.released += std::mem::take(&mut held.counts.out);
                fx.push(Effect::Ended(Ended::Outage {
                    duration: now.saturating_duration_since(outage.started),
                    first_reason: outage.first_reason,
                    counts: held.counts,
                    counted: !dormant,
                }));
            }
        }
    }

    /// Empties the queue, counting each request's exit as `outcome` (oldest first).
    fn drain(&mut self, outcome: HoldOutcome) -> Vec<Waiter<W>> {
        let waiters: Vec<_> = std::mem::take(&mut self.queue).into_values().collect();
        if let Some(e) = self.episode_mut() {
            for _ in &waiters {
                e.counts.exit(outcome);
            }
        }
        waiters
    }

    /// A request enters the hold (again: `place` is kept across entries), its body reserving
    /// `bytes`, holding for `timeout` (a pause's requests through the pause first).
    /// `reserve` takes its place in the caps every route shares; `was_probe`: it comes back
    /// from being the probe (it goes to the back of the queue).
    pub(super) fn enter(
        &mut self,
        place: &mut Place,
        wake: W,
        entry: (usize, Instant, Duration),
        was_probe: bool,
        reserve: impl FnOnce() -> bool,
    ) -> (Entry, Effects<W>) {
        let (bytes, now, timeout) = entry;
        let mut fx = Vec::new();
        let pause_until = self.pause().map(|p| p.pause.until);
        let Some(episode) = self.episode_mut() else {
            return (Entry::NotHeld, fx);
        };
        // Back in the stretch it left (a probe that met the gap again): no longer out, whatever
        // this entry ends in.
        let back = place.held_in == episode.id;
        if back {
            debug_assert!(episode.counts.out > 0, "came back without leaving");
            episode.counts.out = episode.counts.out.saturating_sub(1);
        }
        let deadline = *place.deadline.get_or_insert_with(|| {
            let own = now + timeout;
            pause_until.map_or(own, |until| own.max(until + timeout))
        });
        let refused = if deadline <= now {
            Some(HoldOutcome::timed_out)
        } else if !reserve() {
            Some(HoldOutcome::queue_full)
        } else {
            None
        };
        if let Some(outcome) = refused {
            match (back, outcome) {
                (true, _) => episode.counts.exit(outcome),
                (false, HoldOutcome::timed_out) => episode.counts.late += 1,
                (false, _) => episode.counts.refused += 1,
            }
            return (Entry::Refused(outcome), fx);
        }
        if !back {
            episode.counts.held += 1;
            place.held_in = episode.id;
        }
        // A probe that met the gap again goes to the back of the queue (keeping its deadline):
        // if it is the one request the router will never route (a bogus Host), it must not be
        // the only one ever probed while everyone else waits.
        if was_probe {
            place.seq = None;
        }
        let seq = *place.seq.get_or_insert_with(|| {
            self.next_seq += 1;
            self.next_seq
        });
        self.queue.insert(
            seq,
            Waiter {
                wake,
                bytes,
                since: now,
            },
        );
        if !std::mem::replace(&mut self.prober_running, true) {
            fx.push(Effect::StartProber);
        }
        (Entry::Held { seq, deadline }, fx)
    }

    /// A request that cannot be held at all (its body is too large to replay).
    pub(super) fn refuse(&mut self) {
        if let Some(e) = self.episode_mut() {
            e.counts.refused += 1;
        }
    }

    /// A held request stops waiting on its own (`timed_out`, `cancelled`). None when it was
    /// already gone (woken).
    pub(super) fn leave(&mut self, seq: u64, outcome: HoldOutcome) -> Option<Waiter<W>> {
        let waiter = self.queue.remove(&seq)?;
        if let Some(e) = self.episode_mut() {
            e.counts.exit(outcome);
        }
        Some(waiter)
    }

    /// The oldest held request goes out as the probe: out until it comes back or the outage
    /// ends (then it counts as released).
    pub(super) fn take_oldest(&mut self) -> Option<Waiter<W>> {
        let (_, waiter) = self.queue.pop_first()?;
        if let Some(e) = self.episode_mut() {
            e.counts.out += 1;
        }
        Some(waiter)
    }

    /// The prober's next step.
    pub(super) fn probe_step(&mut self, shutting_down: bool) -> (ProbeStep, Effects<W>) {
        let mut fx = Vec::new();
        let step = match &self.phase {
            _ if self.queue.is_empty() || shutting_down => ProbeStep::Stop,
            Phase::Clear => ProbeStep::Stop,
            Phase::Paused { .. } => ProbeStep::Wait,
            Phase::Outage { held, outage, .. } => ProbeStep::Probe {
                reason: outage.last_reason,
                started: outage.started,
                held_in: held.id,
                ask_first: outage.router_5xx,
            },
        };
        if step == ProbeStep::Stop {
            self.prober_running = false;
            // A route nobody waits in any more goes dormant: a route that nobody asks for again
            // (a bogus Host, a router restart longer than the hold) must not keep
            // `holdfast_upstream_up` at 0. Only a prober's end puts it to sleep: a 503 answered
            // at once leaves the outage awake, so the next request is held before it is sent.
            if let Phase::Outage { dormant, .. } = &mut self.phase {
                if self.may_sleep && self.queue.is_empty() && !*dormant {
                    *dormant = true;
                    fx.push(Effect::Counted(false));
                }
            }
        }
        (step, fx)
    }

    /// A request is answered 503 because the backend is missing (counted in the open stretch
    /// only: an answer that closed it meanwhile must not reopen a phantom one).
    pub(super) fn answering_503(&mut self) {
        if let Some(e) = self.episode_mut() {
            e.counts.answered_503 += 1;
        }
    }

    /// A route-missing 404 passed through past the horizon: the outage stays (and is a
    /// route-missing one from now on, so new requests are not held for it), everyone held is
    /// released to get that 404, and the warning is given once.
    /// (A pause that has not seen the upstream gone stays one: a router's 404 past the horizon
    /// shows a wrong route, not the instance gone.)
    pub(super) fn horizon_exceeded(&mut self, now: Instant, id: u64) -> Effects<W> {
        let mut fx = Vec::new();
        let warned = match &mut self.phase {
            Phase::Paused { past_horizon, .. } => std::mem::replace(past_horizon, true),
            _ => {
                self.open(RewriteReason::RouteMissing404, now, id, &mut fx);
                match &mut self.phase {
                    Phase::Outage { outage, .. } => {
                        std::mem::replace(&mut outage.horizon_warned, true)
                    }
                    _ => true,
                }
            }
        };
        if !warned {
            fx.push(Effect::HorizonWarning);
        }
        let waiters = self.drain_out();
        if !waiters.is_empty() {
            fx.push(Effect::Wake {
                waiters,
                outcome: HoldOutcome::released,
                wake: WakeAs::Release,
            });
        }
        fx
    }

    /// Wakes everyone to go out while the outage goes on: out until they come back.
    fn drain_out(&mut self) -> Vec<Waiter<W>> {
        let waiters: Vec<_> = std::mem::take(&mut self.queue).into_values().collect();
        if let Some(e) = self.episode_mut() {
            e.counts.out += waiters.len() as u64;
        }
        waiters
    }

    /// holdfast is shutting down: every held request gets its 503.
    pub(super) fn shutdown(&mut self) -> Effects<W> {
        let waiters = self.drain(HoldOutcome::shutdown);
        if waiters.is_empty() {
            return Vec::new();
        }
        vec![Effect::Wake {
            waiters,
            outcome: HoldOutcome::shutdown,
            wake: WakeAs::Shutdown,
        }]
    }
}

impl Episode {
    fn new(id: u64) -> Self {
        Episode {
            id,
            counts: Counts::default(),
        }
    }
}

#[cfg(test)]
mod tests;
