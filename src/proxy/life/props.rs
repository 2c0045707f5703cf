//! The life's invariants over generated worlds: a driver plays the executor, answering each step
//! with an event the world picks (any verdict, any release, any finding), and checks after every
//! step what must hold whatever happens:
//! - a request that may have reached the application is sent again only if it is safe to run
//!   twice, or the server showed it did not run it (a forgotten session's refusal);
//! - every request leaves by exactly one exit, and a world that runs out of surprises (every hold
//!   times out, every answer settles) sees it leave within a few steps;
//! - a release from the hold sends the request once, as a replay exactly when an attempt went
//!   before it; nothing else is a replay;
//! - without a release, a request goes out at most 1 + 1 + 1 + [`MAX_RESUMES`] times (the first
//!   attempt, a connection closed unread, one resend at once, the session's re-establishments);
//! - a request that breaks the upstream's connection is sent again fewer than [`MAX_BREAKS`]
//!   times, however often the hold lets it go.

use proptest::prelude::*;

use super::tests::Given;
use super::*;
use crate::classify::Missing;

const REASONS: [(RewriteReason, bool); 5] = [
    (RewriteReason::ConnectRefused, true),
    (RewriteReason::ConnectionClosed, true),
    (RewriteReason::RouteMissing404, true),
    (RewriteReason::Dns, true),
    // A router's 502 or 504: the backend may have read it.
    (RewriteReason::RouterUnavailable, false),
];

const RELEASES: [Released; 6] = [
    Released::Go,
    Released::NotHeld,
    Released::TimedOut,
    Released::QueueFull,
    Released::Shutdown,
    Released::Cancelled,
];

fn missing_of(pick: u8) -> Missing {
    let (reason, never_reached_app) = REASONS[usize::from(pick) % REASONS.len()];
    Missing {
        reason,
        never_reached_app,
    }
}

/// The verdict of an attempt the world picks, and whether the request may have reached the
/// application by then.
fn verdict_of(pick: u8) -> (Event, bool) {
    let (verdict, proves) = match pick % 11 {
        0 | 1 => (Verdict::Application, true),
        2 => (Verdict::Application, false),
        3 => (
            Verdict::RouterPassthrough(PassReason::RouteNotExpected),
            true,
        ),
        4 | 5 => (Verdict::Missing(missing_of(pick / 11)), true),
        6 | 7 => (Verdict::Failed(FailReason::UpstreamReset), false),
        8 => (Verdict::Failed(FailReason::ResponseTimeout), false),
        9 => (Verdict::Failed(FailReason::UpstreamTls), false),
        _ => (Verdict::ClientBody(ClientBodyFault::Malformed), false),
    };
    let reached = match verdict {
        Verdict::Application | Verdict::ClientBody(_) => true,
        Verdict::RouterPassthrough(_) | Verdict::Failed(FailReason::UpstreamTls) => false,
        Verdict::Failed(_) => true,
        Verdict::Missing(m) => !m.never_reached_app,
    };
    (Event::Verdict { verdict, proves }, reached)
}

/// What the driver saw of one life.
#[derive(Debug, Default)]
struct Seen {
    exits: usize,
    sends_unreleased: usize,
    /// Resends after the upstream broke under the request (at once, or from the hold).
    break_resends: usize,
    steps: usize,
}

/// Plays one life in `world`: `picks` decide each event; once they run out, every hold times out,
/// every answer settles and every attempt is refused.
fn play(holding: bool, handed: bool, given: &mut Given, picks: &[u8]) -> Result<Seen, String> {
    let mut life = Life::new(holding, handed);
    let mut seen = Seen::default();
    let mut pick = picks.iter().copied();
    // The last attempt may have reached the application; the server showed it did not run it.
    let (mut reached, mut unrun) = (false, false);
    // An attempt went out before the hold the request waits in; the last event was a release.
    let (mut attempted, mut released) = (false, false);
    let first = pick.next().unwrap_or(0);
    let mut step = life.on(
        Event::Arrived {
            outage_holds: first % 2 == 0,
        },
        given,
    );
    loop {
        seen.steps += 1;
        let exiting = matches!(
            step,
            Step::Exit(_)
                | Step::Missing(MissingStep {
                    then: AfterMissing::Exit(_),
                    ..
                })
        );
        if !exiting && life.phase == Phase::Done {
            return Err(format!("{step:?} after the request left"));
        }
        if seen.steps > picks.len() + 16 {
            return Err(format!("no exit after {} steps", seen.steps));
        }
        // A send the missing backend's bookkeeping leads to is a send all the same.
        if let Step::Missing(MissingStep {
            then: AfterMissing::Send(send),
            ..
        }) = step
        {
            step = Step::Send(send);
        }
        let resend = match step {
            Step::Send(send) => send.resend,
            Step::Missing(missing) => missing.resend,
            _ => None,
        };
        if resend.is_some_and(|r| matches!(r.why, ResendWhy::OnceMore | ResendWhy::HeldUntilBack)) {
            seen.break_resends += 1;
        }
        let next = pick.next();
        let event = match step {
            Step::Send(send) => {
                if reached && !unrun && given.safe.is_none() {
                    return Err("a request that may have run goes again, not safe twice".into());
                }
                if send.replay != (released && attempted) {
                    return Err(format!("replay {} after released {released}", send.replay));
                }
                if !released {
                    seen.sends_unreleased += 1;
                }
                (reached, unrun, released, attempted) = (false, false, false, true);
                match next {
                    Some(255) => Event::Unsendable,
                    Some(p) => {
                        let (event, may_have_reached) = verdict_of(p);
                        reached = may_have_reached;
                        event
                    }
                    None => verdict_of(4).0,
                }
            }
            Step::HoldBeforeDispatch
            | Step::Missing(MissingStep {
                then: AfterMissing::Hold,
                ..
            }) => {
                if matches!(step, Step::HoldBeforeDispatch) && attempted {
                    return Err("held before dispatch after an attempt".into());
                }
                let released_as = next.map_or(Released::TimedOut, |p| {
                    RELEASES[usize::from(p) % RELEASES.len()]
                });
                released = matches!(released_as, Released::Go | Released::NotHeld);
                Event::Released(released_as)
            }
            Step::Read => match next.map(|p| p % 7) {
                Some(0) => Event::Unanswered,
                Some(1) => Event::StreamBroken,
                Some(2) if life.may_resume() => {
                    unrun = true;
                    Event::Session(Gone::SendAgain)
                }
                Some(3) if life.may_resume() => {
                    unrun = true;
                    Event::Session(Gone::Missing(missing_of(next.unwrap_or(0) / 7)))
                }
                Some(4) => Event::Session(Gone::Pass),
                _ => Event::Settled,
            },
            Step::HandOff => Event::HandedOff {
                taken: next.is_some_and(|p| p % 2 == 0),
            },
            Step::Exit(_)
            | Step::Missing(MissingStep {
                then: AfterMissing::Exit(_),
                ..
            }) => {
                if life.phase != Phase::Done {
                    return Err(format!("{step:?} left the request {:?}", life.phase));
                }
                seen.exits += 1;
                return Ok(seen);
            }
            Step::Missing(MissingStep {
                then: AfterMissing::Send(_),
                ..
            }) => unreachable!(),
        };
        step = life.on(event, given);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16384))]

    #[test]
    fn every_life_keeps_the_rules(
        holding in any::<bool>(),
        handed in any::<bool>(),
        replayable in any::<bool>(),
        safe in any::<bool>(),
        picks in prop::collection::vec(any::<u8>(), 0..48),
    ) {
        // A body not kept whole is never safe to run twice (the executor's judge reads it whole).
        let mut given = Given::new(replayable, safe && replayable);
        let seen = play(holding, handed, &mut given, &picks).map_err(TestCaseError::fail)?;
        prop_assert_eq!(seen.exits, 1);
        prop_assert!(
            seen.sends_unreleased <= 3 + MAX_RESUMES as usize,
            "{} sends without a release", seen.sends_unreleased
        );
        // A request that breaks the server every time gets its 502 at the last break.
        prop_assert!(seen.break_resends < usize::from(MAX_BREAKS), "{seen:?}");
    }
}
