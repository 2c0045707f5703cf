//! Requests in flight: sent to the upstream and not yet fully answered, for a pause's drain.
//!
//! A request is in flight from the moment an attempt at the upstream starts until its response
//! body ends (or its client goes away): an SSE stream is in flight for as long as it streams. A
//! request waiting in the hold is not: it has not been sent, or it provably never reached the
//! application. `holdfast pause` waits until nothing is in flight, and names what still is when
//! its drain timeout passes.
//!
//! One uncontended lock per request on entry and one on exit, each a slot taken or freed in a
//! slab (no allocation once it has grown to the peak concurrency): a pause must know the age of
//! each request, and a counter alone cannot say how old the oldest one is. Finding the oldest
//! scans the slab, which only a pause or a status read does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{HeaderValue, Method};
use slab::Slab;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Every request in flight now.
#[derive(Default)]
pub struct InFlight {
    inner: Mutex<Inner>,
    /// Woken when the last request in flight ends, while someone drains.
    drained: Notify,
    /// Drains waiting now: only then does the last request's exit wake anyone.
    draining: AtomicUsize,
    /// The Host of the latest request the application answered (see [`InFlight::note_host`]).
    last_host: Mutex<Option<HeaderValue>>,
}

/// A slot per request in flight.
type Inner = Slab<Entry>;

struct Entry {
    since: Instant,
    method: Method,
    stream: bool,
}

/// One request in flight; it leaves when this is dropped (with its response body, if any).
pub struct Flight {
    registry: Arc<InFlight>,
    slot: usize,
}

/// A request still in flight, as a pause reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Its method.
    pub method: Method,
    /// How long it has been in flight.
    pub age: Duration,
    /// Whether its answer is an SSE stream (a standalone GET stream, a long tool call).
    pub stream: bool,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("in-flight lock")
    }

    /// A request is about to be sent.
    pub fn enter(self: &Arc<Self>, method: &Method) -> Flight {
        let entry = Entry {
            since: Instant::now(),
            method: method.clone(),
            stream: false,
        };
        let slot = self.lock().insert(entry);
        Flight {
            registry: self.clone(),
            slot,
        }
    }

    /// Requests in flight now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Requests in flight now that carry a call: everything but GETs (a GET is a standalone
    /// event stream, or a resumption of one, which carries no call and which its client opens
    /// again).
    pub fn calls(&self) -> usize {
        self.lock()
            .iter()
            .filter(|(_, e)| e.method != Method::GET)
            .count()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The oldest `n` requests in flight, oldest first.
    pub fn oldest(&self, n: usize) -> Vec<Pending> {
        let now = Instant::now();
        let mut pending: Vec<(Instant, Pending)> = self
            .lock()
            .iter()
            .map(|(_, e)| {
                let p = Pending {
                    method: e.method.clone(),
                    age: now.saturating_duration_since(e.since),
                    stream: e.stream,
                };
                (e.since, p)
            })
            .collect();
        pending.sort_by_key(|(since, _)| *since);
        pending.into_iter().take(n).map(|(_, p)| p).collect()
    }

    /// Waits until nothing is in flight (true) or `deadline` passes (false).
    pub async fn drained(&self, deadline: Instant) -> bool {
        self.draining.fetch_add(1, Ordering::AcqRel);
        let drained = async {
            loop {
                // Registered before the check, so an exit in between is not missed.
                let notified = self.drained.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.is_empty() {
                    return;
                }
                notified.await;
            }
        };
        let done = tokio::time::timeout_at(deadline, drained).await.is_ok();
        self.draining.fetch_sub(1, Ordering::AcqRel);
        done
    }

    /// Remembers `host` as the Host of the latest request the application answered: a pause
    /// asks the upstream with it whether the application is still there (behind a router that
    /// routes by Host, the upstream's own name would only ever find the route missing).
    pub fn note_host(&self, host: &HeaderValue) {
        // A hint: under contention someone else is noting the same Host.
        let Ok(mut last) = self.last_host.try_lock() else {
            return;
        };
        if last.as_ref() != Some(host) {
            // Copied: a slice of the request's head would keep the whole head alive.
            *last = HeaderValue::from_bytes(host.as_bytes()).ok();
        }
    }

    /// The Host of the latest request the application answered.
    pub fn last_host(&self) -> Option<HeaderValue> {
        self.last_host.lock().expect("host lock").clone()
    }
}

impl Flight {
    /// Its answer is an SSE stream.
    pub fn streaming(&self) {
        if let Some(e) = self.registry.lock().get_mut(self.slot) {
            e.stream = true;
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let empty = {
            let mut inner = self.registry.lock();
            // `try_remove`, not `remove`: a vacant slot is nothing to do, where `remove` would
            // panic under the lock and poison it.
            inner.try_remove(self.slot);
            inner.is_empty()
        };
        if empty && self.registry.draining.load(Ordering::Acquire) > 0 {
            self.registry.drained.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_drain_ends_with_the_last_request_and_names_the_rest_until_then() {
        let flights = Arc::new(InFlight::default());
        let call = flights.enter(&Method::POST);
        tokio::time::advance(Duration::from_secs(2)).await;
        let stream = flights.enter(&Method::GET);
        stream.streaming();
        assert_eq!(
            flights.oldest(10),
            vec![
                Pending {
                    method: Method::POST,
                    age: Duration::from_secs(2),
                    stream: false
                },
                Pending {
                    method: Method::GET,
                    age: Duration::ZERO,
                    stream: true
                },
            ]
        );
        // The deadline passes with both in flight.
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(!flights.drained(deadline).await);
        assert_eq!(Instant::now(), deadline);

        // One ends during the next drain, the other later: the drain ends with the last.
        let drain = {
            let flights = flights.clone();
            tokio::spawn(async move {
                let ok = flights
                    .drained(Instant::now() + Duration::from_secs(60))
                    .await;
                (ok, Instant::now())
            })
        };
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(call);
        tokio::time::advance(Duration::from_secs(3)).await;
        let ended = Instant::now();
        drop(stream);
        let (ok, at) = drain.await.unwrap();
        assert!(ok);
        assert_eq!(at, ended, "woken by the last exit, not by a timer");
        assert!(flights.is_empty());
        // Nothing in flight: at once.
        assert!(flights.drained(Instant::now()).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_slot_does_not_make_a_young_request_look_old() {
        let flights = Arc::new(InFlight::default());
        let first = flights.enter(&Method::POST);
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = flights.enter(&Method::GET);
        drop(first);
        tokio::time::advance(Duration::from_secs(1)).await;
        let third = flights.enter(&Method::DELETE);
        let oldest: Vec<_> = flights.oldest(10).into_iter().map(|p| p.method).collect();
        assert_eq!(oldest, [Method::GET, Method::DELETE]);
        assert_eq!(flights.oldest(1)[0].age, Duration::from_secs(1));
        assert_eq!(flights.len(), 2);
        drop((second, third));
        assert!(flights.is_empty());
    }

    #[test]
    fn the_latest_answered_host_is_kept_as_a_copy() {
        let flights = InFlight::default();
        assert_eq!(flights.last_host(), None);
        flights.note_host(&HeaderValue::from_static("a.example"));
        flights.note_host(&HeaderValue::from_static("b.example"));
        assert_eq!(
            flights.last_host(),
            Some(HeaderValue::from_static("b.example"))
        );
    }
}
