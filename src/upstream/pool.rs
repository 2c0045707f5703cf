//! Idle HTTP/1 connections to the upstream, ready for the next request.
//!
//! One upstream, so one stack: the most recently used connection is taken first (its peer is
//! least likely to have timed it out, and the rest age out together). A connection comes back
//! only once its response has been read to the end, so every idle one can take a request at
//! once. Idle ones older than `client.pool_idle_timeout_secs` are closed by a reaper, so holdfast
//! closes them before the upstream's own keep-alive timeout does (Node's and uvicorn's are 5 s):
//! a request is never written onto a connection the server is closing.
//!
//! Before a connection leaves the pool it is checked for a close by the upstream
//! ([`Reusable::check`], told how long the connection sat idle): nothing reads an idle
//! connection, so a FIN or RST that arrived meanwhile would otherwise turn into a request written
//! into a dead connection. How much that check costs is [`super::tcp::check_idle`]'s business.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::tcp::Liveness;

/// A connection the pool can keep: it says whether the upstream closed it while it sat idle.
/// (The pool knows no more of it, so the HTTP/1 connection that uses the pool is not a
/// dependency of the pool.)
pub trait Reusable: Send + 'static {
    /// What the kernel knows of the connection now, without reading it, after `idle` in the
    /// pool (see [`super::tcp::check_idle`]).
    fn check(&self, idle: Duration) -> Liveness;
}

/// Most idle connections kept; more are closed when they come back.
const MAX_IDLE: usize = 1024;

/// The idle connections.
#[derive(Debug)]
pub struct Pool<C> {
    idle: Mutex<Vec<Parked<C>>>,
    timeout: Duration,
    /// Idle connections found closed by the upstream when they were about to be used.
    closed_idle: Counter,
    /// Whether the reaper runs (started with the first connection that comes back).
    reaping: std::sync::atomic::AtomicBool,
}

/// An idle connection, and since when.
#[derive(Debug)]
struct Parked<C> {
    conn: C,
    since: Instant,
}

impl<C: Reusable> Pool<C> {
    /// An empty pool whose connections close after `timeout` idle; `closed_idle` counts the
    /// ones the upstream had closed when they were about to be used.
    pub fn new(timeout: Duration, closed_idle: Counter) -> Arc<Pool<C>> {
        Arc::new(Pool {
            idle: Mutex::new(Vec::new()),
            timeout,
            closed_idle,
            reaping: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Parked<C>>> {
        self.idle.lock().expect("pool lock")
    }

    /// The most recently used idle connection that is still open and not expired.
    pub fn checkout(&self) -> Option<C> {
        loop {
            // The lock is not held across the kernel check: one syscall, but other requests
            // need not wait for it.
            let idle = self.lock().pop()?;
            let idle_for = idle.since.elapsed();
            if idle_for >= self.timeout {
                continue;
            }
            if idle.conn.check(idle_for) != Liveness::Open {
                self.closed_idle.inc();
                tracing::debug!(
                    "a pooled upstream connection was closed by the upstream; not used"
                );
                continue;
            }
            return Some(idle.conn);
        }
    }

    /// Counts a pooled connection found closed when a request was written on it.
    pub fn found_closed(&self) {
        self.closed_idle.inc();
    }

    /// Takes a connection back after its response ended.
    pub fn checkin(self: &Arc<Self>, conn: C) {
        {
            let mut idle = self.lock();
            if idle.len() >= MAX_IDLE {
                return;
            }
            idle.push(Parked {
                conn,
                since: Instant::now(),
            });
        }
        if !self.reaping.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tokio::spawn(reap(Arc::downgrade(self), self.timeout));
        }
    }

    /// Idle connections now.
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    /// Closes the idle connections that expired.
    fn evict(&self) {
        let timeout = self.timeout;
        self.lock().retain(|c| c.since.elapsed() < timeout);
    }
}

/// Closes expired idle connections every half timeout, for as long as the pool exists.
async fn reap<C: Reusable>(pool: Weak<Pool<C>>, timeout: Duration) {
    let mut every = tokio::time::interval(timeout / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.evict(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection the test names, open or not.
    #[derive(Debug)]
    struct Fake(usize, Liveness);

    impl Reusable for Fake {
        fn check(&self, _: Duration) -> Liveness {
            self.1
        }
    }

    fn pool() -> (Arc<Pool<Fake>>, Counter) {
        let closed = Counter::default();
        (Pool::new(Duration::from_secs(4), closed.clone()), closed)
    }

    #[tokio::test(start_paused = true)]
    async fn the_most_recently_used_connection_goes_first() {
        let (pool, _) = pool();
        for n in 0..3 {
            pool.checkin(Fake(n, Liveness::Open));
        }
        let order: Vec<usize> = std::iter::from_fn(|| pool.checkout().map(|c| c.0)).collect();
        assert_eq!(order, [2, 1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_1024_are_kept_and_more_are_closed() {
        let (pool, _) = pool();
        for n in 0..MAX_IDLE + 5 {
            pool.checkin(Fake(n, Liveness::Open));
        }
        assert_eq!(pool.idle(), MAX_IDLE);
        // The ones that came back past the cap were dropped (closed), not the older ones.
        assert_eq!(pool.checkout().map(|c| c.0), Some(MAX_IDLE - 1));
    }

    #[tokio::test(start_paused = true)]
    async fn closed_and_expired_connections_are_never_handed_out() {
        let (pool, closed) = pool();
        pool.checkin(Fake(0, Liveness::Open));
        tokio::time::advance(Duration::from_secs(3)).await;
        pool.checkin(Fake(1, Liveness::Open));
        pool.checkin(Fake(2, Liveness::Closed));
        pool.checkin(Fake(3, Liveness::Unasked));
        // 3 and 2 are skipped (and counted), 1 is fine.
        assert_eq!(pool.checkout().map(|c| c.0), Some(1));
        assert_eq!(closed.get(), 2);
        // 0 is past the idle timeout by now: not used, and the pool is empty.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(pool.checkout().is_none());
        assert_eq!(closed.get(), 2, "an expired connection is not a closed one");
    }

    /// A connection that remembers how long the pool said it sat idle.
    #[derive(Debug)]
    struct Timed(Arc<Mutex<Option<Duration>>>);

    impl Reusable for Timed {
        fn check(&self, idle: Duration) -> Liveness {
            *self.0.lock().unwrap() = Some(idle);
            Liveness::Open
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_check_is_told_how_long_the_connection_sat_idle() {
        let told = Arc::new(Mutex::new(None));
        let pool = Pool::new(Duration::from_secs(4), Counter::default());
        pool.checkin(Timed(told.clone()));
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert!(pool.checkout().is_some());
        assert_eq!(*told.lock().unwrap(), Some(Duration::from_millis(2500)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_reaper_closes_what_expired_without_a_checkout() {
        let (pool, _) = pool();
        pool.checkin(Fake(0, Liveness::Open));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(pool.idle(), 0);
    }
}
