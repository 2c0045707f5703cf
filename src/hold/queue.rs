//! Holding: a request waits here until the outage ends, its deadline passes, its client goes
//! away or holdfast shuts down, and every exit is counted once.

use super::machine::{Entry, Place};
use super::*;

/// A request's place in the hold, kept across its attempts.
#[derive(Default)]
pub struct Ticket {
    /// Its order, deadline and outage, as the machine keeps them.
    pub(super) place: Place,
    /// When the request was first held.
    pub(super) first_held: Option<Instant>,
    /// Set while the request is out as the probe: report the outcome here.
    pub(super) probe: Option<oneshot::Sender<bool>>,
}

impl Ticket {
    /// Reports a probe's outcome, if this request was sent as the probe.
    pub fn report_probe(&mut self, application_answered: bool) {
        if let Some(tx) = self.probe.take() {
            let _ = tx.send(application_answered);
        }
    }

    /// A ticket whose deadline is already set (`at`), as if it had been held before.
    #[cfg(test)]
    pub(super) fn with_deadline(at: Instant) -> Ticket {
        Ticket {
            place: Place {
                deadline: Some(at.into_std()),
                ..Place::default()
            },
            ..Ticket::default()
        }
    }

    /// How long the request has been held in all.
    pub fn waited(&self) -> Duration {
        self.first_held
            .map(|t| Instant::now().saturating_duration_since(t))
            .unwrap_or_default()
    }
}

/// How a wait in the hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Send the request (again).
    Go,
    /// No outage is open: send it, nothing was held.
    NotHeld,
    /// Answer 503: held too long.
    TimedOut,
    /// Answer 503: the hold is full.
    QueueFull,
    /// Answer 503: shutting down.
    Shutdown,
    /// The client went away mid-body: do not send it.
    Cancelled,
}

/// Removes a waiter whose request was dropped while held (its client went away).
struct WaitGuard<'a> {
    outages: &'a RouteOutage,
    seq: u64,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.outages.leave(self.seq, HoldOutcome::cancelled);
        }
    }
}

impl RouteOutage {
    /// Waits in the hold until the outage ends, this request is chosen as the probe, its
    /// deadline passes, or holdfast shuts down. The body is read ahead meanwhile (bounded by the
    /// replay cap), so the client's connection (holdfast's HTTP/1 server, or hyper's HTTP/2)
    /// notices a client that hangs up, and the request is dropped unsent.
    pub async fn wait(self: &Arc<Self>, ticket: &mut Ticket, body: &BodyHandle) -> Released {
        let (rx, seq, deadline) = match self.enter(ticket, body) {
            Ok(held) => held,
            Err(released) => return released,
        };
        // Removes the waiter if this future is dropped (the client went away) before a wake.
        let mut guard = WaitGuard {
            outages: self,
            seq,
            armed: true,
        };
        // Completes only if the client's body fails (the client went away mid-body): the
        // connection keeps this future alive after a body error, so the hold must notice by
        // itself.
        let client_gone = async {
            body.prefetch().await;
            if !body.has_failed() {
                std::future::pending::<()>().await
            }
        };
        let mut rx = rx;
        let wake = tokio::select! {
            wake = &mut rx => wake.ok(),
            () = tokio::time::sleep_until(Instant::from_std(deadline)) => {
                if self.leave(seq, HoldOutcome::timed_out) {
                    None
                } else {
                    // Woken in the same instant: the wake wins (it was counted as such).
                    rx.try_recv().ok()
                }
            }
            () = client_gone => {
                guard.armed = false;
                if !self.leave(seq, HoldOutcome::cancelled) {
                    // Woken in the same instant; a probe report is dropped with the wake
                    // ("no answer"), and the truncated request is not sent.
                    drop(rx.try_recv());
                }
                return Released::Cancelled;
            }
        };
        guard.armed = false;
        match wake {
            Some(Wake::Release) => Released::Go,
            Some(Wake::Probe(report)) => {
                ticket.probe = Some(report);
                Released::Go
            }
            Some(Wake::Shutdown) => Released::Shutdown,
            None => Released::TimedOut,
        }
    }

    /// Takes the request's place in the queue, or says why it is not held.
    fn enter(
        self: &Arc<Self>,
        ticket: &mut Ticket,
        body: &BodyHandle,
    ) -> Result<(oneshot::Receiver<Wake>, u64, std::time::Instant), Released> {
        let mut m = self.lock();
        if self.shared.shutting_down.load(Ordering::Acquire) {
            self.count_refusal(HoldOutcome::shutdown);
            return Err(Released::Shutdown);
        }
        // Reserve what the body may grow to while read ahead, not only what is read now.
        let settings = self.settings();
        let bytes = body.expected_bytes(settings.cfg.max_body_bytes);
        let at = Instant::now();
        let (tx, rx) = oneshot::channel();
        let (shared, cfg) = (&self.shared, &settings.cfg);
        // The caps are over every route together.
        let (entry, effects) = m.enter(
            &mut ticket.place,
            tx,
            (bytes, at.into_std(), cfg.timeout),
            ticket.probe.is_some(),
            || shared.reserve(bytes, cfg),
        );
        let applied = self.apply(&m, effects);
        let (seq, deadline) = match entry {
            Entry::NotHeld => return Err(Released::NotHeld),
            Entry::Refused(outcome) => {
                ticket.first_held.get_or_insert(at);
                self.count_refusal(outcome);
                return Err(match outcome {
                    HoldOutcome::timed_out => Released::TimedOut,
                    _ => Released::QueueFull,
                });
            }
            Entry::Held { seq, deadline } => (seq, deadline),
        };
        ticket.first_held.get_or_insert(at);
        self.metrics.held_requests.set(self.shared.held());
        // A probe that met the gap again reports only now, once it is back in the queue: the
        // prober must not find the queue empty in between and stop.
        ticket.report_probe(false);
        drop(m);
        if applied.start_prober {
            tokio::spawn(self.clone().probe_loop());
        }
        Ok((rx, seq, deadline))
    }

    /// Removes a waiter that stopped waiting on its own, counting `outcome`. False when it was
    /// already gone (woken).
    pub(super) fn leave(&self, seq: u64, outcome: HoldOutcome) -> bool {
        // The place is given back under the lock, as every other exit gives it back: a request
        // of this route taking the lock next finds it free, and the gauge follows in order.
        let mut m = self.lock();
        let Some(waiter) = m.leave(seq, outcome) else {
            return false;
        };
        self.record_exit(&waiter, outcome);
        self.shared.release(1, waiter.bytes);
        self.metrics.held_requests.set(self.shared.held());
        true
    }
}
