//! What goes into the machine and what comes out: the requests it holds, the effects of its
//! events, and what it counts.

use std::time::{Duration, Instant};

use crate::classify::RewriteReason;
use crate::metrics::HoldOutcome;

/// A held request: how to wake it, and what it reserved.
#[derive(Debug)]
pub(in crate::hold) struct Waiter<W> {
    pub wake: W,
    pub bytes: usize,
    pub since: Instant,
}

/// How woken requests go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hold) enum WakeAs {
    /// Send it (the outage is over, or its route is past the horizon).
    Release,
    /// holdfast is shutting down: answer 503.
    Shutdown,
}

/// What the owner does after an event, in order.
#[derive(Debug)]
pub(in crate::hold) enum Effect<W> {
    /// An outage begins: count it (`holdfast_outages_total`, one more route against
    /// `holdfast_upstream_up`) and say so, with what the failure said.
    OutageStarted {
        reason: RewriteReason,
        cause: Option<String>,
    },
    /// A route outage, awake or dormant, begins (true) or ends (false): routes are looked up
    /// while any exists.
    RouteOutage(bool),
    /// A dormant outage is met again (true) or an outage goes dormant (false): one more or one
    /// fewer route against `holdfast_upstream_up`.
    Counted(bool),
    /// These held requests leave with `outcome`: wake each, count each exit.
    Wake {
        waiters: Vec<Waiter<W>>,
        outcome: HoldOutcome,
        wake: WakeAs,
    },
    /// The outage (or a pause that never saw the upstream gone) is over.
    Ended(Ended),
    /// A pause ends: `by` ended it.
    PauseEnded {
        by: String,
        lasted: Duration,
        upstream_was_gone: bool,
        held: usize,
    },
    /// Something showed the upstream gone during a pause.
    GoneWhilePaused(RewriteReason),
    /// The route went past the horizon: warn, once per outage.
    HorizonWarning,
    /// Start the prober (none runs).
    StartProber,
}

/// How an outage ended, for its metrics and closing line.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::hold) enum Ended {
    /// An outage: its duration and counts. `counted`: it was awake (a dormant outage was
    /// counted out already, and its length says nothing about restarts).
    Outage {
        duration: Duration,
        first_reason: RewriteReason,
        counts: Counts,
        counted: bool,
    },
    /// A pause that never saw the upstream gone: no outage at all (its own line says how it
    /// ended).
    Pause,
}

/// A request's place in the hold, kept across its entries (the pure part of a `Ticket`).
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::hold) struct Place {
    /// Arrival order, fixed at the first hold so a re-held request stays the oldest.
    pub seq: Option<u64>,
    /// When it must stop waiting.
    pub deadline: Option<Instant>,
    /// The stretch ([`Episode::id`]) that counts it as held.
    pub held_in: u64,
}

/// What entering the hold came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hold) enum Entry {
    /// Nothing is held here: send it.
    NotHeld,
    /// Refused: answer 503 (counted as `outcome`).
    Refused(HoldOutcome),
    /// Queued as `seq` until `deadline`.
    Held { seq: u64, deadline: Instant },
}

/// What the prober does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hold) enum ProbeStep {
    /// Nothing to probe for: the prober stops.
    Stop,
    /// Paused before the upstream went: the instance that would answer is the one about to stop.
    Wait,
    /// Probe the outage `held_in` opened with `reason` at `started`. `ask_first`: a router
    /// answered a 5xx for the backend in it, so no held request goes out as the probe before a
    /// request that runs nothing found the application there.
    Probe {
        reason: RewriteReason,
        started: Instant,
        held_in: u64,
        ask_first: bool,
    },
}

pub(in crate::hold) type Effects<W> = Vec<Effect<W>>;

/// What a stretch of holding (a pause, an outage, or a pause that became one) counts, for its
/// closing line. Every request held in it is in exactly one of `waiting` (the queue), `out`,
/// or an exit count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::hold) struct Counts {
    /// Requests held (each once, however often it re-entered).
    pub held: u64,
    /// Of them, woken while the outage goes on (as the probe, or past the horizon) and not
    /// back: released, unless they come back.
    pub out: u64,
    pub released: u64,
    pub timed_out: u64,
    pub cancelled: u64,
    pub shutdown: u64,
    /// Held requests refused when they came back (the hold full, their deadline passed).
    pub rejected_held: u64,
    /// Requests refused before they were ever held here (the hold full, a body too large).
    pub refused: u64,
    /// Requests refused before they were ever held here because the deadline they carried from
    /// an earlier hold (another route's) had passed: the closing line's `timed_out` counts them.
    pub late: u64,
    /// Requests answered 503 in it.
    pub answered_503: u64,
}

impl Counts {
    /// One held request leaves by `outcome`.
    pub(super) fn exit(&mut self, outcome: HoldOutcome) {
        match outcome {
            HoldOutcome::released => self.released += 1,
            HoldOutcome::timed_out => self.timed_out += 1,
            HoldOutcome::cancelled => self.cancelled += 1,
            HoldOutcome::shutdown => self.shutdown += 1,
            HoldOutcome::queue_full | HoldOutcome::body_too_large => self.rejected_held += 1,
        }
    }

    /// Requests refused, held before or not (the closing line's `rejected`).
    pub(in crate::hold) fn rejected(&self) -> u64 {
        self.rejected_held + self.refused
    }

    /// Timed out as the closing line says it: held requests that timed out, and those that
    /// came with their deadline already passed.
    pub(in crate::hold) fn timed_out_all(&self) -> u64 {
        self.timed_out + self.late
    }

    #[cfg(test)]
    /// Released as the closing line says it: those still out count as released.
    pub(in crate::hold) fn released_so_far(&self) -> u64 {
        self.released + self.out
    }

    /// Held requests that have left (or are out) by every way: with those still waiting, the
    /// number held.
    #[cfg(test)]
    pub(super) fn accounted(&self) -> u64 {
        self.out
            + self.released
            + self.timed_out
            + self.cancelled
            + self.shutdown
            + self.rejected_held
    }
}
