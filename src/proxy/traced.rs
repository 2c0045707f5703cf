//! What a request's trace tells of its life: the events on its server span, read off what its
//! life was told and the step it answered (one place: [`Proxy::tell`](super::forward)), and
//! how an attempt's span ends.
//!
//! Pure functions of the machine's types: which event a transition is, tested here without a
//! span; the span itself is src/telemetry/trace.rs.

use opentelemetry::KeyValue;

use super::life::{AfterMissing, Event, Gone, ResendWhy, Step};
use crate::classify::Verdict;
use crate::hold::Released;
use crate::telemetry::trace::{AttemptEnd, RequestSpan};

/// Something holdfast did with a request, as its span's event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Noted {
    /// It waits in the hold: before it was sent (an outage open), or after its attempt met a
    /// missing backend (`reason`, as `holdfast_rewrites_total` names it).
    Held(Option<&'static str>),
    /// Its wait in the hold ended: `outcome` says how (`go`, `timed_out`, ...).
    Released(&'static str),
    /// It goes again after a hold.
    Replayed,
    /// It goes again after a failure that may have reached the application, being safe to.
    Resent(&'static str),
    /// The session it carries was re-established: it goes again.
    SessionReestablished,
    /// The server ended its answer's stream without answering it.
    Unanswered,
    /// Its answer's stream broke before its first event.
    StreamBroken,
    /// holdfast is stopping with it held: a peer is asked to take it.
    HandingOff,
}

impl Noted {
    /// The event's name and attributes.
    fn event(self) -> (&'static str, Vec<KeyValue>) {
        match self {
            Noted::Held(reason) => {
                let attrs = reason.map(|r| KeyValue::new("holdfast.reason", r));
                ("held", attrs.into_iter().collect())
            }
            Noted::Released(outcome) => {
                ("released", vec![KeyValue::new("holdfast.outcome", outcome)])
            }
            Noted::Replayed => ("replayed", Vec::new()),
            Noted::Resent(why) => ("resent", vec![KeyValue::new("holdfast.reason", why)]),
            Noted::SessionReestablished => ("session re-established", Vec::new()),
            Noted::Unanswered => ("unanswered", Vec::new()),
            Noted::StreamBroken => ("stream broken", Vec::new()),
            Noted::HandingOff => ("handing off", Vec::new()),
        }
    }
}

/// What a transition tells the trace: what the event was (a release, a re-established
/// session, an unanswered stream), then what the step does (hold, replay, resend, hand off).
pub(super) fn noted(event: &Event, step: &Step) -> [Option<Noted>; 2] {
    let happened = match event {
        Event::Released(Released::NotHeld) => None,
        Event::Released(r) => Some(Noted::Released(released(*r))),
        Event::Session(Gone::SendAgain) => Some(Noted::SessionReestablished),
        Event::Unanswered => Some(Noted::Unanswered),
        Event::StreamBroken => Some(Noted::StreamBroken),
        _ => None,
    };
    let does = match step {
        Step::HoldBeforeDispatch => Some(Noted::Held(None)),
        Step::Missing(m) if m.then == AfterMissing::Hold => {
            Some(Noted::Held(Some(m.reason.as_str())))
        }
        Step::Send(send) if send.replay => Some(Noted::Replayed),
        Step::Send(send) => send.resend.map(|r| Noted::Resent(resend_why(r.why))),
        Step::HandOff => Some(Noted::HandingOff),
        _ => None,
    };
    [happened, does]
}

/// Adds the events of a transition to `span`.
pub(super) fn record(span: &RequestSpan, event: &Event, step: &Step) {
    if !span.is_recording() {
        return;
    }
    for noted in noted(event, step).into_iter().flatten() {
        let (name, attributes) = noted.event();
        span.event(name, attributes);
    }
}

/// How an attempt's span ends: with the status of the answer it got, or the verdict's reason.
pub(super) fn attempt_end(verdict: &Verdict, status: Option<http::StatusCode>) -> AttemptEnd {
    if let Some(status) = status {
        return AttemptEnd::Answered(status.as_u16());
    }
    AttemptEnd::Failed(match verdict {
        Verdict::Missing(m) => m.reason.as_str(),
        Verdict::Failed(reason) => reason.as_str(),
        Verdict::ClientBody(_) => "client_body",
        Verdict::Application | Verdict::RouterPassthrough(_) => "no_answer",
    })
}

fn released(r: Released) -> &'static str {
    match r {
        Released::Go => "go",
        Released::NotHeld => "not_held",
        Released::TimedOut => "timed_out",
        Released::QueueFull => "queue_full",
        Released::Shutdown => "shutdown",
        Released::Cancelled => "cancelled",
    }
}

fn resend_why(why: ResendWhy) -> &'static str {
    match why {
        ResendWhy::OnceMore => "connection_broke",
        ResendWhy::HeldUntilBack => "connection_broke_again",
        ResendWhy::RouterAnswered => "router_answered",
        ResendWhy::Unanswered => "unanswered",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{Missing, RewriteReason};
    use crate::proxy::life::{Exit, MissingStep, Send};

    const FIRST: Send = Send {
        supersede: false,
        replay: false,
        resend: None,
    };

    #[test]
    fn a_hold_its_release_and_the_replay_are_three_events() {
        let missing = Step::Missing(MissingStep {
            reason: RewriteReason::ConnectRefused,
            resend: None,
            then: AfterMissing::Hold,
        });
        let verdict = Event::Verdict {
            verdict: Verdict::Missing(Missing {
                reason: RewriteReason::ConnectRefused,
                never_reached_app: true,
            }),
            proves: false,
        };
        assert_eq!(
            noted(&verdict, &missing),
            [None, Some(Noted::Held(Some("connect_refused")))]
        );
        let replay = Step::Send(Send {
            replay: true,
            ..FIRST
        });
        assert_eq!(
            noted(&Event::Released(Released::Go), &replay),
            [Some(Noted::Released("go")), Some(Noted::Replayed)]
        );
        let (name, attrs) = Noted::Held(Some("connect_refused")).event();
        assert_eq!(name, "held");
        assert_eq!(attrs, [KeyValue::new("holdfast.reason", "connect_refused")]);
    }

    #[test]
    fn an_ordinary_request_notes_nothing() {
        let arrived = Event::Arrived {
            outage_holds: false,
        };
        assert_eq!(noted(&arrived, &Step::Send(FIRST)), [None, None]);
        assert_eq!(
            noted(&Event::Settled, &Step::Exit(Exit::Pass)),
            [None, None]
        );
        // Released without having waited: nothing was held.
        let not_held = Event::Released(Released::NotHeld);
        assert_eq!(noted(&not_held, &Step::Send(FIRST)), [None, None]);
    }

    #[test]
    fn a_forgotten_session_and_an_unanswered_stream_are_named() {
        let again = Step::Send(Send {
            supersede: true,
            ..FIRST
        });
        assert_eq!(
            noted(&Event::Session(Gone::SendAgain), &again),
            [Some(Noted::SessionReestablished), None]
        );
        assert_eq!(
            noted(&Event::Unanswered, &Step::HoldBeforeDispatch)[0],
            Some(Noted::Unanswered)
        );
    }

    #[test]
    fn an_attempt_ends_with_its_status_or_its_verdicts_reason() {
        let refused = Verdict::Missing(Missing {
            reason: RewriteReason::ConnectRefused,
            never_reached_app: true,
        });
        assert!(matches!(
            attempt_end(&refused, None),
            AttemptEnd::Failed("connect_refused")
        ));
        let got = attempt_end(&Verdict::Application, Some(http::StatusCode::OK));
        assert!(matches!(got, AttemptEnd::Answered(200)));
    }
}
