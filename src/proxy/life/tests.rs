//! One request's life, step by step, for the cases the executor meets.

use super::*;
use crate::classify::Missing;

/// What the executor would see: fixed answers, and how often the (costly) safety was asked.
pub(super) struct Given {
    pub replayable: bool,
    pub safe: Option<SafeKind>,
    pub asked_safe: usize,
}

impl Given {
    pub(super) fn new(replayable: bool, safe: bool) -> Given {
        Given {
            replayable,
            safe: safe.then_some(SafeKind::ReadOnlyMethod),
            asked_safe: 0,
        }
    }
}

impl Facts for Given {
    fn replayable(&self) -> bool {
        self.replayable
    }

    fn safe(&mut self) -> Option<SafeKind> {
        self.asked_safe += 1;
        self.safe
    }
}

const SEND: Step = Step::Send(Send {
    supersede: false,
    replay: false,
    resend: None,
});

const REPLAY: Step = Step::Send(Send {
    supersede: false,
    replay: true,
    resend: None,
});

fn verdict(verdict: Verdict) -> Event {
    Event::Verdict {
        verdict,
        proves: true,
    }
}

fn missing(reason: RewriteReason, never_reached_app: bool) -> Event {
    verdict(Verdict::Missing(Missing {
        reason,
        never_reached_app,
    }))
}

const RESET: Event = Event::Verdict {
    verdict: Verdict::Failed(FailReason::UpstreamReset),
    proves: false,
};

fn unavailable(reason: Option<RewriteReason>) -> Exit {
    Exit::Unavailable {
        reason,
        too_large: false,
    }
}

/// A life that was sent once (holding `holding`).
fn sent(holding: bool, given: &mut Given) -> Life {
    let mut life = Life::new(holding, false);
    assert_eq!(
        life.on(
            Event::Arrived {
                outage_holds: false
            },
            given
        ),
        SEND
    );
    life
}

fn hold_step(reason: RewriteReason, resend: Option<Resend>) -> Step {
    Step::Missing(MissingStep {
        reason,
        resend,
        then: AfterMissing::Hold,
    })
}

#[test]
fn a_request_with_an_outage_open_waits_before_it_is_sent_and_counts_as_held() {
    let given = &mut Given::new(true, false);
    let mut life = Life::new(true, false);
    let arrived = Event::Arrived { outage_holds: true };
    assert_eq!(life.on(arrived, given), Step::HoldBeforeDispatch);
    assert_eq!(life.on(Event::Released(Released::Go), given), SEND);
    assert_eq!(life.path(), Path::Held);
    // Holding off: sent at once, whatever is open.
    let mut life = Life::new(false, false);
    assert_eq!(life.on(arrived, given), SEND);
    assert_eq!(life.path(), Path::Passed);
}

#[test]
fn a_hold_that_ends_without_a_release_answers_with_its_reason() {
    let given = &mut Given::new(true, false);
    for (released, exit) in [
        (Released::TimedOut, unavailable(Some(RewriteReason::Dns))),
        (Released::QueueFull, unavailable(Some(RewriteReason::Dns))),
        (Released::Cancelled, Exit::ClientGone),
    ] {
        let mut life = sent(true, given);
        assert_eq!(
            life.on(missing(RewriteReason::Dns, true), given),
            hold_step(RewriteReason::Dns, None)
        );
        assert_eq!(life.on(Event::Released(released), given), Step::Exit(exit));
    }
    // Before dispatch, the reason is the outage's own.
    let mut life = Life::new(true, false);
    life.on(Event::Arrived { outage_holds: true }, given);
    assert_eq!(
        life.on(Event::Released(Released::TimedOut), given),
        Step::Exit(unavailable(None))
    );
}

#[test]
fn a_release_from_a_hold_after_an_attempt_is_a_replay() {
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    let refused = missing(RewriteReason::ConnectRefused, true);
    assert_eq!(
        life.on(refused, given),
        hold_step(RewriteReason::ConnectRefused, None)
    );
    assert_eq!(
        life.path(),
        Path::Passed,
        "a replay counts once it goes out"
    );
    assert_eq!(life.on(Event::Released(Released::NotHeld), given), REPLAY);
    assert_eq!(life.path(), Path::Replayed);
    // It may meet the gap again, and go again from the next hold.
    assert_eq!(
        life.on(refused, given),
        hold_step(RewriteReason::ConnectRefused, None)
    );
    assert_eq!(life.on(Event::Released(Released::Go), given), REPLAY);
    assert_eq!(
        given.asked_safe, 0,
        "nothing asked whether it is safe twice"
    );
}

#[test]
fn a_missing_backend_without_holding_or_a_copy_is_a_503() {
    let given = &mut Given::new(true, false);
    let mut life = sent(false, given);
    let step = life.on(missing(RewriteReason::ConnectRefused, true), given);
    assert_eq!(
        step,
        Step::Missing(MissingStep {
            reason: RewriteReason::ConnectRefused,
            resend: None,
            then: AfterMissing::Exit(unavailable(Some(RewriteReason::ConnectRefused))),
        })
    );
    // The body outgrew the copy while it was sent.
    let given = &mut Given::new(false, false);
    let mut life = sent(true, given);
    let step = life.on(missing(RewriteReason::ConnectRefused, true), given);
    let Step::Missing(MissingStep { then, .. }) = step else {
        panic!("{step:?}")
    };
    assert_eq!(
        then,
        AfterMissing::Exit(Exit::Unavailable {
            reason: Some(RewriteReason::ConnectRefused),
            too_large: true
        })
    );
}

#[test]
fn a_router_5xx_that_may_follow_a_read_request_is_held_only_when_safe_twice() {
    let router = missing(RewriteReason::RouterUnavailable, false);
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    let Step::Missing(MissingStep { then, resend, .. }) = life.on(router, given) else {
        panic!()
    };
    assert_eq!(
        then,
        AfterMissing::Exit(unavailable(Some(RewriteReason::RouterUnavailable)))
    );
    assert_eq!(resend, None);
    let given = &mut Given::new(true, true);
    let mut life = sent(true, given);
    let Step::Missing(MissingStep { then, resend, .. }) = life.on(router, given) else {
        panic!()
    };
    assert_eq!(then, AfterMissing::Hold);
    assert_eq!(resend.map(|r| r.why), Some(ResendWhy::RouterAnswered));
}

#[test]
fn a_connection_closed_unread_goes_again_once_and_only_with_its_body() {
    let closed = missing(RewriteReason::ConnectionClosed, true);
    let again = Step::Send(Send {
        supersede: true,
        replay: false,
        resend: None,
    });
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    assert_eq!(life.on(closed, given), again);
    assert_eq!(
        life.on(closed, given),
        hold_step(RewriteReason::ConnectionClosed, None),
        "the next such close is an outage"
    );
    let given = &mut Given::new(false, false);
    let mut life = sent(true, given);
    assert!(
        matches!(life.on(closed, given), Step::Missing(_)),
        "no body to send again"
    );
}

#[test]
fn a_safe_request_that_breaks_goes_at_once_then_from_the_hold_then_fails() {
    let given = &mut Given::new(true, true);
    let mut life = sent(true, given);
    let Step::Send(send) = life.on(RESET, given) else {
        panic!()
    };
    assert!(send.supersede && !send.replay);
    assert_eq!(
        send.resend.map(|r| (r.why, r.breaks)),
        Some((ResendWhy::OnceMore, 1))
    );
    let Step::Missing(step) = life.on(RESET, given) else {
        panic!()
    };
    assert_eq!(step.reason, RewriteReason::UpstreamReset);
    assert_eq!(step.then, AfterMissing::Hold);
    assert_eq!(
        step.resend.map(|r| (r.why, r.breaks)),
        Some((ResendWhy::HeldUntilBack, 2))
    );
    assert_eq!(life.on(Event::Released(Released::Go), given), REPLAY);
    let failed = Step::Exit(Exit::Failed {
        reason: FailReason::UpstreamReset,
        upstream_there: false,
    });
    assert_eq!(life.on(RESET, given), failed, "the third break");
    // Holding off: once more at most.
    let mut life = sent(false, given);
    assert!(matches!(life.on(RESET, given), Step::Send(_)));
    assert_eq!(life.on(RESET, given), failed);
    // Not safe to run twice: never again.
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    assert_eq!(life.on(RESET, given), failed);
}

#[test]
fn an_unanswered_stream_is_held_when_safe_else_once_more_without_holding_else_a_502() {
    let read = |holding, given: &mut Given| {
        let mut life = sent(holding, given);
        assert_eq!(life.on(verdict(Verdict::Application), given), Step::Read);
        life
    };
    let given = &mut Given::new(true, true);
    let mut life = read(true, given);
    let Step::Missing(step) = life.on(Event::Unanswered, given) else {
        panic!()
    };
    assert_eq!(
        (step.reason, step.then),
        (RewriteReason::Unanswered, AfterMissing::Hold)
    );
    assert_eq!(step.resend.map(|r| r.why), Some(ResendWhy::Unanswered));
    // Holding off: the outage opens, and it goes once more at once.
    let mut life = read(false, given);
    let Step::Missing(step) = life.on(Event::Unanswered, given) else {
        panic!()
    };
    let AfterMissing::Send(send) = step.then else {
        panic!("{step:?}")
    };
    assert_eq!(send.resend.map(|r| r.why), Some(ResendWhy::OnceMore));
    assert_eq!(life.on(verdict(Verdict::Application), given), Step::Read);
    let Step::Missing(step) = life.on(Event::Unanswered, given) else {
        panic!()
    };
    let failed = Exit::Failed {
        reason: FailReason::Unanswered,
        upstream_there: false,
    };
    assert_eq!(step.then, AfterMissing::Exit(failed), "only once");
    // Not safe: the outage opens, and the client gets a 502.
    let given = &mut Given::new(true, false);
    let mut life = read(true, given);
    let Step::Missing(step) = life.on(Event::Unanswered, given) else {
        panic!()
    };
    assert_eq!(step.then, AfterMissing::Exit(failed));
}

#[test]
fn a_forgotten_session_sends_the_request_again_at_most_twice() {
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    for _ in 0..MAX_RESUMES {
        assert_eq!(life.on(verdict(Verdict::Application), given), Step::Read);
        assert!(life.may_resume());
        assert_eq!(life.on(Event::Session(Gone::SendAgain), given), SEND);
    }
    assert_eq!(life.path(), Path::Resumed);
    assert_eq!(life.on(verdict(Verdict::Application), given), Step::Read);
    assert!(!life.may_resume());
    assert_eq!(
        life.on(Event::Session(Gone::Pass), given),
        Step::Exit(Exit::Pass)
    );
}

#[test]
fn a_held_request_at_shutdown_is_handed_off_unless_a_peer_handed_it_here() {
    let given = &mut Given::new(true, false);
    let shutdown = Event::Released(Released::Shutdown);
    let mut life = Life::new(true, false);
    life.on(Event::Arrived { outage_holds: true }, given);
    assert_eq!(life.on(shutdown, given), Step::HandOff);
    assert_eq!(
        life.on(Event::HandedOff { taken: false }, given),
        Step::Exit(unavailable(None))
    );
    let mut life = Life::new(true, true);
    life.on(Event::Arrived { outage_holds: true }, given);
    assert_eq!(life.on(shutdown, given), Step::Exit(unavailable(None)));
}

#[test]
fn a_tls_failure_shows_the_upstream_is_there_and_other_failures_do_not() {
    let given = &mut Given::new(true, true);
    for (reason, there) in [
        (FailReason::UpstreamTls, true),
        (FailReason::ResponseTimeout, false),
        (FailReason::Protocol, false),
    ] {
        let mut life = sent(true, given);
        assert_eq!(
            life.on(verdict(Verdict::Failed(reason)), given),
            Step::Exit(Exit::Failed {
                reason,
                upstream_there: there
            })
        );
    }
    assert_eq!(
        given.asked_safe, 0,
        "a response timeout is never sent again"
    );
}

#[test]
#[should_panic(expected = "cannot meet")]
fn an_event_after_the_exit_is_the_executors_bug() {
    let given = &mut Given::new(true, false);
    let mut life = sent(true, given);
    life.on(verdict(Verdict::Application), given);
    life.on(Event::Settled, given);
    life.on(Event::Settled, given);
}
