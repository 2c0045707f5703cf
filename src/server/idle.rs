//! Which client connections are idle, so that at `limits.max_connections` the longest-idle one
//! makes room for a new client instead of the new client waiting for a keep-alive timeout.
//!
//! A connection is idle while no request on it is being answered: from its accept until its
//! first request, and from the end of each response body until the next request. An SSE stream
//! keeps its connection busy. Each connection has its state in a slab under a mutex, touched on
//! accept and close only; a request costs a few atomic operations (and a clock read when its
//! connection turns idle).
//!
//! Closing an idle connection drops it: nothing is being answered on it, so this is what its
//! keep-alive timeout would do, only sooner. (As at any keep-alive timeout, a request the client
//! sent at that very instant meets the close; clients resend requests on a connection closed
//! before any answer.)

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use slab::Slab;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Every client connection's idleness.
pub struct Idle {
    epoch: Instant,
    slots: Mutex<Slab<Arc<Conn>>>,
    /// The accept loop waits for a slot: the next connection to turn idle closes at once.
    wanted: AtomicBool,
}

/// One connection's state.
pub struct Conn {
    /// Requests being answered on it now.
    active: AtomicUsize,
    /// Milliseconds since the epoch when it last turned idle.
    idle_since: AtomicU64,
    /// Told to close (a permit, so a close asked before anyone waits is not lost).
    close: Notify,
}

/// A connection's place in [`Idle`]; it leaves when this is dropped.
pub struct Registered {
    idle: Arc<Idle>,
    slot: usize,
    conn: Arc<Conn>,
}

impl Idle {
    /// No connections yet.
    pub fn new() -> Arc<Idle> {
        Arc::new(Idle {
            epoch: Instant::now(),
            slots: Mutex::new(Slab::default()),
            wanted: AtomicBool::new(false),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A connection was accepted: idle until its first request.
    pub fn register(self: &Arc<Self>) -> Registered {
        let conn = Arc::new(Conn {
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
        });
        let slot = self.slots.lock().expect("idle lock").insert(conn.clone());
        Registered {
            idle: self.clone(),
            slot,
            conn,
        }
    }

    /// At the limit: closes the connection idle the longest, if any is. Otherwise the next one
    /// to turn idle closes at once.
    /// Whether an idle one was closed (else the next connection to go idle will be).
    pub fn make_room(&self) -> bool {
        let longest = {
            let slots = self.slots.lock().expect("idle lock");
            slots
                .iter()
                .map(|(_, c)| c)
                .filter(|c| c.active.load(Ordering::Acquire) == 0)
                .min_by_key(|c| c.idle_since.load(Ordering::Acquire))
                .cloned()
        };
        match longest {
            Some(conn) => {
                tracing::debug!("at limits.max_connections: closing the longest-idle connection");
                conn.close.notify_one();
                true
            }
            None => {
                self.wanted.store(true, Ordering::Release);
                false
            }
        }
    }

    /// A slot was freed some other way: nobody needs the next idle connection closed.
    pub fn room_made(&self) {
        self.wanted.store(false, Ordering::Release);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // `try_remove`, not `remove`: a vacant slot is nothing to do, where `remove` would
        // panic under the lock and poison it.
        self.idle
            .slots
            .lock()
            .expect("idle lock")
            .try_remove(self.slot);
    }
}

impl Registered {
    /// A request begins on the connection; it is busy until the returned guard is dropped
    /// (with its response body).
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.conn.active.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Completes when the connection is to close to make room.
    pub async fn closed(&self) {
        self.conn.close.notified().await;
    }

    /// Told to close: whether it is still idle, so it may. A request may have begun between
    /// the choice and now; then it stays, and the next connection to turn idle closes instead.
    pub fn may_close(&self) -> bool {
        if self.conn.active.load(Ordering::Acquire) == 0 {
            return true;
        }
        self.idle.wanted.store(true, Ordering::Release);
        false
    }
}

/// One request being answered on a connection.
pub struct Busy(Arc<Registered>);

impl Drop for Busy {
    fn drop(&mut self) {
        let Registered { idle, conn, .. } = &*self.0;
        if conn.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.idle_since.store(idle.now_ms(), Ordering::Release);
            if idle.wanted.swap(false, Ordering::AcqRel) {
                conn.close.notify_one();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its connection busy until it ends.
    pub struct Tracked<B> {
        #[pin]
        inner: B,
        busy: Option<Busy>,
    }
}

impl<B> Tracked<B> {
    /// `inner`, keeping `busy` until its end.
    pub fn new(inner: B, busy: Busy) -> Self {
        Self {
            inner,
            busy: Some(busy),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            *this.busy = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_connection_closes_and_a_busy_one_never_does() {
        let idle = Idle::new();
        let old = idle.register();
        tokio::time::advance(Duration::from_secs(5)).await;
        let busy = Arc::new(idle.register());
        let request = busy.begin();
        tokio::time::advance(Duration::from_secs(5)).await;
        let young = idle.register();

        idle.make_room();
        // `old` has a close permit, `young` none: its wait stays pending.
        tokio::time::timeout(Duration::from_millis(1), old.closed())
            .await
            .expect("the longest idle was told to close");
        assert!(
            tokio::time::timeout(Duration::from_millis(1), young.closed())
                .await
                .is_err()
        );

        // Only busy connections left: the next to turn idle closes.
        drop((old, young));
        idle.make_room();
        assert!(
            tokio::time::timeout(Duration::from_millis(1), busy.closed())
                .await
                .is_err()
        );
        drop(request);
        tokio::time::timeout(Duration::from_millis(1), busy.closed())
            .await
            .expect("closed as soon as its request ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_turned_busy_after_it_was_chosen_stays() {
        let idle = Idle::new();
        let conn = Arc::new(idle.register());
        idle.make_room();
        let request = conn.begin();
        tokio::time::timeout(Duration::from_millis(1), conn.closed())
            .await
            .expect("chosen while idle");
        assert!(!conn.may_close(), "busy now: it stays");
        drop(request);
        tokio::time::timeout(Duration::from_millis(1), conn.closed())
            .await
            .expect("closes once idle, as the next to turn idle");
        assert!(conn.may_close());
    }
}
