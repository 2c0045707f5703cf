//! The steps of a request's life other than an attempt: the hold, an outage opened, a hand-off,
//! and the answers holdfast gives by itself (503, 502, 400).

use std::sync::Arc;

use http::{Response, StatusCode};

use super::{Exchange, Next};
use crate::classify::RewriteReason;
use crate::metrics::{ReasonLabel, RewriteAction};
use crate::proxy::answer::client_gone;
use crate::proxy::body::ProxyBody;
use crate::proxy::life::{AfterMissing, Event, Exit, MissingStep, Step};
use crate::proxy::{Note, Proxy};
use crate::session;

impl Proxy {
    /// Carries out a step the application's answer led to (`status`: its status, for a 502).
    pub(super) async fn after_reading(
        &self,
        ex: &mut Exchange,
        step: Step,
        status: StatusCode,
    ) -> Next {
        match step {
            Step::Exit(exit) => Next::Answer(self.leave(ex, exit, Some(status)).await),
            Step::Missing(missing) => Box::pin(self.missing(ex, missing, Some(status))).await,
            step => Next::Go(step),
        }
    }

    /// The backend is missing ([`Step::Missing`]): the outage opens (the upstream's for a failed
    /// connection, else the route's), the failed attempt's body stops, then the request is held,
    /// sent once more, or answered. In this order: whatever comes next (a 503 that reads the rest
    /// of the body for its JSON-RPC id, or a hold) is the body's only reader, and the abandoned
    /// upstream connection closes now instead of waiting out its idle timer.
    pub(super) async fn missing(
        &self,
        ex: &mut Exchange,
        missing: MissingStep,
        status: Option<StatusCode>,
    ) -> Next {
        let reason = missing.reason;
        let outages = if reason.is_connect_failure() {
            self.hold.upstream().clone()
        } else {
            self.route(ex).clone()
        };
        outages.missing(reason);
        if !Arc::ptr_eq(&outages, self.hold.upstream()) {
            // A route's outage is news to a pause too: the old instance is gone.
            self.hold.upstream().saw_gone(reason);
        }
        ex.outages = outages;
        ex.handle.supersede();
        if let Some(resend) = missing.resend {
            self.count_resend(resend);
        }
        match missing.then {
            AfterMissing::Hold => {
                // Waiting in the hold is not being in flight: a pause's drain does not wait.
                ex.flight = None;
                // The upstream's "missing" is kept from the client: counted as held.
                self.metrics
                    .rewrites
                    .get_or_create(&ReasonLabel::new(reason, RewriteAction::held))
                    .inc();
                Next::Go(self.wait_held(ex).await)
            }
            AfterMissing::Send(send) => Next::Go(Step::Send(send)),
            AfterMissing::Exit(exit) => Next::Answer(self.leave(ex, exit, status).await),
        }
    }

    /// Waits in the hold of `ex.outages`; the step its release leads to.
    pub(super) async fn wait_held(&self, ex: &mut Exchange) -> Step {
        // Its client may give up on it meanwhile and say so: it then leaves the hold unsent.
        let released = match self.cancellable(ex).await {
            None => ex.outages.wait(&mut ex.ticket, &ex.handle).await,
            Some(mut registration) => tokio::select! {
                released = ex.outages.wait(&mut ex.ticket, &ex.handle) => released,
                () = registration.cancelled() => crate::hold::Released::Cancelled,
            },
        };
        self.tell(ex, Event::Released(released))
    }

    /// A held request at holdfast's shutdown: it never reached a server, so a peer takes it
    /// ([`crate::proxy::handoff`]); the step that follows when none does.
    pub(super) async fn hand_off_held(&self, ex: &mut Exchange) -> Next {
        let mut headers = ex.target.headers.clone();
        // The peer carries the session from the client's own id, not this upstream's.
        if let Some(c) = &ex.carried {
            headers.insert(session::MCP_SESSION_ID, c.session.client_id().clone());
        }
        let handing = crate::proxy::handoff::Handing {
            method: &ex.target.method,
            client: &ex.target.client,
            headers,
            handle: &ex.handle,
        };
        let answer = self
            .peers
            .hand_off(handing, self.timeouts.stream_idle)
            .await;
        match (
            self.tell(
                ex,
                Event::HandedOff {
                    taken: answer.is_some(),
                },
            ),
            answer,
        ) {
            (Step::Exit(Exit::HandedOff), Some(answer)) => Next::Answer(answer),
            (step, _) => Next::Go(step),
        }
    }

    /// Holdfast's own answer for `exit` (`status`: the upstream's, for a 502's log).
    pub(super) async fn leave(
        &self,
        ex: &mut Exchange,
        exit: Exit,
        status: Option<StatusCode>,
    ) -> (Response<ProxyBody>, Note) {
        let Exit::Unavailable { reason, too_large } = exit else {
            return self.leave_now(ex, exit, status);
        };
        let outages = &ex.outages;
        if too_large {
            outages.body_too_large();
        }
        // A request that could not be sent (again) gets the reason of the outage it met.
        let reason = reason
            .or_else(|| outages.current_reason())
            .unwrap_or(RewriteReason::ConnectError);
        self.answers
            .unavailable(reason, outages, &ex.ticket, &ex.handle)
            .await
    }

    /// The answers for `exit` that need no wait.
    pub(super) fn leave_now(
        &self,
        ex: &Exchange,
        exit: Exit,
        status: Option<StatusCode>,
    ) -> (Response<ProxyBody>, Note) {
        match exit {
            Exit::Failed {
                reason,
                upstream_there,
            } => {
                if upstream_there {
                    // The upstream answered (with a certificate holdfast does not accept): close
                    // any outage so held requests get their answer now instead of one at a
                    // time as probes.
                    self.answered(ex);
                }
                self.answers.failed(reason, ex.version, status)
            }
            Exit::ClientBody(fault) => self.answers.client_body_failed(fault, ex.version),
            Exit::ClientGone => client_gone(ex.version),
            Exit::Pass | Exit::RouterPassed(_) | Exit::HandedOff | Exit::Unavailable { .. } => {
                unreachable!("{exit:?} is answered where its answer is")
            }
        }
    }
}
