//! A pause for a planned restart, as a phase of the machine: no outage until something shows
//! the upstream gone, then the outage between the instances.

use std::time::{Duration, Instant};

use super::io::{Effect, Effects};
use super::{Episode, Machine, Phase};
use crate::classify::RewriteReason;

/// A pause for a planned restart.
#[derive(Debug, Clone, Copy)]
pub(in crate::hold) struct Pause {
    /// Which pause, so a watcher stops with its own pause and not the next one's.
    pub id: u64,
    pub since: Instant,
    /// When it ends by itself.
    pub until: Instant,
}

/// The pause's state, as its watcher and the admin see it.
#[derive(Debug, Clone, Copy)]
pub(in crate::hold) struct PauseView {
    pub pause: Pause,
    pub upstream_gone: bool,
    pub held: usize,
}

/// Why a pause could not begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hold) enum NoPause {
    Already,
}

impl<W> Machine<W> {
    pub(in crate::hold) fn pause(&self) -> Option<PauseView> {
        let (pause, upstream_gone) = match &self.phase {
            Phase::Paused { pause, .. } => (*pause, false),
            Phase::Outage {
                pause: Some(pause), ..
            } => (*pause, true),
            _ => return None,
        };
        Some(PauseView {
            pause,
            upstream_gone,
            held: self.queue.len(),
        })
    }

    /// Something showed the upstream gone, without a request meeting it (a pause's presence
    /// check, another route's failure): only a pause learns from it.
    pub(in crate::hold) fn saw_gone(&mut self, reason: RewriteReason, now: Instant) -> Effects<W> {
        let mut fx = Vec::new();
        if matches!(self.phase, Phase::Paused { .. }) {
            // The pause's stretch goes on as the outage: no new id is needed.
            self.open(reason, now, 0, &mut fx);
        } else if let Phase::Outage {
            outage,
            pause: Some(_),
            ..
        } = &mut self.phase
        {
            outage.last_reason = reason;
        }
        fx
    }

    /// A pause begins, for at most `max` (`id` names its stretch if nothing is open). An
    /// outage already open: the upstream is gone now, and the application's first answer
    /// ends the outage and the pause together.
    pub(in crate::hold) fn begin_pause(
        &mut self,
        now: Instant,
        max: Duration,
        id: u64,
    ) -> Result<(Pause, bool, Effects<W>), NoPause> {
        if self.pause().is_some() {
            return Err(NoPause::Already);
        }
        self.pauses += 1;
        let new = Pause {
            id: self.pauses,
            since: now,
            until: now + max,
        };
        let mut fx = Vec::new();
        match &mut self.phase {
            Phase::Clear => {
                self.phase = Phase::Paused {
                    held: Episode::new(id),
                    pause: new,
                    past_horizon: false,
                };
                // A failure noted before the pause is not what shows the upstream gone.
                self.cause = None;
                if self.may_sleep {
                    fx.push(Effect::RouteOutage(true));
                }
                Ok((new, false, fx))
            }
            Phase::Outage { pause, dormant, .. } => {
                // Only the upstream-wide outage is paused, and it never sleeps; a dormant one
                // would hold again, counted.
                if std::mem::replace(dormant, false) {
                    fx.push(Effect::Counted(true));
                }
                *pause = Some(new);
                Ok((new, true, fx))
            }
            Phase::Paused { .. } => unreachable!("checked above"),
        }
    }

    /// Ends the pause (pause `id` only, if given), `by` whom or what. Never seen gone, everyone
    /// held is released to whatever answers now; gone and not back, the outage goes on as any
    /// other. False when there was no such pause.
    pub(in crate::hold) fn end_pause(
        &mut self,
        id: Option<u64>,
        by: &str,
        now: Instant,
    ) -> (bool, Effects<W>) {
        let mut fx = Vec::new();
        match self.pause() {
            Some(v) if id.is_none_or(|id| id == v.pause.id) => {}
            _ => return (false, fx),
        }
        let gone = matches!(self.phase, Phase::Outage { .. });
        let pause = self.take_pause().expect("a pause, checked above");
        fx.push(self.pause_ended(&pause, by, gone, now));
        if !gone {
            self.close(now, &mut fx);
        }
        (true, fx)
    }

    pub(super) fn take_pause(&mut self) -> Option<Pause> {
        match &mut self.phase {
            Phase::Paused { pause, .. } => Some(*pause),
            Phase::Outage { pause, .. } => pause.take(),
            Phase::Clear => None,
        }
    }

    pub(super) fn pause_ended(
        &self,
        pause: &Pause,
        by: &str,
        gone: bool,
        now: Instant,
    ) -> Effect<W> {
        Effect::PauseEnded {
            by: by.to_owned(),
            lasted: now.saturating_duration_since(pause.since),
            upstream_was_gone: gone,
            held: self.queue.len(),
        }
    }
}
