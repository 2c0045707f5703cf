//! What has happened to one request's attempts, and what may happen next. The attempt loop
//! (`forward.rs`) asks these transitions instead of setting flags in an order of its own: each
//! is a plain function of the state, tested below without a socket.

/// Most times a request safe to run twice is sent again after it broke the upstream's connection
/// ([`Attempts::broke`]): the first time at once, then from the hold. A request that breaks the
/// server every time (a crash it causes itself) gets its 502 at the third break, instead of
/// crashing the server again after every backoff until the hold times out.
pub(super) const MAX_BREAKS: u8 = 3;

/// What to do after the upstream broke with a request that may have reached the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterBreak {
    /// Once more, at once.
    SendNow,
    /// Wait in the hold for the upstream to come back, then send it.
    Hold,
    /// A 502: not safe to run twice, or broken too often.
    Fail,
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

impl Path {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Path::Passed => "passed",
            Path::Held => "held",
            Path::Replayed => "replayed",
            Path::Resumed => "resumed",
        }
    }
}

/// One request's attempts so far.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    /// Waited in the hold before its first attempt.
    held_first: bool,
    /// Released from a hold: the next attempt is a replay.
    replay_due: bool,
    /// A replay went out.
    replayed: bool,
    /// Breaks after it may have reached the application, each answered by sending it again.
    breaks: u8,
    /// Sent again at once after its connection closed unread.
    closed_once: bool,
    /// Re-establishments of its session it caused or waited for.
    pub(super) resumes: u32,
}

impl Attempts {
    /// It waited in the hold before its first attempt, and goes now.
    pub(super) fn held_before_sending(&mut self) {
        self.held_first = true;
    }

    /// Released from the hold after an attempt: the next attempt is a replay.
    pub(super) fn released(&mut self) {
        self.replay_due = true;
    }

    /// An attempt goes out: whether it is a replay (once per release).
    pub(super) fn sending(&mut self) -> bool {
        let replay = std::mem::take(&mut self.replay_due);
        self.replayed |= replay;
        replay
    }

    /// Its connection closed before the upstream read it (most often a keep-alive race with a
    /// healthy server): once at once on another connection, if its body can go again; after
    /// that, an outage.
    pub(super) fn closed_unread(&mut self, replayable: bool) -> bool {
        replayable && !std::mem::replace(&mut self.closed_once, true)
    }

    /// Sent again at once after a failure that may have reached the application: only a
    /// request `safe` to run twice, and only the first time.
    pub(super) fn once_more(&mut self, safe: bool) -> bool {
        if !safe || self.breaks > 0 {
            return false;
        }
        self.breaks = 1;
        true
    }

    /// The upstream broke after the request may have reached the application (a reset, a close
    /// before the answer). Safe to run twice: at once the first time, from the hold (when
    /// `holding`) after that, a 502 at the [`MAX_BREAKS`]th. Not safe: a 502.
    pub(super) fn broke(&mut self, safe: bool, holding: bool) -> AfterBreak {
        if self.once_more(safe) {
            return AfterBreak::SendNow;
        }
        if safe && holding && self.breaks + 1 < MAX_BREAKS {
            self.breaks += 1;
            return AfterBreak::Hold;
        }
        AfterBreak::Fail
    }

    /// Breaks so far (for the log).
    pub(super) fn breaks(&self) -> u8 {
        self.breaks
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use AfterBreak::*;

    #[test]
    fn a_safe_request_goes_at_once_then_from_the_hold_then_fails() {
        let mut a = Attempts::default();
        assert_eq!(a.broke(true, true), SendNow);
        assert_eq!(a.broke(true, true), Hold);
        assert_eq!(a.broke(true, true), Fail, "the third break");
        assert_eq!(a.breaks(), 2);
    }

    #[test]
    fn without_holding_a_safe_request_goes_once_more_at_most() {
        let mut a = Attempts::default();
        assert_eq!(a.broke(true, false), SendNow);
        assert_eq!(a.broke(true, false), Fail);
    }

    #[test]
    fn a_request_not_safe_to_run_twice_never_goes_again() {
        let mut a = Attempts::default();
        assert_eq!(a.broke(false, true), Fail);
        assert!(!a.once_more(false));
        assert_eq!(a.breaks(), 0);
    }

    #[test]
    fn once_more_is_shared_with_the_break_budget() {
        // An unanswered stream's "once more" (holding off) uses the first break.
        let mut a = Attempts::default();
        assert!(a.once_more(true));
        assert!(!a.once_more(true));
        assert_eq!(a.broke(true, true), Hold);
        assert_eq!(a.broke(true, true), Fail);
    }

    #[test]
    fn a_connection_closed_unread_goes_again_once_and_only_with_its_body() {
        let mut a = Attempts::default();
        assert!(!a.closed_unread(false), "no body to send again");
        assert!(a.closed_unread(true));
        assert!(!a.closed_unread(true), "the next such close is an outage");
    }

    #[test]
    fn the_path_names_what_mattered_most() {
        let mut a = Attempts::default();
        assert_eq!(a.path(), Path::Passed);
        a.held_before_sending();
        assert!(
            !a.sending(),
            "the first attempt after waiting is not a replay"
        );
        assert_eq!(a.path(), Path::Held);
        a.released();
        assert_eq!(a.path(), Path::Held, "a replay counts once it goes out");
        assert!(a.sending());
        assert!(!a.sending(), "once per release");
        assert_eq!(a.path(), Path::Replayed);
        a.resumes += 1;
        assert_eq!(a.path(), Path::Resumed);
    }
}
