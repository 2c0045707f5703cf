//! The optional shared store (`sessions.store`: a Redis or Valkey server) for what every replica
//! should know of a session beyond its token: what was set on it after its initialize
//! (`logging/setLevel`, live `resources/subscribe`s) and whether its client ended it.
//!
//! Read only when a session is re-established, written when a request changed that state or a
//! DELETE ended it: nothing on the path of an ordinary request. A session is named by its
//! token's nonce (random, unique per token), never by the token or the upstream's id. A store
//! that does not answer costs the request nothing but its timeout (1 s): the local record is
//! used, and the failure is counted and logged.
//!
//! Whoever can write to the store must not be able to make holdfast replay subscriptions with a
//! client's credentials, nor end sessions: every value holdfast writes is signed (HMAC-SHA256
//! under a key derived from the session key, bound to the session's nonce and to what the value
//! is), and a value no key signed is ignored as if absent.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};

use super::rpc::StateChange;
use super::token::Keyring;

/// Longest a store command may take, connecting included.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// A session's shared state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedState {
    /// The last `logging/setLevel` that succeeded.
    pub level: Option<String>,
    /// Resource URIs subscribed to and not unsubscribed.
    pub subscriptions: Vec<String>,
}

impl SharedState {
    /// What re-establishing the session sets again, in order.
    pub fn changes(&self) -> Vec<StateChange> {
        let level = self.level.iter().cloned().map(StateChange::SetLevel);
        let subscriptions = self
            .subscriptions
            .iter()
            .cloned()
            .map(StateChange::Subscribe);
        level.chain(subscriptions).collect()
    }
}

/// What the store knows of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shared {
    /// Its state, if any replica recorded some.
    pub state: Option<SharedState>,
    /// Its client ended it.
    pub ended: bool,
}

/// A store command that failed.
#[derive(Debug, thiserror::Error)]
#[error("the session store did not answer as expected: {0}")]
pub struct StoreError(#[from] redis::RedisError);

/// The connection to the store (one multiplexed connection, re-established by itself).
pub struct SharedStore {
    conn: ConnectionManager,
    /// How long a session's state is kept after it was last written (`sessions.idle_timeout`).
    state_ttl: u64,
    /// How long an ended session's mark is kept (`sessions.token_max_age`: no older token is
    /// re-established anyway).
    ended_ttl: u64,
}

impl SharedStore {
    /// A store at `url` (`redis://host:port/db`; `rediss://` over TLS, trusting and presenting
    /// `tls`), connected on first use. Must run inside the runtime.
    pub fn new(
        url: &str,
        idle: Duration,
        max_age: Duration,
        tls: Option<&crate::config::StoreTls>,
    ) -> Result<SharedStore, StoreError> {
        let client = match tls {
            Some(tls) if crate::config::store_is_tls(url) => {
                // The redis crate builds its rustls configuration with the process's default
                // provider: holdfast's own (ring), installed unless one already is.
                let _ = rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: tls
                            .client
                            .as_ref()
                            .map(|(cert, key)| redis::ClientTlsConfig {
                                client_cert: cert.clone(),
                                client_key: key.clone(),
                            }),
                        root_cert: tls.ca.clone(),
                    },
                )?
            }
            _ => redis::Client::open(url)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(STORE_TIMEOUT))
            .set_response_timeout(Some(STORE_TIMEOUT))
            .set_number_of_retries(1);
        Ok(SharedStore {
            conn: client.get_connection_manager_lazy(config)?,
            state_ttl: idle.as_secs().max(1),
            ended_ttl: max_age.as_secs().max(1),
        })
    }

    /// What the store knows of the session sealed with `nonce`, as far as `keys` signed it.
    pub async fn load(&self, nonce: &[u8; 12], keys: &Keyring) -> Result<Shared, StoreError> {
        let (state, ended): (Option<String>, Option<String>) = redis::cmd("MGET")
            .arg(state_key(nonce))
            .arg(ended_key(nonce))
            .query_async(&mut self.conn.clone())
            .await?;
        let state = state.and_then(|v| {
            let text = opened(keys, nonce, STATE, &v);
            if text.is_none() {
                tracing::warn!(
                    "a session state in sessions.store is not signed by any session key: ignored"
                );
            }
            // A value that does not parse (another version's) is no state either.
            text.and_then(|t| serde_json::from_str(t).ok())
        });
        let ended = ended.is_some_and(|v| {
            let signed = opened(keys, nonce, ENDED, &v).is_some();
            if !signed {
                tracing::warn!(
                    "a session end in sessions.store is not signed by any session key: ignored"
                );
            }
            signed
        });
        Ok(Shared { state, ended })
    }

    /// Records the session's state, signed.
    pub async fn save(
        &self,
        nonce: &[u8; 12],
        state: &SharedState,
        keys: &Keyring,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(state).expect("plain data serializes");
        redis::cmd("SET")
            .arg(state_key(nonce))
            .arg(signed(keys, nonce, STATE, &text))
            .arg("EX")
            .arg(self.state_ttl)
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Marks the session ended (signed), and drops its state.
    pub async fn end(&self, nonce: &[u8; 12], keys: &Keyring) -> Result<(), StoreError> {
        redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(ended_key(nonce))
            .arg(signed(keys, nonce, ENDED, ""))
            .arg("EX")
            .arg(self.ended_ttl)
            .ignore()
            .cmd("DEL")
            .arg(state_key(nonce))
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

/// What a signed value is: part of what its tag covers, so one kind is never taken for another.
const STATE: &str = "state";
const ENDED: &str = "ended";

/// What the tag of a value covers: its kind, the session's nonce and the text.
fn signed_bytes(nonce: &[u8; 12], kind: &str, text: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(kind.len() + 13 + text.len());
    data.extend_from_slice(kind.as_bytes());
    data.push(0);
    data.extend_from_slice(nonce);
    data.extend_from_slice(text.as_bytes());
    data
}

/// `<tag in hex>.<text>`: what is written.
fn signed(keys: &Keyring, nonce: &[u8; 12], kind: &str, text: &str) -> String {
    let tag = keys.sign(&signed_bytes(nonce, kind, text));
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("{tag}.{text}")
}

/// The text of a value read, when one of `keys` signed it for this session and kind.
fn opened<'a>(keys: &Keyring, nonce: &[u8; 12], kind: &str, value: &'a str) -> Option<&'a str> {
    let (tag, text) = value.split_once('.')?;
    if tag.len() % 2 != 0 {
        return None;
    }
    let tag: Vec<u8> = (0..tag.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tag.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    keys.verify(&signed_bytes(nonce, kind, text), &tag)
        .then_some(text)
}

fn hex(nonce: &[u8; 12]) -> String {
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

fn state_key(nonce: &[u8; 12]) -> String {
    format!("holdfast:session:{}", hex(nonce))
}

fn ended_key(nonce: &[u8; 12]) -> String {
    format!("holdfast:ended:{}", hex(nonce))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_nonce_only() {
        let nonce = [0xab; 12];
        assert_eq!(
            state_key(&nonce),
            format!("holdfast:session:{}", "ab".repeat(12))
        );
        assert_eq!(
            ended_key(&nonce),
            format!("holdfast:ended:{}", "ab".repeat(12))
        );
    }

    #[test]
    fn only_what_a_session_key_signed_for_this_session_and_kind_is_read() {
        let key = |b: u8| crate::config::SessionKey([b; 32]);
        let ring = Keyring::new(&[key(1)]);
        let nonce = [7u8; 12];
        let value = signed(
            &ring,
            &nonce,
            STATE,
            r#"{"level":"debug","subscriptions":[]}"#,
        );
        assert_eq!(
            opened(&ring, &nonce, STATE, &value),
            Some(r#"{"level":"debug","subscriptions":[]}"#)
        );
        // After a rotation the old key still verifies; another deployment's key does not.
        assert!(opened(&Keyring::new(&[key(2), key(1)]), &nonce, STATE, &value).is_some());
        assert!(opened(&Keyring::new(&[key(2)]), &nonce, STATE, &value).is_none());
        // Another session's value, another kind, an altered text, unsigned or bare values.
        assert!(opened(&ring, &[8u8; 12], STATE, &value).is_none());
        assert!(opened(&ring, &nonce, ENDED, &value).is_none());
        let altered = value.replace("debug", "error");
        assert!(opened(&ring, &nonce, STATE, &altered).is_none());
        for forged in [r#"{"level":"debug"}"#, "1", "", "zz.x", "."] {
            assert!(opened(&ring, &nonce, STATE, forged).is_none(), "{forged}");
        }
        let end = signed(&ring, &nonce, ENDED, "");
        assert_eq!(opened(&ring, &nonce, ENDED, &end), Some(""));
    }

    #[test]
    fn the_state_sets_the_level_then_the_subscriptions() {
        let state = SharedState {
            level: Some("debug".into()),
            subscriptions: vec!["file:///a".into()],
        };
        assert_eq!(
            state.changes(),
            vec![
                StateChange::SetLevel("debug".into()),
                StateChange::Subscribe("file:///a".into())
            ]
        );
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<SharedState>(&text).unwrap(), state);
    }
}
