//! Which paths the application is expected to serve: where a router's 404 means "missing".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

/// Which paths the application is expected to serve, so a router's 404 there means "missing".
///
/// Three sources: configured endpoint prefixes (default `/mcp`); a legacy (2024-11-05 HTTP+SSE)
/// server's two paths, once its `endpoint` event has shown them ([`LegacyPaths`]); and, when
/// learning is on, exact paths the application itself answered within the learn TTL. The
/// learned set is bounded; when full, the stalest entry goes.
pub struct ExpectedRoutes {
    endpoints: Vec<String>,
    legacy: Arc<LegacyPaths>,
    learn: bool,
    ttl: Duration,
    learned: Mutex<HashMap<String, Instant>>,
}

/// A legacy server's paths: the GET path of its event stream and the path its `endpoint` event
/// names for POSTs (`/sse` and `/messages`, say). Seen once, they are expected for the life of the
/// process, not for a learn TTL: the stream they belong to lives for hours, and the moment they
/// matter is when the server restarts and its router drops the route, however long after the
/// last answer that is. Exact paths (a session id rides in the query), at most
/// [`MAX_LEGACY_PATHS`].
#[derive(Debug, Default)]
pub struct LegacyPaths {
    paths: RwLock<Vec<String>>,
}

/// Most legacy paths kept. A legacy server has two; this bounds what a misbehaving upstream
/// could make holdfast keep.
pub const MAX_LEGACY_PATHS: usize = 16;

impl LegacyPaths {
    /// Records `path` as a legacy server's; `true` if it was new (and there was room).
    pub fn add(&self, path: &str) -> bool {
        if self.contains(path) {
            return false;
        }
        let mut paths = self.paths.write().expect("legacy-path lock");
        if paths.len() >= MAX_LEGACY_PATHS || paths.iter().any(|p| p == path) {
            return false;
        }
        paths.push(path.to_owned());
        true
    }

    /// Whether `path` is one of them.
    pub fn contains(&self, path: &str) -> bool {
        self.paths
            .read()
            .expect("legacy-path lock")
            .iter()
            .any(|p| p == path)
    }
}

/// Most learned paths kept: memory stays bounded whatever paths clients send.
const MAX_LEARNED_PATHS: usize = 1024;

impl ExpectedRoutes {
    /// From validated config.
    pub fn new(endpoints: Vec<String>, learn: bool, ttl: Duration) -> Self {
        Self {
            endpoints,
            legacy: Arc::default(),
            learn,
            ttl,
            learned: Mutex::new(HashMap::new()),
        }
    }

    /// The same with new settings (a reload), keeping the paths learned and the legacy server's.
    pub fn reconfigured(&self, endpoints: Vec<String>, learn: bool, ttl: Duration) -> Self {
        Self {
            endpoints,
            legacy: self.legacy.clone(),
            learn,
            ttl,
            learned: Mutex::new(self.learned.lock().expect("learned lock").clone()),
        }
    }

    /// Whether a router's 404 for `path` means the backend is missing. `now` is asked only for
    /// a path learned (not one under a configured endpoint): every answer passes here, and a
    /// clock read is not free.
    pub fn is_expected(&self, path: &str, now: impl FnOnce() -> Instant) -> bool {
        if self.endpoints.iter().any(|e| prefix_matches(e, path)) || self.legacy.contains(path) {
            return true;
        }
        self.learn
            && self
                .learned
                .lock()
                .expect("learned-path lock")
                .get(path)
                .is_some_and(|seen| now().saturating_duration_since(*seen) <= self.ttl)
    }

    /// Where a legacy server's paths are recorded (shared with the streams that find them).
    pub fn legacy(&self) -> Arc<LegacyPaths> {
        self.legacy.clone()
    }

    /// The index of the configured endpoint `path` falls under, if any (the first that
    /// matches): with the Host, the route a request takes.
    pub fn endpoint_of(&self, path: &str) -> Option<usize> {
        self.endpoints.iter().position(|e| prefix_matches(e, path))
    }

    /// Records that the application answered `path` with something other than a 404 (`now`
    /// asked only when it is recorded).
    pub fn learn(&self, path: &str, now: impl FnOnce() -> Instant) {
        if !self.learn || self.endpoints.iter().any(|e| prefix_matches(e, path)) {
            return;
        }
        let mut learned = self.learned.lock().expect("learned-path lock");
        if learned.len() >= MAX_LEARNED_PATHS && !learned.contains_key(path) {
            let stalest = learned
                .iter()
                .min_by_key(|(_, seen)| **seen)
                .map(|(p, _)| p.clone());
            if let Some(p) = stalest {
                learned.remove(&p);
            }
        }
        learned.insert(path.to_string(), now());
    }
}

/// Segment-aligned prefix match: `/mcp` matches `/mcp`, `/mcp/` and `/mcp/x`, not `/mcpx`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_routes() {
        let now = Instant::now();
        let r = ExpectedRoutes::new(vec!["/mcp".into()], true, Duration::from_secs(60));
        assert!(r.is_expected("/mcp", || now));
        assert!(r.is_expected("/mcp/", || now));
        assert!(r.is_expected("/mcp/x", || now));
        assert!(!r.is_expected("/mcpx", || now));
        assert!(!r.is_expected("/.well-known/oauth-protected-resource", || now));
        r.learn("/.well-known/oauth-protected-resource", || now);
        assert!(r.is_expected("/.well-known/oauth-protected-resource", || now));
        let past_ttl = now + Duration::from_secs(61);
        assert!(!r.is_expected("/.well-known/oauth-protected-resource", || past_ttl));
        let off = ExpectedRoutes::new(vec!["/mcp".into()], false, Duration::from_secs(60));
        off.learn("/other", || now);
        assert!(!off.is_expected("/other", || now));
    }

    #[test]
    fn a_legacy_servers_paths_stay_expected_past_the_learn_ttl_and_with_learning_off() {
        let now = Instant::now();
        let r = ExpectedRoutes::new(vec!["/mcp".into()], false, Duration::from_secs(60));
        assert!(!r.is_expected("/sse", || now));
        assert!(r.legacy().add("/sse"));
        assert!(r.legacy().add("/messages"));
        assert!(!r.legacy().add("/sse"), "already known");
        for path in ["/sse", "/messages"] {
            assert!(r.is_expected(path, || now));
            assert!(r.is_expected(path, || now + Duration::from_secs(7 * 24 * 3600)));
        }
        // Exact paths, not prefixes.
        assert!(!r.is_expected("/messages/x", || now));
        assert!(!r.is_expected("/ss", || now));
    }

    #[test]
    fn the_clock_is_asked_only_for_paths_that_are_learned() {
        let r = ExpectedRoutes::new(vec!["/mcp".into()], true, Duration::from_secs(60));
        let no_clock = || -> Instant { panic!("the clock read for a configured endpoint") };
        assert!(r.is_expected("/mcp/x", no_clock));
        r.learn("/mcp/x", no_clock);
        assert!(r.legacy().add("/sse"));
        assert!(r.is_expected("/sse", no_clock));
        // A path that is learned asks it, once each way.
        let asked = std::cell::Cell::new(0);
        let clock = || {
            asked.set(asked.get() + 1);
            Instant::now()
        };
        r.learn("/other", clock);
        assert!(r.is_expected("/other", clock));
        assert_eq!(asked.get(), 2);
    }

    #[test]
    fn legacy_paths_are_bounded() {
        let paths = LegacyPaths::default();
        for i in 0..MAX_LEGACY_PATHS {
            assert!(paths.add(&format!("/p{i}")));
        }
        assert!(!paths.add("/one-too-many"));
        assert!(!paths.contains("/one-too-many"));
        assert!(paths.contains("/p0"));
    }

    #[test]
    fn learned_paths_are_bounded() {
        let now = Instant::now();
        let r = ExpectedRoutes::new(vec![], true, Duration::from_secs(60));
        for i in 0..(MAX_LEARNED_PATHS + 10) {
            r.learn(&format!("/p{i}"), || now + Duration::from_millis(i as u64));
        }
        assert_eq!(r.learned.lock().unwrap().len(), MAX_LEARNED_PATHS);
        // The oldest went first; the newest stayed.
        let later = now + Duration::from_secs(1);
        assert!(!r.is_expected("/p0", || later));
        assert!(r.is_expected(&format!("/p{}", MAX_LEARNED_PATHS + 9), || later));
    }
}
