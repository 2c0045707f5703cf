//! `[sessions]`: carrying MCP sessions across restarts, of the backend and of holdfast itself.
//!
//! The keys that seal session tokens (`sessions.key_file`) are read here, during validation, so
//! `check-config` reports a key file that does not load and the proxy starts with what was
//! checked. [`parse_session_keys`] is also what the running proxy re-reads the file with.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::defaults;
use super::validate::Validator;

/// `[sessions]` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSessions {
    /// Re-establish a session the restarted server forgot.
    pub resume: bool,
    /// Most sessions tracked.
    pub max_tracked: usize,
    /// Largest `initialize` body recorded.
    pub max_initialize_bytes: usize,
    /// Most recorded bytes over all sessions.
    pub max_recorded_bytes: usize,
    /// Idle time after which a session is forgotten.
    #[serde(deserialize_with = "super::duration::secs")]
    pub idle_timeout_secs: f64,
    /// The keys that seal session tokens: one per line, 64 hex characters (32 bytes).
    pub key_file: Option<PathBuf>,
    /// Oldest session token used to re-establish its session.
    #[serde(deserialize_with = "super::duration::secs")]
    pub token_max_age_secs: f64,
    /// A Redis or Valkey server every replica shares (`redis://host:port/db`).
    pub store: Option<String>,
    /// The deployment's name, bound into every token (its AAD): a token sealed for one
    /// deployment does not open at another that shares a key. Empty: unnamed.
    pub deployment: String,
    /// What a deploy's changes do to the sessions carried through it.
    pub on_change: super::RawOnChange,
}

impl Default for RawSessions {
    fn default() -> Self {
        Self {
            resume: defaults::SESSIONS_RESUME,
            max_tracked: defaults::SESSIONS_MAX_TRACKED,
            max_initialize_bytes: defaults::SESSIONS_MAX_INITIALIZE_BYTES,
            max_recorded_bytes: defaults::SESSIONS_MAX_RECORDED_BYTES,
            idle_timeout_secs: defaults::SESSIONS_IDLE_TIMEOUT_SECS,
            key_file: None,
            token_max_age_secs: defaults::SESSIONS_TOKEN_MAX_AGE_SECS,
            store: None,
            deployment: String::new(),
            on_change: super::RawOnChange::default(),
        }
    }
}

/// Validated `[sessions]`.
#[derive(Debug, Clone)]
pub struct Sessions {
    /// Re-establish a session the restarted server forgot.
    pub resume: bool,
    /// Most sessions tracked.
    pub max_tracked: usize,
    /// Largest `initialize` body recorded.
    pub max_initialize_bytes: usize,
    /// Most recorded bytes over all sessions.
    pub max_recorded_bytes: usize,
    /// Idle time after which a session is forgotten.
    pub idle_timeout: Duration,
    /// The keys read from `key_file` (none without one: a random key per process).
    pub keys: SessionKeys,
    /// Oldest session token used to re-establish its session.
    pub token_max_age: Duration,
    /// The shared store's URL (`redis://...`).
    pub store: Option<String>,
    /// Over TLS (`rediss://`): the trust and client certificate of `[client]` (`ca`, `cert`,
    /// `key`), as PEM, read at validation; none for a plain store.
    pub store_tls: Option<StoreTls>,
    /// What to warn of at start about `key_file`: other users of the host may read it.
    pub key_file_warning: Option<String>,
    /// What a deploy's changes do to the sessions carried through it.
    pub on_change: super::OnChange,
}

/// One key: 32 bytes. Its `Debug` never shows it, and it is wiped when dropped (a rotated-out
/// key must not linger in freed memory).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKey(pub [u8; 32]);

impl Drop for SessionKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// What a store over TLS is trusted and presented with: `client.ca` (else the system's roots)
/// and `client.cert`/`client.key` (mTLS), the same as the upstream's.
#[derive(Clone, Default)]
pub struct StoreTls {
    /// PEM CA bundle, `client.ca`.
    pub ca: Option<Vec<u8>>,
    /// PEM certificate chain and key, `client.cert` and `client.key`.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl super::validate::Validator<'_> {
    /// For a store over TLS: the PEM files of `[client]` it trusts and presents.
    pub(super) fn store_tls(&mut self, raw: &super::RawClient) -> Option<StoreTls> {
        let mut read = |key: &str, path: &Option<String>| -> Option<Vec<u8>> {
            let path = path.as_ref()?;
            std::fs::read(path)
                .map_err(|e| self.fail::<()>(key, format!("cannot read {path}: {e}")))
                .ok()
        };
        let ca = read("client.ca", &raw.ca);
        let cert = read("client.cert", &raw.cert);
        let key = read("client.key", &raw.key);
        Some(StoreTls {
            ca,
            client: cert.zip(key),
        })
    }
}

/// Whether the store URL asks for TLS.
pub fn store_is_tls(url: &str) -> bool {
    url.starts_with("rediss://") || url.starts_with("valkeys://")
}

/// `sessions.key_file` and the keys read from it: the first seals, every one opens.
#[derive(Debug, Clone, Default)]
pub struct SessionKeys {
    /// Where they were read from, and are re-read from when the file changes.
    pub file: Option<PathBuf>,
    /// The keys, in the file's order; empty without a file.
    pub keys: Vec<SessionKey>,
    /// `sessions.deployment`: bound into every token's sealing.
    pub deployment: String,
}

/// Most keys in one file: rotation needs two or three; more is a mistake (and every key is
/// tried on a token from another holdfast).
const MAX_KEYS: usize = 16;

/// Reads a key file's text: one key per line as 64 hexadecimal characters (`openssl rand -hex
/// 32`); blank lines and lines starting with `#` are skipped. At least one key.
pub fn parse_session_keys(text: &str) -> Result<Vec<SessionKey>, String> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = hex32(line).ok_or_else(|| {
            format!(
                "line {}: expected 64 hexadecimal characters (32 bytes, as `openssl rand -hex \
                 32` prints), got {} characters",
                n + 1,
                line.len()
            )
        })?;
        let key = SessionKey(key);
        if key.0.iter().all(|&b| b == key.0[0]) {
            return Err(format!(
                "line {}: every byte is the same: not a random key",
                n + 1
            ));
        }
        keys.push(key);
    }
    if keys.is_empty() {
        return Err("no key in the file (one per line, 64 hexadecimal characters)".into());
    }
    if keys.len() > MAX_KEYS {
        return Err(format!(
            "{} keys; at most {MAX_KEYS} (the first seals, the rest are kept for rotation)",
            keys.len()
        ));
    }
    Ok(keys)
}

fn hex32(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut key = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        key[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(key)
}

/// Reads and parses `path`.
pub(crate) fn read_session_keys(path: &Path) -> Result<Vec<SessionKey>, String> {
    // Wiped when dropped: the file's text is the keys in hex.
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    );
    parse_session_keys(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// What the key file's mode says (Unix): whoever may write it chooses the key that seals every
/// session token, so a file the group or the world may write is refused; one they may read
/// gives away that key, which is worth a warning, not a refusal (a Kubernetes Secret's files
/// are 0644 unless the volume's `defaultMode` says otherwise). SECURITY.md asks for 0400.
/// `Ok(Some(warning))` for a readable one.
#[cfg(unix)]
pub fn check_key_file_mode(path: &Path) -> Result<Option<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: the group or every user may write it, and so choose the \
             key that seals session tokens; make it readable by holdfast alone (chmod 0400)",
            path.display()
        ));
    }
    Ok((mode & 0o044 != 0).then(|| {
        format!(
            "{} has mode {mode:04o}: the group or every user may read the key that seals \
             session tokens; make it readable by holdfast alone (chmod 0400, or the Secret \
             volume's defaultMode)",
            path.display()
        )
    }))
}

#[cfg(not(unix))]
pub fn check_key_file_mode(_path: &Path) -> Result<Option<String>, String> {
    Ok(None)
}

/// `url` with any password in it (`redis://user:secret@host`, `redis://:secret@host`) replaced by
/// `***`, for what is printed or logged: `check-config`'s output ends up in CI logs and tickets.
pub fn redact_store_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    if !userinfo.contains(':') {
        return url.to_owned();
    }
    format!("{scheme}://{user}:***@{host}{path}")
}

/// A store URL holdfast can use: `redis://` (or `valkey://`; `rediss://`, `valkeys://` over
/// TLS), a host, an optional port and database number. The connection is made on first use, not here.
/// What is said of a URL never shows its password (a scheme written `Redis://` included).
fn check_store_url(url: &str) -> Result<(), String> {
    let shown = redact_store_url(url);
    let rest = ["redis://", "valkey://", "rediss://", "valkeys://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .ok_or_else(|| {
            format!(
                "expected a URL such as redis://valkey:6379/0 (redis:// or valkey://, in lower \
                 case; rediss:// or valkeys:// for TLS), got `{shown}`"
            )
        })?;
    // The host after any `user:password@`: `redis://u:pw@/0` names none.
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("no host in `{shown}`"));
    }
    Ok(())
}

impl Validator<'_> {
    /// Checks `[sessions]` and reads its key file; `None` when a problem was recorded.
    pub(super) fn sessions(&mut self, raw: &RawSessions) -> Option<Sessions> {
        let idle = self.secs("sessions.idle_timeout_secs", raw.idle_timeout_secs);
        let max_age = self.secs("sessions.token_max_age_secs", raw.token_max_age_secs);
        let on_change = self.on_change(&raw.on_change);
        let mut ok = idle.is_some() && max_age.is_some() && on_change.is_some();
        if raw.max_tracked == 0 {
            ok = false;
            self.fail::<()>("sessions.max_tracked", "must be at least 1".into());
        }
        if raw.max_initialize_bytes == 0 {
            ok = false;
            self.fail::<()>("sessions.max_initialize_bytes", "must be at least 1".into());
        }
        if raw.max_recorded_bytes < raw.max_initialize_bytes {
            ok = false;
            self.fail::<()>(
                "sessions.max_recorded_bytes",
                format!(
                    "must not be below sessions.max_initialize_bytes ({}): no session could \
                     ever be tracked",
                    raw.max_initialize_bytes
                ),
            );
        }
        let mut key_file_warning = None;
        let keys = match &raw.key_file {
            None => SessionKeys::default(),
            Some(path) => match check_key_file_mode(path).and_then(|warning| {
                key_file_warning = warning;
                read_session_keys(path)
            }) {
                Ok(keys) => SessionKeys {
                    file: Some(path.clone()),
                    keys,
                    deployment: raw.deployment.clone(),
                },
                Err(e) => {
                    ok = false;
                    self.fail::<()>("sessions.key_file", e);
                    SessionKeys::default()
                }
            },
        };
        let name_ok =
            raw.deployment.len() <= 128 && raw.deployment.bytes().all(|b| b.is_ascii_graphic());
        if !name_ok {
            ok = false;
            self.fail::<()>(
                "sessions.deployment",
                "must be at most 128 visible ASCII characters (no spaces)".into(),
            );
        }
        if let Some(url) = &raw.store {
            if let Err(e) = check_store_url(url) {
                ok = false;
                self.fail::<()>("sessions.store", e);
            } else if raw.key_file.is_none() {
                ok = false;
                self.fail::<()>(
                    "sessions.store",
                    "needs sessions.key_file: without a key every replica shares, no other \
                     holdfast opens this one's session ids, and there is nothing to share"
                        .into(),
                );
            }
        }
        ok.then(|| Sessions {
            resume: raw.resume,
            max_tracked: raw.max_tracked,
            max_initialize_bytes: raw.max_initialize_bytes,
            max_recorded_bytes: raw.max_recorded_bytes,
            idle_timeout: idle.expect("checked"),
            keys,
            token_max_age: max_age.expect("checked"),
            store: raw.store.clone(),
            // Filled by the validation of `[client]`, which knows its files: `store_tls`.
            store_tls: None,
            key_file_warning,
            on_change: on_change.expect("checked"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";

    #[test]
    fn keys_one_per_line_with_comments_and_blank_lines() {
        let text = format!(
            "# rotated 2026-12-01\n{A}\n\n  {}  \n",
            "f".repeat(63) + "e"
        );
        let keys = parse_session_keys(&text).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0[0], 0x00);
        assert_eq!(keys[0].0[1], 0x11);
        assert_eq!(keys[0].0[31], 0xff);
        assert_eq!(format!("{:?}", keys[0]), "SessionKey(..)");
    }

    #[test]
    fn what_is_not_a_key_is_refused_with_its_line() {
        for (text, says) in [
            ("", "no key"),
            ("# only a comment\n", "no key"),
            (&A[..63], "line 1: expected 64"),
            (&format!("{A}\n{A}0"), "line 2: expected 64"),
            (&format!("{}g", &A[..63]), "line 1: expected 64"),
            (&"0".repeat(64), "line 1: every byte is the same"),
            (&format!("{A}\n").repeat(17), "17 keys"),
        ] {
            let err = parse_session_keys(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}

#[cfg(test)]
mod redact_tests {
    use super::{check_store_url, redact_store_url};

    #[test]
    fn a_refused_store_url_is_said_without_its_password() {
        // A scheme in capitals is refused, and its password not printed with it.
        let err = check_store_url("Redis://holdfast:s3cret@redis:6379/0").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("Redis://holdfast:***@redis:6379/0"), "{err}");
        // User info with no host after it names no store.
        let err = check_store_url("redis://u:s3cret@/0").unwrap_err();
        assert!(err.contains("no host") && !err.contains("s3cret"), "{err}");
        assert!(check_store_url("redis://u:pw@:6379/0").is_err());
        assert!(check_store_url("redis://u:pw@redis:6379/0").is_ok());
        assert!(check_store_url("redis://redis").is_ok());
    }

    #[test]
    fn a_stores_password_is_never_printed() {
        assert_eq!(
            redact_store_url("redis://:pw@redis:6379/0"),
            "redis://:***@redis:6379/0"
        );
        assert_eq!(
            redact_store_url("redis://holdfast:s3cr:et@redis/0"),
            "redis://holdfast:***@redis/0"
        );
        // Nothing secret: unchanged.
        assert_eq!(
            redact_store_url("redis://redis:6379/0"),
            "redis://redis:6379/0"
        );
        assert_eq!(
            redact_store_url("redis://user@redis/0"),
            "redis://user@redis/0"
        );
        // An @ in the path is no user info.
        assert_eq!(
            redact_store_url("redis://r/0?x=a:b@c"),
            "redis://r/0?x=a:b@c"
        );
    }
}

#[cfg(test)]
mod wipe_tests {
    use super::SessionKey;

    /// A dropped key leaves no copy of itself where it lay.
    #[test]
    fn a_dropped_key_is_wiped() {
        let mut slot = std::mem::ManuallyDrop::new(SessionKey([0x5a; 32]));
        // SAFETY: `slot` is dropped once here and never used as a key again; its bytes, a plain
        // array, stay readable in the `ManuallyDrop` that owns the storage.
        unsafe { std::mem::ManuallyDrop::drop(&mut slot) };
        assert_eq!(slot.0, [0u8; 32]);
    }
}
