//! What the bridge keeps of 2025 clients' local sessions (sessions holdfast answered for a
//! 2026-07-28-only server: src/proxy/forward/modern.rs): the level and the subscriptions each
//! set, its open GET stream, and its calls in progress, which the client may cancel.

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::{lock, Bridge, MAX_CANCELS};

/// A 2025 client's call in progress: its session's token, its id as JSON text.
pub(super) type CallKey = (Vec<u8>, String);

/// A 2025 client's call's place among the calls in progress, given up when dropped.
pub struct CallEntry {
    bridge: std::sync::Weak<Bridge>,
    key: CallKey,
    tag: u64,
}

impl Drop for CallEntry {
    fn drop(&mut self) {
        if let Some(bridge) = self.bridge.upgrade() {
            let mut calls = lock(&bridge.calls);
            if calls
                .get(&self.key)
                .is_some_and(|(tag, _)| *tag == self.tag)
            {
                calls.remove(&self.key);
            }
        }
    }
}

/// What a 2025 client's local session (one holdfast answered for a 2026-07-28-only server)
/// set, and its GET stream.
#[derive(Default)]
pub(super) struct LocalState {
    /// `logging/setLevel`: each request opts in to log messages from it.
    level: Option<&'static str>,
    /// `resources/subscribe`: the URIs its GET stream's listens name.
    uris: std::collections::BTreeSet<String>,
    /// Where its GET stream's events go while it is open.
    stream: Option<tokio::sync::mpsc::WeakSender<bytes::Bytes>>,
}

/// Whether a 2025 client cancelled its call: ready once it did; never, if the call's entry went
/// (another call of the same id took it).
pub struct Cancelled(Option<tokio::sync::oneshot::Receiver<()>>);

impl Cancelled {
    /// Ready once the client cancelled the call.
    pub fn poll_cancelled(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        use std::task::Poll;
        let Some(rx) = self.0.as_mut() else {
            return Poll::Pending;
        };
        match std::pin::Pin::new(rx).poll(cx) {
            Poll::Ready(said) => {
                // A oneshot is polled to its end once.
                self.0 = None;
                if said.is_ok() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Waits until the client cancels the call (forever if it cannot any more).
    pub async fn wait(&mut self) {
        std::future::poll_fn(|cx| self.poll_cancelled(cx)).await
    }
}

impl Bridge {
    /// What the local session `token` set, made if it has none; beyond `max_sessions`
    /// sessions, one of the others forgets its own.
    fn local(&self, token: &[u8], change: impl FnOnce(&mut LocalState)) {
        let max = lock(&self.sessions).max;
        let mut locals = lock(&self.locals);
        if locals.len() >= max && !locals.contains_key(token) {
            let some = locals.keys().next().cloned();
            if let Some(some) = some {
                locals.remove(&some);
            }
        }
        change(locals.entry(token.to_vec()).or_default());
    }

    /// Records the log level a local session was set to: its requests then get log messages
    /// from it.
    pub fn set_local_level(&self, token: &[u8], level: &'static str) {
        self.local(token, |l| l.level = Some(level));
    }

    /// The log level a local session was set to, if any.
    pub fn local_level(&self, token: &[u8]) -> Option<&'static str> {
        lock(&self.locals).get(token).and_then(|l| l.level)
    }

    /// Records that a local session subscribed to `uri`: its GET stream's listens name it. The
    /// stream open now, to which a listen of `uri` is to be added, if there is one.
    pub fn subscribe_local(
        &self,
        token: &[u8],
        uri: &str,
    ) -> Option<tokio::sync::mpsc::Sender<bytes::Bytes>> {
        let mut stream = None;
        self.local(token, |l| {
            if l.uris.insert(uri.to_owned()) {
                stream = l.stream.as_ref().and_then(|s| s.upgrade());
            }
        });
        stream
    }

    /// Records that a local session unsubscribed from `uri` (its next GET stream's listen
    /// leaves it out).
    pub fn unsubscribe_local(&self, token: &[u8], uri: &str) {
        if let Some(l) = lock(&self.locals).get_mut(token) {
            l.uris.remove(uri);
        }
    }

    /// The URIs a local session subscribed to.
    pub fn local_uris(&self, token: &[u8]) -> Vec<String> {
        let locals = lock(&self.locals);
        locals
            .get(token)
            .map(|l| l.uris.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records the local session's open GET stream (weakly: it ends when its listens do).
    pub fn local_stream(&self, token: &[u8], stream: &tokio::sync::mpsc::Sender<bytes::Bytes>) {
        let weak = stream.downgrade();
        self.local(token, |l| l.stream = Some(weak));
    }

    /// Forgets a local session (the client ended it).
    pub fn forget_local(&self, token: &[u8]) {
        lock(&self.locals).remove(token);
    }

    /// Registers a 2025 client's call `id` on session `token`: what says it was cancelled.
    /// `None` beyond [`MAX_CANCELS`] calls (it then cannot be cancelled but by its client going
    /// away).
    pub fn call_started(
        self: &Arc<Self>,
        token: &[u8],
        id: &Value,
    ) -> Option<(Cancelled, CallEntry)> {
        let key = (token.to_vec(), id.to_string());
        // Its own mark: a client that reuses an id replaces the entry, and the first call's
        // end must not take the second's.
        let tag = self.next_id();
        let mut calls = lock(&self.calls);
        calls.retain(|_, (_, c)| !c.is_closed());
        if calls.len() >= MAX_CANCELS {
            return None;
        }
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        calls.insert(key.clone(), (tag, cancel));
        let entry = CallEntry {
            bridge: Arc::downgrade(self),
            key,
            tag,
        };
        Some((Cancelled(Some(cancelled)), entry))
    }

    /// A 2025 client's `notifications/cancelled` of its call `id` on session `token`: whether
    /// the call was in progress.
    pub fn cancel_call(&self, token: &[u8], id: &Value) -> bool {
        let key = (token.to_vec(), id.to_string());
        let cancel = lock(&self.calls).remove(&key);
        cancel.is_some_and(|(_, c)| c.send(()).is_ok())
    }
}
