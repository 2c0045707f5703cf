//! Holding: a request waits here until the outage ends, its deadline passes, its client goes
//! away or holdfast shuts down, and every exit is counted once.

use super::*;

/// A request's place in the hold, kept across its attempts.
#[derive(Default)]
pub struct Ticket {
    /// Arrival order, fixed at the first hold so a re-held request stays the oldest.
    pub(super) seq: Option<u64>,
    /// When the request was first held.
    pub(super) first_held: Option<Instant>,
    /// When it must stop waiting.
    pub(super) deadline: Option<Instant>,
    /// Set while the request is out as the probe: report the outcome here.
    pub(super) probe: Option<oneshot::Sender<bool>>,
    /// The outage ([`Outage::id`]) whose closing line counts this request as held.
    pub(super) held_in: u64,
}

impl Ticket {
    /// Reports a probe's outcome, if this request was sent as the probe.
    pub fn report_probe(&mut self, application_answered: bool) {
        if let Some(tx) = self.probe.take() {
            let _ = tx.send(application_answered);
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
        let (rx, seq, deadline) = {
            let mut st = self.lock();
            if self.shared.shutting_down.load(Ordering::Acquire) {
                self.refuse(&mut st, HoldOutcome::shutdown);
                return Released::Shutdown;
            }
            let Some(outage) = st.outage.as_mut() else {
                return Released::NotHeld;
            };
            // Back in the outage it was released from (a probe that met the gap again): that
            // release was not how it left, whatever this entry ends in.
            if ticket.held_in == outage.id {
                outage.released = outage.released.saturating_sub(1);
            }
            // Reserve what the body may grow to while read ahead, not only what is read now.
            let bytes = body.expected_bytes(self.cfg.max_body_bytes);
            let now = Instant::now();
            // Held by a pause: through the pause (which ends by itself at `until`), then as any
            // held request, so what a planned restart holds goes to the new instance rather
            // than getting its 503 while the old one drains.
            let deadline = *ticket.deadline.get_or_insert_with(|| {
                let own = now + self.cfg.timeout;
                st.paused
                    .as_ref()
                    .map_or(own, |p| own.max(p.until + self.cfg.timeout))
            });
            ticket.first_held.get_or_insert(now);
            if deadline <= now {
                self.refuse(&mut st, HoldOutcome::timed_out);
                return Released::TimedOut;
            }
            // The caps are over every route together.
            if !self.shared.reserve(bytes, &self.cfg) {
                self.refuse(&mut st, HoldOutcome::queue_full);
                return Released::QueueFull;
            }
            // A probe that met the gap again goes to the back of the queue (keeping its
            // deadline): if it is the one request the router will never route (a bogus Host, a
            // path the application lacks), it must not be the only one ever probed while
            // everyone else waits.
            if ticket.probe.is_some() {
                ticket.seq = None;
            }
            let seq = *ticket.seq.get_or_insert_with(|| {
                st.next_seq += 1;
                st.next_seq
            });
            if let Some(o) = st.outage.as_mut().filter(|o| ticket.held_in != o.id) {
                o.held += 1;
                ticket.held_in = o.id;
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.insert(
                seq,
                Waiter {
                    wake: tx,
                    bytes,
                    since: now,
                },
            );
            self.metrics.held_requests.set(self.shared.held());
            // A probe that met the gap again reports only now, once it is back in the queue:
            // the prober must not find the queue empty in between and stop.
            ticket.report_probe(false);
            if !st.prober_running {
                st.prober_running = true;
                tokio::spawn(self.clone().probe_loop());
            }
            (rx, seq, deadline)
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
            () = tokio::time::sleep_until(deadline) => {
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

    /// Removes a waiter that stopped waiting on its own, counting `outcome`. False when it was
    /// already gone (woken).
    pub(super) fn leave(&self, seq: u64, outcome: HoldOutcome) -> bool {
        let mut st = self.lock();
        self.remove_waiter(&mut st, seq, outcome).is_some()
    }

    /// Takes a waiter out of the queue, counting how it left.
    pub(super) fn remove_waiter(
        &self,
        st: &mut State,
        seq: u64,
        outcome: HoldOutcome,
    ) -> Option<Waiter> {
        let waiter = st.waiters.remove(&seq)?;
        self.shared.release(1, waiter.bytes);
        self.metrics.held_requests.set(self.shared.held());
        // A waiter may leave after its outage closed: count it, with nothing to log it in.
        let mut detached = Outage::detached();
        let outage = st.outage.as_mut().unwrap_or(&mut detached);
        self.record_exit(outage, &waiter, outcome);
        Some(waiter)
    }

    /// Counts one exit from the hold.
    pub(super) fn record_exit(&self, outage: &mut Outage, waiter: &Waiter, outcome: HoldOutcome) {
        self.metrics.holds.get_or_create(&outcome.into()).inc();
        self.metrics.hold_duration.observe(
            Instant::now()
                .saturating_duration_since(waiter.since)
                .as_secs_f64(),
        );
        outage.count(outcome);
    }

    /// Wakes every held request with `wake`, counting `outcome` for each; the queue is empty
    /// afterwards.
    pub(super) fn wake_all(&self, st: &mut State, outcome: HoldOutcome, wake: fn() -> Wake) {
        let mut detached = Outage::detached();
        let (mut count, mut bytes) = (0, 0);
        for (_, waiter) in std::mem::take(&mut st.waiters) {
            let outage = st.outage.as_mut().unwrap_or(&mut detached);
            self.record_exit(outage, &waiter, outcome);
            count += 1;
            bytes += waiter.bytes;
            let _ = waiter.wake.send(wake());
        }
        self.shared.release(count, bytes);
        self.metrics.held_requests.set(self.shared.held());
    }
}
