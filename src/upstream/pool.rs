//! Idle HTTP/1 connections to the upstream, ready for the next request.
//!
//! One upstream, so one stack: the most recently used connection is taken first (its peer is
//! least likely to have timed it out, and the rest age out together). A connection comes back
//! only once its response has been read to the end, so every idle one can take a request at
//! once. Idle ones older than `client.pool_idle_timeout_secs` are closed by a reaper, so holdfast
//! closes them before the upstream's own keep-alive timeout does (Node's and uvicorn's are 5 s):
//! a request is never written onto a connection the server is closing.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::replay::ReplayBody;

/// Most idle connections kept; more are closed when they come back.
const MAX_IDLE: usize = 1024;

/// The idle connections.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<Vec<Idle>>,
    timeout: Duration,
    /// Whether the reaper runs (started with the first connection that comes back).
    reaping: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct Idle {
    sender: SendRequest<ReplayBody>,
    since: Instant,
}

impl Pool {
    /// An empty pool whose connections close after `timeout` idle.
    pub fn new(timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            idle: Mutex::new(Vec::new()),
            timeout,
            reaping: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().expect("pool lock")
    }

    /// The most recently used idle connection that is still open and not expired.
    pub fn checkout(&self) -> Option<SendRequest<ReplayBody>> {
        let mut idle = self.lock();
        while let Some(conn) = idle.pop() {
            if conn.sender.is_closed() || conn.since.elapsed() >= self.timeout {
                continue;
            }
            return Some(conn.sender);
        }
        None
    }

    /// Takes a connection back after its response ended.
    pub fn checkin(self: &Arc<Self>, sender: SendRequest<ReplayBody>) {
        if sender.is_closed() {
            return;
        }
        {
            let mut idle = self.lock();
            if idle.len() >= MAX_IDLE {
                return;
            }
            idle.push(Idle {
                sender,
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

    /// Closes the idle connections that expired (or that the upstream closed).
    fn evict(&self) {
        let timeout = self.timeout;
        self.lock()
            .retain(|c| !c.sender.is_closed() && c.since.elapsed() < timeout);
    }
}

/// Closes expired idle connections every half timeout, for as long as the pool exists.
async fn reap(pool: Weak<Pool>, timeout: Duration) {
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
