//! The optional shared store (`sessions.store`: a Redis or Valkey server) for what every replica
//! should know of a session beyond its token: what was set on it after its initialize
//! (`logging/setLevel`, live `resources/subscribe`s) and whether its client ended it.
//!
//! Read only when a session is re-established, written when a request changed that state or a
//! DELETE ended it: nothing on the path of an ordinary request. A session is named by its
//! token's nonce (random, unique per token), never by the token or the upstream's id. A store
//! that does not answer costs the request nothing but its timeout (1 s): the local record is
//! used, and the failure is counted and logged.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};

use super::rpc::StateChange;

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
    /// A store at `url` (`redis://host:port/db`), connected on first use. Must run inside the
    /// runtime.
    pub fn new(url: &str, idle: Duration, max_age: Duration) -> Result<SharedStore, StoreError> {
        let client = redis::Client::open(url)?;
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

    /// What the store knows of the session sealed with `nonce`.
    pub async fn load(&self, nonce: &[u8; 12]) -> Result<Shared, StoreError> {
        let (state, ended): (Option<String>, Option<String>) = redis::cmd("MGET")
            .arg(state_key(nonce))
            .arg(ended_key(nonce))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(Shared {
            // A value that does not parse (another version's, a hand edit) is no state.
            state: state.and_then(|s| serde_json::from_str(&s).ok()),
            ended: ended.is_some(),
        })
    }

    /// Records the session's state.
    pub async fn save(&self, nonce: &[u8; 12], state: &SharedState) -> Result<(), StoreError> {
        let value = serde_json::to_string(state).expect("plain data serializes");
        redis::cmd("SET")
            .arg(state_key(nonce))
            .arg(value)
            .arg("EX")
            .arg(self.state_ttl)
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Marks the session ended, and drops its state.
    pub async fn end(&self, nonce: &[u8; 12]) -> Result<(), StoreError> {
        redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(ended_key(nonce))
            .arg("1")
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
