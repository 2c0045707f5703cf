//! The proxy new requests go to: one per configuration, replaced whole by a reload
//! ([`Proxy::reconfigured`] carries its state over). A request keeps the proxy it began with,
//! so everything it decides is decided under one configuration.
//!
//! An HTTP/1 connection keeps the proxy it last used and looks again before each request only
//! when a reload happened since: one atomic load per request, no shared counter touched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::Proxy;

/// The proxy now, and how many times it was replaced.
pub struct Current {
    proxy: RwLock<Arc<Proxy>>,
    generation: AtomicU64,
}

/// A connection's copy of the proxy, and which one it is.
pub struct Cached {
    generation: u64,
    proxy: Arc<Proxy>,
}

impl Current {
    /// The first proxy.
    pub fn new(proxy: Arc<Proxy>) -> Arc<Current> {
        Arc::new(Current {
            proxy: RwLock::new(proxy),
            generation: AtomicU64::new(0),
        })
    }

    /// The proxy now.
    pub fn get(&self) -> Arc<Proxy> {
        self.proxy.read().expect("current proxy lock").clone()
    }

    /// A copy for a connection to keep.
    pub fn cached(&self) -> Cached {
        // The generation first: a reload between the two reads is seen at the next refresh.
        let generation = self.generation.load(Ordering::Acquire);
        Cached {
            generation,
            proxy: self.get(),
        }
    }

    /// New requests go to `proxy` from now on.
    pub fn replace(&self, proxy: Arc<Proxy>) {
        *self.proxy.write().expect("current proxy lock") = proxy;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Brings `cached` up to date if a reload happened since it was taken.
    pub fn refresh(&self, cached: &mut Cached) {
        if self.generation.load(Ordering::Acquire) != cached.generation {
            *cached = self.cached();
        }
    }
}

impl Cached {
    /// The proxy it holds.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }
}
