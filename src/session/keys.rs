//! The keyring session tokens are sealed and opened with, and the task that re-reads
//! `sessions.key_file` when it changes (a rotated Kubernetes Secret, a new first line).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::token::Keyring;
use crate::config::{parse_session_keys, SessionKeys};

/// How often the key file is read to see whether it changed: cheap (one small file), and a
/// mounted Secret takes up to a minute or so to change anyway.
pub const KEY_RELOAD_EVERY: Duration = Duration::from_secs(5);

/// The current keyring, swapped whole when the key file changes.
pub struct Keys {
    ring: RwLock<Arc<Keyring>>,
    /// Bumped with every change of the keys: a session tracked under older keys is checked
    /// again at its next use ([`super::Table::lookup`]).
    generation: std::sync::atomic::AtomicU64,
    file: Option<PathBuf>,
    /// `sessions.deployment`, every keyring's binding (fixed while holdfast runs).
    deployment: String,
    /// The keys were configured (else a random one of this process).
    configured: bool,
}

impl Keys {
    /// The keys read at validation (or given by the demo); a random one without any.
    pub fn new(cfg: &SessionKeys) -> Keys {
        let configured = !cfg.keys.is_empty();
        let ring = if configured {
            Keyring::new(&cfg.keys).for_deployment(&cfg.deployment)
        } else {
            Keyring::random()
        };
        Keys {
            ring: RwLock::new(Arc::new(ring)),
            generation: std::sync::atomic::AtomicU64::new(0),
            file: cfg.file.clone(),
            deployment: cfg.deployment.clone(),
            configured,
        }
    }

    /// The keyring now.
    pub fn current(&self) -> Arc<Keyring> {
        self.ring.read().expect("keys lock").clone()
    }

    /// Whether the keys were configured (else they die with the process).
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// Replaces the keys with `keys` (a reload's, read from the same file).
    pub fn replace(&self, keys: &[crate::config::SessionKey]) {
        self.swap(Keyring::new(keys).for_deployment(&self.deployment));
    }

    fn swap(&self, ring: Keyring) {
        *self.ring.write().expect("keys lock") = Arc::new(ring);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Which keys are in use: it changes with every reload of them.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Replaces the keys with those in `text` (a key file's content); the number of keys, or
    /// why `text` holds none (the keys stay as they were).
    pub fn reload(&self, text: &str) -> Result<usize, String> {
        let keys = parse_session_keys(text)?;
        self.swap(Keyring::new(&keys).for_deployment(&self.deployment));
        Ok(keys.len())
    }
}

/// Polls `sessions.key_file` every [`KEY_RELOAD_EVERY`] and swaps changed, valid keys in, as
/// the TLS reloader does certificates. `None` without a key file.
pub fn spawn_key_reloader(keys: Arc<Keys>) -> Option<JoinHandle<()>> {
    let file = keys.file.clone()?;
    Some(tokio::spawn(async move {
        // The content last tried, loaded or not: an unchanged file is not parsed again, and a
        // bad one is reported once, not on every poll. None at first: the first read is applied
        // quietly (the keys validation read, unless the file changed since).
        // Both wiped when dropped: the file's text is the keys in hex.
        let mut tried: Option<zeroize::Zeroizing<String>> = None;
        let mut last_read_error: Option<String> = None;
        let mut ticks = tokio::time::interval(KEY_RELOAD_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let text = match tokio::fs::read_to_string(&file).await {
                Ok(text) => zeroize::Zeroizing::new(text),
                Err(e) => {
                    let message = e.to_string();
                    if last_read_error.as_deref() != Some(message.as_str()) {
                        tracing::error!(
                            file = %file.display(),
                            error = %message,
                            "cannot read sessions.key_file; keeping the session keys in use"
                        );
                        last_read_error = Some(message);
                    }
                    continue;
                }
            };
            // The mode start-up and a reload check: a file others may write is never loaded
            // (whoever writes it would choose the key). Said once; nothing is taken as tried,
            // so the same text loads once the mode is fixed.
            if let Err(refused) = crate::config::check_key_file_mode(&file) {
                if last_read_error.as_deref() != Some(refused.as_str()) {
                    tracing::error!(
                        error = %refused,
                        "the changed sessions.key_file is not loaded; keeping the session keys in use"
                    );
                    last_read_error = Some(refused);
                }
                // The file's keys, once it loads, are news: said even if it is the first read.
                tried.get_or_insert_with(Default::default);
                continue;
            }
            last_read_error = None;
            if tried.as_ref().map(|t| t.as_str()) == Some(text.as_str()) {
                continue;
            }
            match keys.reload(&text) {
                Ok(n) if tried.is_some() => tracing::info!(
                    file = %file.display(),
                    keys = n,
                    "session keys reloaded: new sessions are sealed with the first, every one opens"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(
                    file = %file.display(),
                    error = %e,
                    "the changed sessions.key_file does not load; keeping the session keys in use"
                ),
            }
            tried = Some(text);
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionKey;
    use crate::session::token::{Contents, Refused};

    fn contents() -> Contents {
        Contents {
            issued: 1,
            upstream_id: http::HeaderValue::from_static("u-1"),
            protocol_version: None,
            endpoint: "/mcp".into(),
            initialize: bytes::Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn a_reload_swaps_the_keys_and_a_bad_file_keeps_them() {
        let first = "1".repeat(63) + "2";
        let keys = Keys::new(&SessionKeys {
            file: Some("/nonexistent".into()),
            keys: crate::config::parse_session_keys(&first).unwrap(),
            deployment: String::new(),
        });
        let old = keys.current().seal(&contents()).unwrap();
        let second = "3".repeat(63) + "4";
        assert_eq!(keys.reload(&format!("{second}\n{first}\n")), Ok(2));
        let new = keys.current().seal(&contents()).unwrap();
        assert!(
            keys.current().open(old.as_bytes()).is_ok(),
            "the old key opens"
        );
        assert!(keys.reload("not a key").is_err());
        assert!(
            keys.current().open(new.as_bytes()).is_ok(),
            "kept after a bad file"
        );
        assert_eq!(keys.reload(&second), Ok(1));
        assert_eq!(keys.current().open(old.as_bytes()), Err(Refused::Unopened));
        // Debug of the config never shows a key.
        let key = SessionKey([7; 32]);
        assert!(!format!("{key:?}").contains('7'));
    }

    #[test]
    fn without_a_file_a_random_key_per_process() {
        let a = Keys::new(&SessionKeys::default());
        let b = Keys::new(&SessionKeys::default());
        assert!(!a.configured());
        let token = a.current().seal(&contents()).unwrap();
        assert!(a.current().open(token.as_bytes()).is_ok());
        assert_eq!(b.current().open(token.as_bytes()), Err(Refused::Unopened));
    }
}
