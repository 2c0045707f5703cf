//! The session settings a reload may change, read on every request without a lock, and what it
//! cannot change while holdfast runs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::config;

/// `[sessions]` as it is now: swapped field by field by a reload.
pub(super) struct Live {
    resume: AtomicBool,
    max_tracked: AtomicUsize,
    max_initialize_bytes: AtomicUsize,
    max_recorded_bytes: AtomicUsize,
    idle_timeout_ms: AtomicU64,
    token_max_age_ms: AtomicU64,
}

/// Milliseconds of `d`, saturated.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Live {
    pub(super) fn new(s: &config::Sessions) -> Live {
        Live {
            resume: AtomicBool::new(s.resume),
            max_tracked: AtomicUsize::new(s.max_tracked),
            max_initialize_bytes: AtomicUsize::new(s.max_initialize_bytes),
            max_recorded_bytes: AtomicUsize::new(s.max_recorded_bytes),
            idle_timeout_ms: AtomicU64::new(ms(s.idle_timeout)),
            token_max_age_ms: AtomicU64::new(ms(s.token_max_age)),
        }
    }

    /// Takes `s`'s values. Sessions already tracked are judged by the new bounds from their
    /// next use (an idle timeout made shorter forgets the idle ones at their next lookup).
    pub(super) fn set(&self, s: &config::Sessions) {
        self.resume.store(s.resume, Ordering::Release);
        self.max_tracked.store(s.max_tracked, Ordering::Release);
        self.max_initialize_bytes
            .store(s.max_initialize_bytes, Ordering::Release);
        self.max_recorded_bytes
            .store(s.max_recorded_bytes, Ordering::Release);
        self.idle_timeout_ms
            .store(ms(s.idle_timeout), Ordering::Release);
        self.token_max_age_ms
            .store(ms(s.token_max_age), Ordering::Release);
    }

    pub(super) fn resume(&self) -> bool {
        self.resume.load(Ordering::Acquire)
    }

    pub(super) fn max_tracked(&self) -> usize {
        self.max_tracked.load(Ordering::Acquire)
    }

    pub(super) fn max_initialize_bytes(&self) -> usize {
        self.max_initialize_bytes.load(Ordering::Acquire)
    }

    pub(super) fn max_recorded_bytes(&self) -> usize {
        self.max_recorded_bytes.load(Ordering::Acquire)
    }

    pub(super) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.load(Ordering::Acquire))
    }

    pub(super) fn token_max_age(&self) -> Duration {
        Duration::from_millis(self.token_max_age_ms.load(Ordering::Acquire))
    }
}

/// The `[sessions]` settings a reload cannot change, by key: which store and which key file
/// sessions are kept in and sealed with (a reload re-reads the key file's keys, not its path).
pub(super) fn fixed_changes(was: &config::Sessions, now: &config::Sessions) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if was.keys.file != now.keys.file {
        changed.push("sessions.key_file");
    }
    if was.store != now.store {
        changed.push("sessions.store");
    }
    if was.keys.deployment != now.keys.deployment {
        changed.push("sessions.deployment");
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> config::Sessions {
        config::Sessions {
            resume: true,
            max_tracked: 10,
            max_initialize_bytes: 100,
            max_recorded_bytes: 1000,
            idle_timeout: Duration::from_secs(60),
            keys: config::SessionKeys::default(),
            token_max_age: Duration::from_secs(600),
            store: None,
            store_tls: None,
            key_file_warning: None,
            on_change: config::OnChange::default(),
        }
    }

    #[test]
    fn a_reload_takes_every_live_value() {
        let live = Live::new(&sessions());
        let mut next = sessions();
        next.resume = false;
        next.max_tracked = 20;
        next.max_initialize_bytes = 200;
        next.max_recorded_bytes = 2000;
        next.idle_timeout = Duration::from_millis(1500);
        next.token_max_age = Duration::from_secs(1);
        live.set(&next);
        assert!(!live.resume());
        assert_eq!(
            (
                live.max_tracked(),
                live.max_initialize_bytes(),
                live.max_recorded_bytes()
            ),
            (20, 200, 2000)
        );
        assert_eq!(live.idle_timeout(), Duration::from_millis(1500));
        assert_eq!(live.token_max_age(), Duration::from_secs(1));
    }

    #[test]
    fn the_key_file_and_the_store_are_fixed() {
        let was = sessions();
        assert!(fixed_changes(&was, &sessions()).is_empty());
        let mut now = sessions();
        now.keys.file = Some("/run/keys".into());
        now.store = Some("redis://r:6379/0".into());
        assert_eq!(
            fixed_changes(&was, &now),
            ["sessions.key_file", "sessions.store"]
        );
    }
}
