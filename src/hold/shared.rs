//! What every route's outage shares: the settings, the caps on held requests and bytes,
//! shutdown, the Retry-After history, and `holdfast_upstream_up`.

use std::sync::RwLock;

use super::*;

/// What every route's outage shares: the hold's caps, shutdown, the Retry-After history and the
/// upstream-wide `holdfast_upstream_up`.
pub(super) struct SharedHold {
    /// The settings every route reads, replaced whole by a reload.
    settings: RwLock<Arc<Template>>,
    /// `hold.enabled` of the settings, for the hot path to read without the lock.
    enabled: AtomicBool,
    /// Requests held now, over all routes.
    pub(super) held: AtomicUsize,
    /// Body bytes reserved by held requests, over all routes.
    buffered: AtomicUsize,
    /// Routes with an open outage: `holdfast_upstream_up` is 1 only while there are none. A
    /// lock, not an atomic, so the gauge follows the count in order.
    open: Mutex<usize>,
    pub(super) shutting_down: AtomicBool,
    /// Routes with an outage, awake or dormant: while there are none (and the upstream-wide
    /// one is closed), a request needs no route of its own and its lookup is skipped.
    pub(super) route_outages: AtomicUsize,
    /// Durations of the last outages, newest last.
    pub(super) history: Mutex<VecDeque<Duration>>,
    /// The last outage's or pause's id: unique over every route, so a request that moves
    /// from one route's outage to another's is counted held in each.
    last_id: std::sync::atomic::AtomicU64,
}

impl SharedHold {
    pub(super) fn new(settings: Template) -> Arc<SharedHold> {
        Arc::new(SharedHold {
            enabled: AtomicBool::new(settings.cfg.enabled),
            settings: RwLock::new(Arc::new(settings)),
            held: AtomicUsize::new(0),
            buffered: AtomicUsize::new(0),
            open: Mutex::new(0),
            shutting_down: AtomicBool::new(false),
            route_outages: AtomicUsize::new(0),
            history: Mutex::new(VecDeque::new()),
            last_id: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The settings now.
    pub(super) fn settings(&self) -> Arc<Template> {
        self.settings.read().expect("settings lock").clone()
    }

    /// Whether holding is on now.
    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// New settings, for every route from now on. A held request keeps the deadline it was
    /// given; a reserved place is given back by the caps it was taken under.
    pub(super) fn replace(&self, settings: Template) {
        self.enabled.store(settings.cfg.enabled, Ordering::Release);
        *self.settings.write().expect("settings lock") = Arc::new(settings);
    }

    /// An id for an outage or pause that may begin (never 0: a request never held has 0).
    pub(super) fn next_id(&self) -> u64 {
        self.last_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Takes one place and `bytes` in the hold, if both caps allow.
    pub(super) fn reserve(&self, bytes: usize, cfg: &HoldConfig) -> bool {
        if self.held.fetch_add(1, Ordering::AcqRel) >= cfg.max_requests {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        if self.buffered.fetch_add(bytes, Ordering::AcqRel) + bytes > cfg.max_buffered_bytes {
            self.buffered.fetch_sub(bytes, Ordering::AcqRel);
            self.held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back `count` places and `bytes`.
    pub(super) fn release(&self, count: usize, bytes: usize) {
        self.held.fetch_sub(count, Ordering::AcqRel);
        self.buffered.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(super) fn held(&self) -> i64 {
        self.held.load(Ordering::Acquire) as i64
    }

    /// One more (`opened`) or one fewer route in an outage.
    pub(super) fn outage_count(&self, opened: bool, up: &prometheus_client::metrics::gauge::Gauge) {
        let mut open = self.open.lock().expect("open outages lock");
        if opened {
            *open += 1;
        } else {
            *open = open.saturating_sub(1);
        }
        up.set(i64::from(*open == 0));
    }
}
