//! Probing during an outage: one probe at a time, with jittered exponential backoff; a TCP
//! connect where that tells enough, then the oldest held request itself, or (with
//! `hold.probe_path`, or after a router's 5xx) a request that runs nothing instead.

use super::machine::ProbeStep;
use super::*;

/// Longest wait for a probe's verdict before the next held request is sent as the next probe.
pub(super) const PROBE_VERDICT_WAIT: Duration = Duration::from_secs(1);

/// Health answers that do not pass before the health path stops deciding alone (a few seconds
/// at the backoff's cap: longer than a restart's "port open, application starting").
pub(super) const HEALTH_ANSWERS_TRUSTED: u32 = 20;

/// Longest an outage opened by an event stream ended unanswered waits for its upstream to
/// refuse a connection (to show the instance shutting down is gone) before a held request goes
/// out as a probe. A graceful shutdown closes its listener within milliseconds (uvicorn: 0.1 s);
/// a server that ends a stream unanswered without going away costs the held requests this.
pub(super) const UNANSWERED_GRACE: Duration = Duration::from_secs(1);

/// The delay before probe `attempt` (0-based): `initial · 2^attempt`, capped at `max`, then
/// "equal jitter": uniformly within [d/2, d], so probes from many holdfasts spread out.
/// `jitter` is uniform in [0, 1).
pub fn backoff(initial: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let factor = 2u32.saturating_pow(attempt.min(20));
    let full = initial.saturating_mul(factor).min(max);
    full / 2 + full.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
}

impl RouteOutage {
    /// Probes until the outage closes or nobody is held. One probe at a time.
    pub(super) async fn probe_loop(self: Arc<Self>) {
        let mut attempt = 0u32;
        // Health answers that did not pass, in this prober's run.
        let mut not_up = 0u32;
        // The outage in which a connect was refused: the instance that was there is gone.
        let mut refused_in: Option<u64> = None;
        loop {
            // Read each time: a reload may change them during an outage.
            let settings = self.settings();
            tokio::time::sleep(backoff(
                settings.cfg.backoff_initial,
                settings.cfg.backoff_max,
                attempt,
                fastrand::f64(),
            ))
            .await;
            attempt = attempt.saturating_add(1);
            let (reason, started, outage, ask_first) = {
                let mut m = self.lock();
                let (step, effects) =
                    m.probe_step(self.shared.shutting_down.load(Ordering::Acquire));
                self.apply(&m, effects);
                match step {
                    ProbeStep::Stop => return,
                    // Paused before the upstream went: the instance that would answer is the
                    // one about to stop. Nothing is sent until it is gone (the pause watches
                    // for that).
                    ProbeStep::Wait => continue,
                    ProbeStep::Probe {
                        reason,
                        started,
                        held_in,
                        ask_first,
                    } => (reason, Instant::from_std(started), held_in, ask_first),
                }
            };
            // Where the failure was a connection failure, a bare connect tells whether anything
            // listens again, without spending a client's request on it.
            if reason.is_connect_failure()
                && !self
                    .connects(reason, started, outage, &mut refused_in)
                    .await
            {
                continue;
            }
            // With hold.probe_path the health check decides, and no held request goes out before
            // the application has answered it: a port that accepts before anything serves it
            // (docker-proxy) must not cost a held request. Without it, once a router answered a
            // 5xx for the backend (a 502 while its route still points at a dead container), a
            // held call sent as the probe would meet that 502 and, not safe to send again, get
            // a 503: a request that runs nothing (`OPTIONS` on the endpoint, a pause's presence
            // check) asks instead. But a check that answers without ever passing (a 503 for a
            // degraded dependency, a wrong path behind a router) must not hold everyone
            // forever: after HEALTH_ANSWERS_TRUSTED such answers the held requests probe again.
            let check = match (&settings.health, &settings.presence) {
                (Some(health), _) => Some(health),
                (None, Some(presence)) if ask_first => Some(presence),
                _ => None,
            };
            if let Some(check) = check {
                if not_up < HEALTH_ANSWERS_TRUSTED {
                    self.check_health(check.as_ref(), &mut not_up).await;
                    continue;
                }
            }
            // Send the oldest held request: only a real request can show that the application
            // (not just a router or a listening socket) answers.
            let (report, outcome) = oneshot::channel();
            if !self.release_oldest_as_probe(report) {
                continue;
            }
            // Wait for its verdict (the response head) before probing again, but not for long: a
            // JSON tool call sends its head only when the tool is done, and a slow tool must not
            // keep everyone else held. After PROBE_VERDICT_WAIT the next oldest goes out as the
            // next probe. A dropped report (the client went away mid-probe) is "no answer".
            let _ = tokio::time::timeout(PROBE_VERDICT_WAIT, outcome).await;
        }
    }

    /// The bare connect of an outage of connection failures: whether a held request may go
    /// out as the probe now. `refused_in` remembers the outage in which a connect was refused.
    async fn connects(
        &self,
        reason: RewriteReason,
        started: Instant,
        outage: u64,
        refused_in: &mut Option<u64>,
    ) -> bool {
        use tower_service::Service;
        let settings = self.settings();
        if settings
            .connector
            .clone()
            .call(settings.probe_uri.clone())
            .await
            .is_err()
        {
            *refused_in = Some(outage);
            return false;
        }
        // A stream ended unanswered: the server is shutting down, and in its first moments it
        // still accepts (and drops what it is sent). A held request goes out once a connection
        // was refused (the old instance is gone), or when it was not going away after all.
        !(reason == RewriteReason::Unanswered
            && *refused_in != Some(outage)
            && started.elapsed() < UNANSWERED_GRACE)
    }

    /// One health check of `hold.probe_path`: a pass ends the outage; `not_up` counts the
    /// answers that did not pass, and the last one it trusts is said.
    async fn check_health(&self, health: &dyn Health, not_up: &mut u32) {
        match health.check(self.host.as_ref()).await {
            Checked::Up => {
                tracing::debug!(route = self.route, "the health check passed");
                self.answered();
            }
            Checked::NotUp(status) => {
                *not_up += 1;
                if *not_up == HEALTH_ANSWERS_TRUSTED {
                    tracing::warn!(
                        route = self.route,
                        status = status.as_u16(),
                        answers = *not_up,
                        "the health check (hold.probe_path, or OPTIONS on the endpoint after a \
                         router's 5xx) keeps answering without passing; held requests probe \
                         the upstream instead. Check the path (it is sent as is, without the \
                         upstream URL's path prefix)"
                    );
                }
            }
            Checked::NoAnswer => {}
        }
    }

    /// Wakes the oldest held request as the probe. False when there is none.
    pub(super) fn release_oldest_as_probe(&self, mut report: oneshot::Sender<bool>) -> bool {
        let mut m = self.lock();
        loop {
            let Some(waiter) = m.take_oldest() else {
                return false;
            };
            self.record_exit(&waiter, HoldOutcome::released);
            self.shared.release(1, waiter.bytes);
            self.metrics.held_requests.set(self.shared.held());
            match waiter.wake.send(Wake::Probe(report)) {
                Ok(()) => return true,
                // Its client went away between wake and pop: try the next one.
                Err(Wake::Probe(r)) => report = r,
                Err(_) => unreachable!("sent a probe wake"),
            }
        }
    }
}
