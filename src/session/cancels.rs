//! Held requests their clients gave up on.
//!
//! A client whose own timeout ends while its call is held (the TypeScript SDK's 60 s, a
//! per-call timeout) sends `notifications/cancelled` naming the call's id, and goes on; it does
//! not close the call's connection, so without this the held call would be sent once the server
//! is back, and run for nobody. So each held request with a session and an id is registered
//! here while it waits, and a cancellation on the same session naming the same id takes it out
//! of the hold unsent ([`Cancels::cancel`]).
//!
//! Keys are the session id as the client holds it and the id as JSON text (`7` and `"7"` are
//! two ids). Only requests in the hold are registered, so the map is bounded by the hold's own
//! bound (`hold.max_requests`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use http::HeaderValue;
use tokio::sync::oneshot;

type Key = (HeaderValue, String);

/// The held requests that may be cancelled, by session and id.
#[derive(Default)]
pub struct Cancels {
    held: Mutex<HashMap<Key, (u64, oneshot::Sender<()>)>>,
    /// Entries in `held`: read without the lock on every POST while any request is held.
    len: AtomicUsize,
    next: AtomicU64,
}

/// A held request's place in [`Cancels`], given back when dropped.
pub struct Registration<'a> {
    cancels: &'a Cancels,
    key: Key,
    seq: u64,
    cancelled: oneshot::Receiver<()>,
}

impl Cancels {
    /// Registers the held request `id` (JSON text) on `session`; `None` when another held
    /// request of that session already has the id (a client that reuses ids: neither is then
    /// cancellable by it, rather than the wrong one).
    pub fn register(&self, session: HeaderValue, id: String) -> Option<Registration<'_>> {
        let (tx, rx) = oneshot::channel();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (session, id);
        let mut held = self.held.lock().expect("cancels lock");
        if held.contains_key(&key) {
            return None;
        }
        held.insert(key.clone(), (seq, tx));
        self.len.store(held.len(), Ordering::Release);
        Some(Registration {
            cancels: self,
            key,
            seq,
            cancelled: rx,
        })
    }

    /// Whether no request is registered: a POST then needs no look.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// The client of `session` cancelled its request `id`: true when it was held here, and is
    /// now taken out of the hold.
    pub fn cancel(&self, session: &HeaderValue, id: &str) -> bool {
        let mut held = self.held.lock().expect("cancels lock");
        let Some((_, tx)) = held.remove(&(session.clone(), id.to_owned())) else {
            return false;
        };
        self.len.store(held.len(), Ordering::Release);
        // Its waiter may have just left the hold for another reason: then nothing waits.
        tx.send(()).is_ok()
    }
}

impl Registration<'_> {
    /// Resolves when the request's client cancelled it.
    pub async fn cancelled(&mut self) {
        if (&mut self.cancelled).await.is_err() {
            // Never: the sender lives in the map until this registration is dropped.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut held = self.cancels.held.lock().expect("cancels lock");
        if held.get(&self.key).is_some_and(|(seq, _)| *seq == self.seq) {
            held.remove(&self.key);
        }
        self.cancels.len.store(held.len(), Ordering::Release);
    }
}

/// `params.requestId` of a `notifications/cancelled` in `body` (one message), as JSON text.
pub fn cancelled_id(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    if value.get("method")?.as_str()? != "notifications/cancelled" || value.get("id").is_some() {
        return None;
    }
    let id = value.get("params")?.get("requestId")?;
    (id.is_string() || id.is_number()).then(|| id.to_string())
}

/// A request's id as [`Cancels`] keys it (JSON text, as a cancellation names it).
pub fn id_text(id: &crate::jsonrpc::Id) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(id.as_raw()).ok()?;
    (value.is_string() || value.is_number()).then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[tokio::test]
    async fn a_cancellation_takes_out_the_held_request_of_its_session_and_id() {
        let cancels = Cancels::default();
        assert!(cancels.is_empty());
        let mut held = cancels.register(session("a"), "7".into()).unwrap();
        assert!(!cancels.is_empty());
        assert!(!cancels.cancel(&session("b"), "7"), "another session's");
        assert!(!cancels.cancel(&session("a"), "\"7\""), "another id");
        assert!(cancels.cancel(&session("a"), "7"));
        held.cancelled().await;
        assert!(!cancels.cancel(&session("a"), "7"), "once");
        drop(held);
        assert!(cancels.is_empty());
    }

    #[test]
    fn a_reused_id_is_not_registered_twice_and_a_place_is_given_back() {
        let cancels = Cancels::default();
        let first = cancels.register(session("a"), "1".into()).unwrap();
        assert!(cancels.register(session("a"), "1".into()).is_none());
        drop(first);
        assert!(cancels.is_empty());
        let again = cancels.register(session("a"), "1".into());
        assert!(again.is_some());
    }

    #[test]
    fn cancellations_and_ids_are_read_as_json() {
        let body = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"timed out"}}"#;
        assert_eq!(cancelled_id(body), Some("3".into()));
        let text =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a b"}}"#;
        assert_eq!(cancelled_id(text), Some("\"a b\"".into()));
        // A request, another method, no id: none.
        let request = br#"{"jsonrpc":"2.0","id":1,"method":"notifications/cancelled","params":{"requestId":3}}"#;
        assert_eq!(cancelled_id(request), None);
        assert_eq!(cancelled_id(br#"{"jsonrpc":"2.0","method":"ping"}"#), None);
        let id = crate::jsonrpc::request_id(br#"{"jsonrpc":"2.0","id": 3 ,"method":"x"}"#).unwrap();
        assert_eq!(id_text(&id), Some("3".into()));
    }
}
