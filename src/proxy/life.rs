//! One request's life as a plain state machine: events in, the next move out.
//!
//! Nothing here sends, waits, counts a metric or logs. The executor (`forward.rs`) tells the
//! [`Life`] what happened to its request (it arrived, an attempt's verdict, a release from the
//! hold, the first event of its answer's stream or its end without one, what its session's check
//! found, a hand-off's outcome) and carries out the [`Step`] it returns: send the request (again),
//! wait in the hold, open an outage, read the application's answer on, hand the request to a
//! peer, or leave with one [`Exit`]. What only the executor can see (whether the body can go
//! again, whether the request is safe to run twice) the machine asks through [`Facts`], and only
//! where a rule needs it: judging a body costs a parse.
//!
//! The rules behind "every tool call executes exactly once" live here alone, and are tested here
//! without a runtime (`life/props.rs`):
//! - a request that may have reached the application goes again only if it is safe to run twice,
//!   or the server showed it did not run it (its refusal of a session it forgot);
//! - a request leaves by exactly one exit;
//! - a release from the hold sends the request once.
//!
//! ```text
//!  Arrived ─(outage open)─▶ Held(Dispatch) ─(Go, NotHeld)─▶ Sending ◀─────────────────────┐
//!     └──────────────────────────────────────────────────────▶ │ verdict                   │
//!        Application ─▶ Reading ─(unanswered, broken, forgotten session)──────────────────┤
//!        Missing, broke ─▶ Held(Missing) ─(Go, NotHeld: a replay)──────────────────────────┘
//!        anything else, or a hold that ends without a release ─▶ Done (one Exit)
//! ```

use crate::classify::{FailReason, Missing, PassReason, RewriteReason, Verdict};
use crate::hold::Released;
use crate::idempotent::SafeKind;
use crate::upstream::ClientBodyFault;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

/// Most times a request safe to run twice is sent again after it broke the upstream's connection:
/// the first time at once, then from the hold. A request that breaks the server every time (a
/// crash it causes itself) gets its 502 at the third break, instead of crashing the server again
/// after every backoff until the hold times out.
pub(super) const MAX_BREAKS: u8 = 3;

/// Most re-establishments one request may cause. A server that forgets the session again right
/// after it was re-established (a restart loop) gets its answer passed through after the second.
pub(super) const MAX_RESUMES: u32 = 2;

/// What only the executor can see, asked when a rule needs it.
pub(super) trait Facts {
    /// The request's body could go (again) now: never sent, or kept whole.
    fn replayable(&self) -> bool;
    /// Why the request is safe to run twice, if it is and its body was kept whole.
    fn safe(&mut self) -> Option<SafeKind>;
}

/// What happened to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// The request came in. `outage_holds`: holding is on and an outage open on its way holds
    /// requests before they are sent.
    Arrived { outage_holds: bool },
    /// Its wait in the hold ended.
    Released(Released),
    /// The body for the next attempt is gone (it failed, or was not kept whole).
    Unsendable,
    /// An attempt's verdict. `proves`: the answer shows the application is there (a HEAD's
    /// answer to a status a router signature could match proves nothing).
    Verdict { verdict: Verdict, proves: bool },
    /// The answer's event stream ended before its first event, without the request's answer.
    Unanswered,
    /// The answer's event stream broke before its first event.
    StreamBroken,
    /// What the check of the application's 404 or 400 to a request on a session found.
    Session(Gone),
    /// The application's answer was read on and passes.
    Settled,
    /// A hand-off ended: `taken`, a peer answered it.
    HandedOff { taken: bool },
}

/// What the application's 404 or 400 to a request on a session means (src/proxy/resume.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// The session is back (re-established by this request or another): the server refused the
    /// request without running it, so it goes again.
    SendAgain,
    /// The backend went missing while re-establishing: as for any missing backend.
    Missing(Missing),
    /// The server's answer is the request's own.
    Pass,
}

/// The next move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Send the request (again).
    Send(Send),
    /// Wait in the hold of the outage already open, before anything is sent.
    HoldBeforeDispatch,
    /// The backend is missing, or went away under a request safe to run twice: open or join the
    /// outage of `reason` (the upstream's for a failed connection or a server going away, else
    /// the route's), stop the failed attempt's body, count the resend, then do `then`.
    Missing(MissingStep),
    /// The application answered: read its answer on (its first event, its session's check) and
    /// tell what that found.
    Read,
    /// holdfast is shutting down with the request held: hand it to a peer.
    HandOff,
    /// Answer the client.
    Exit(Exit),
}

/// An attempt to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Send {
    /// Stop the previous attempt's body first (a connection may still be reading it).
    pub supersede: bool,
    /// It goes again after a hold: counted as a replay.
    pub replay: bool,
    /// It goes again after a failure that may have reached the application, being safe to.
    pub resend: Option<Resend>,
}

/// See [`Step::Missing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MissingStep {
    pub reason: RewriteReason,
    pub resend: Option<Resend>,
    pub then: AfterMissing,
}

/// What follows the outage's bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterMissing {
    /// Wait in the hold (counted as held), then tell the release.
    Hold,
    /// Send it once more at once (a server going away under a request safe to run twice, with
    /// holding off).
    Send(Send),
    /// Answer the client.
    Exit(Exit),
}

/// A resend of a request safe to run twice, for its count and log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resend {
    pub kind: SafeKind,
    /// Breaks so far, this one included.
    pub breaks: u8,
    pub why: ResendWhy,
}

/// Why a request safe to run twice goes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResendWhy {
    /// It broke the connection once: it goes once more at once.
    OnceMore,
    /// It broke it again: held until the upstream is back.
    HeldUntilBack,
    /// A router answered for the backend with a 5xx that may follow a request it read.
    RouterAnswered,
    /// Its answer's stream ended unanswered: held until the upstream is back (said already).
    Unanswered,
}

/// How the request leaves: the one answer its client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exit {
    /// The application's answer passes.
    Pass,
    /// A router's own answer passes as it is.
    RouterPassed(PassReason),
    /// 503 + Retry-After, for `reason` (`None`: the reason of the outage it last met).
    /// `too_large`: its body outgrew the copy kept for a replay.
    Unavailable {
        reason: Option<RewriteReason>,
        too_large: bool,
    },
    /// 502. `upstream_there`: the failure shows the upstream answers (TLS): its outage ends.
    Failed {
        reason: FailReason,
        upstream_there: bool,
    },
    /// The client broke its body mid-upload.
    ClientBody(ClientBodyFault),
    /// The client went away while its request was held.
    ClientGone,
    /// A peer answered it.
    HandedOff,
}

/// How a request came to its answer (the access log's `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Passed,
    /// Waited in the hold before its first attempt.
    Held,
    /// Sent again after a hold.
    Replayed,
    /// Its forgotten session was re-established.
    Resumed,
}

/// Where the request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    New,
    /// Waiting in the hold: before its first attempt, or for the backend missing for `reason`.
    Held(Option<RewriteReason>),
    /// An attempt was asked for; its verdict (or its body's absence) comes next.
    Sending,
    /// The application's answer is being read on.
    Reading,
    HandingOff,
    /// Left by its exit.
    Done,
}

/// One request's life.
#[derive(Debug)]
pub(super) struct Life {
    phase: Phase,
    /// `hold.enabled`.
    holding: bool,
    /// A peer handed it here at its own shutdown: never handed on again.
    handed: bool,
    /// Waited in the hold before its first attempt.
    held_first: bool,
    /// A replay went out.
    replayed: bool,
    /// Breaks after it may have reached the application, each answered by sending it again.
    breaks: u8,
    /// Sent again at once after its connection closed unread.
    closed_once: bool,
    /// Re-establishments of its session it caused or waited for.
    resumes: u32,
}

impl Life {
    pub(super) fn new(holding: bool, handed: bool) -> Life {
        Life {
            phase: Phase::New,
            holding,
            handed,
            held_first: false,
            replayed: false,
            breaks: 0,
            closed_once: false,
            resumes: 0,
        }
    }

    /// The next move after `event`. An event the request's phase cannot meet is the executor's
    /// bug, and panics.
    pub(super) fn on(&mut self, event: Event, facts: &mut impl Facts) -> Step {
        let step = match (self.phase, event) {
            (Phase::New, Event::Arrived { outage_holds }) => {
                if self.holding && outage_holds {
                    self.phase = Phase::Held(None);
                    Step::HoldBeforeDispatch
                } else {
                    self.send(false, false, None)
                }
            }
            (Phase::Held(reason), Event::Released(released)) => self.released(reason, released),
            (Phase::Sending, Event::Unsendable) => Step::Exit(Exit::Unavailable {
                reason: None,
                too_large: false,
            }),
            (Phase::Sending, Event::Verdict { verdict, proves }) => {
                self.verdict(verdict, proves, facts)
            }
            (Phase::Reading, Event::Unanswered) => self.unanswered(facts),
            (Phase::Reading, Event::StreamBroken) => self.broke(facts),
            (Phase::Reading, Event::Session(Gone::SendAgain)) => self.send(false, false, None),
            (Phase::Reading, Event::Session(Gone::Missing(missing))) => {
                self.missing(missing.reason, missing.is_safe_to_replay(), None, facts)
            }
            (Phase::Reading, Event::Session(Gone::Pass) | Event::Settled) => Step::Exit(Exit::Pass),
            (Phase::HandingOff, Event::HandedOff { taken: true }) => Step::Exit(Exit::HandedOff),
            (Phase::HandingOff, Event::HandedOff { taken: false }) => {
                Step::Exit(Exit::Unavailable {
                    reason: None,
                    too_large: false,
                })
            }
            (phase, event) => unreachable!("a request {phase:?} cannot meet {event:?}"),
        };
        if matches!(
            step,
            Step::Exit(_)
                | Step::Missing(MissingStep {
                    then: AfterMissing::Exit(_),
                    ..
                })
        ) {
            self.phase = Phase::Done;
        }
        step
    }

    /// Whether the request may re-establish its session (or wait for another's
    /// re-establishment) once more; counted when it may.
    pub(super) fn may_resume(&mut self) -> bool {
        debug_assert_eq!(self.phase, Phase::Reading);
        if self.resumes >= MAX_RESUMES {
            return false;
        }
        self.resumes += 1;
        true
    }

    /// Re-establishments so far (for the log).
    pub(super) fn resumes(&self) -> u32 {
        self.resumes
    }

    /// How it came to its answer.
    pub(super) fn path(&self) -> Path {
        if self.resumes > 0 {
            Path::Resumed
        } else if self.replayed {
            Path::Replayed
        } else if self.held_first {
            Path::Held
        } else {
            Path::Passed
        }
    }

    fn send(&mut self, supersede: bool, replay: bool, resend: Option<Resend>) -> Step {
        Step::Send(self.sending(supersede, replay, resend))
    }

    /// An attempt goes out next.
    fn sending(&mut self, supersede: bool, replay: bool, resend: Option<Resend>) -> Send {
        self.phase = Phase::Sending;
        self.replayed |= replay;
        Send {
            supersede,
            replay,
            resend,
        }
    }

    /// A wait in the hold ended: before the first attempt (`reason` `None`) or for a missing
    /// backend.
    fn released(&mut self, reason: Option<RewriteReason>, released: Released) -> Step {
        let unavailable = |reason| {
            Step::Exit(Exit::Unavailable {
                reason,
                too_large: false,
            })
        };
        match released {
            Released::Go | Released::NotHeld => {
                let before_sending = reason.is_none();
                self.held_first |= before_sending && released == Released::Go;
                self.send(false, !before_sending, None)
            }
            Released::Cancelled => Step::Exit(Exit::ClientGone),
            // It never reached a server: a peer takes it, unless a peer handed it here.
            Released::Shutdown if !self.handed => {
                self.phase = Phase::HandingOff;
                Step::HandOff
            }
            Released::Shutdown => unavailable(None),
            Released::TimedOut | Released::QueueFull => unavailable(reason),
        }
    }

    fn verdict(&mut self, verdict: Verdict, proves: bool, facts: &mut impl Facts) -> Step {
        match verdict {
            Verdict::Application if proves => {
                self.phase = Phase::Reading;
                Step::Read
            }
            // A HEAD's answer a router could have given passes, proving nothing.
            Verdict::Application => Step::Exit(Exit::Pass),
            Verdict::RouterPassthrough(reason) => Step::Exit(Exit::RouterPassed(reason)),
            // Sent, then broken before any answer: the application may have run it.
            Verdict::Failed(FailReason::UpstreamReset) => self.broke(facts),
            // A TLS failure is the upstream answering (with a certificate holdfast does not
            // accept): it is there. (A reset after sending proves nothing: a port proxy may
            // accept and then reset while the backend is still starting.)
            Verdict::Failed(reason) => Step::Exit(Exit::Failed {
                reason,
                upstream_there: reason == FailReason::UpstreamTls,
            }),
            Verdict::ClientBody(fault) => Step::Exit(Exit::ClientBody(fault)),
            // A connection that closed before the upstream read the request: most often a
            // keep-alive race with a healthy server, so once at once on another connection
            // before calling it an outage.
            Verdict::Missing(missing)
                if missing.reason == RewriteReason::ConnectionClosed
                    && !self.closed_once
                    && facts.replayable() =>
            {
                self.closed_once = true;
                self.send(true, false, None)
            }
            Verdict::Missing(missing) => {
                // A router's 502 or 504 may follow a request the backend read: held all the same
                // when it is safe to run twice (waiting costs nothing a refused connect would
                // not), counted as a resend.
                let mut resend = None;
                let replayable = missing.is_safe_to_replay() || {
                    resend = facts.safe().map(|kind| Resend {
                        kind,
                        breaks: self.breaks,
                        why: ResendWhy::RouterAnswered,
                    });
                    resend.is_some()
                };
                self.missing(missing.reason, replayable, resend, facts)
            }
        }
    }

    /// The one decision about a missing backend: hold the request and send it again once the
    /// backend is back, or answer 503 now. `replayable`: it provably never reached the
    /// application, or is safe to run twice.
    fn missing(
        &mut self,
        reason: RewriteReason,
        replayable: bool,
        resend: Option<Resend>,
        facts: &mut impl Facts,
    ) -> Step {
        let then = if !self.holding || !replayable {
            AfterMissing::Exit(Exit::Unavailable {
                reason: Some(reason),
                too_large: false,
            })
        } else if !facts.replayable() {
            // The body outgrew hold.max_body_bytes while it was sent: no copy to send again.
            AfterMissing::Exit(Exit::Unavailable {
                reason: Some(reason),
                too_large: true,
            })
        } else {
            self.phase = Phase::Held(Some(reason));
            AfterMissing::Hold
        };
        Step::Missing(MissingStep {
            reason,
            resend,
            then,
        })
    }

    /// The upstream broke after the request may have reached the application (a reset, a close
    /// before the answer, a stream broken before its first event). Safe to run twice: once more
    /// at once the first time (a one-off: one worker's crash, a keep-alive race); if it breaks
    /// again the server is dying or restarting under it, so it is held like a request that never
    /// reached it and goes once the server is back (with holding on); a 502 at the
    /// [`MAX_BREAKS`]th break. Not safe: a 502.
    fn broke(&mut self, facts: &mut impl Facts) -> Step {
        let failed = Step::Exit(Exit::Failed {
            reason: FailReason::UpstreamReset,
            upstream_there: false,
        });
        let Some(kind) = facts.safe() else {
            return failed;
        };
        if self.breaks == 0 {
            self.breaks = 1;
            let resend = self.resend(kind, ResendWhy::OnceMore);
            return self.send(true, false, Some(resend));
        }
        if self.holding && self.breaks + 1 < MAX_BREAKS {
            self.breaks += 1;
            let resend = self.resend(kind, ResendWhy::HeldUntilBack);
            return self.missing(RewriteReason::UpstreamReset, true, Some(resend), facts);
        }
        failed
    }

    /// The upstream ended the answer's event stream before its first event, without answering:
    /// it is going away. The request reached it and may have run, so it goes again only if it is
    /// safe to run twice: held until the upstream is back (once more at once with holding off).
    /// Otherwise a 502. Either way the upstream's outage opens, so that what comes next waits
    /// instead of going into a server that drops its answers.
    fn unanswered(&mut self, facts: &mut impl Facts) -> Step {
        let reason = RewriteReason::Unanswered;
        let safe = facts.safe();
        if let (true, Some(kind)) = (self.holding, safe) {
            let resend = self.resend(kind, ResendWhy::Unanswered);
            return self.missing(reason, true, Some(resend), facts);
        }
        let then = match safe {
            Some(kind) if self.breaks == 0 => {
                self.breaks = 1;
                let resend = self.resend(kind, ResendWhy::OnceMore);
                // The outage's bookkeeping stops the failed attempt's body.
                AfterMissing::Send(self.sending(false, false, Some(resend)))
            }
            _ => AfterMissing::Exit(Exit::Failed {
                reason: FailReason::Unanswered,
                upstream_there: false,
            }),
        };
        Step::Missing(MissingStep {
            reason,
            resend: None,
            then,
        })
    }

    fn resend(&self, kind: SafeKind, why: ResendWhy) -> Resend {
        Resend {
            kind,
            breaks: self.breaks,
            why,
        }
    }
}
