//! Which paths the application is expected to serve: where a router's 404 means "missing".

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Which paths the application is expected to serve, so a router's 404 there means "missing".
///
/// Two sources: configured endpoint prefixes (default `/mcp`) and, when learning is on, exact
/// paths the application itself answered within the learn TTL. The learned set is bounded; when
/// full, the stalest entry goes.
pub struct ExpectedRoutes {
    endpoints: Vec<String>,
    learn: bool,
    ttl: Duration,
    learned: Mutex<HashMap<String, Instant>>,
}

/// Most learned paths kept: memory stays bounded whatever paths clients send.
const MAX_LEARNED_PATHS: usize = 1024;

impl ExpectedRoutes {
    /// From validated config.
    pub fn new(endpoints: Vec<String>, learn: bool, ttl: Duration) -> Self {
        Self {
            endpoints,
            learn,
            ttl,
            learned: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a router's 404 for `path` means the backend is missing.
    pub fn is_expected(&self, path: &str, now: Instant) -> bool {
        if self.endpoints.iter().any(|e| prefix_matches(e, path)) {
            return true;
        }
        self.learn
            && self
                .learned
                .lock()
                .expect("learned-path lock")
                .get(path)
                .is_some_and(|seen| now.saturating_duration_since(*seen) <= self.ttl)
    }

    /// The index of the configured endpoint `path` falls under, if any (the first that
    /// matches): with the Host, the route a request takes.
    pub fn endpoint_of(&self, path: &str) -> Option<usize> {
        self.endpoints.iter().position(|e| prefix_matches(e, path))
    }

    /// Records that the application answered `path` with something other than a 404.
    pub fn learn(&self, path: &str, now: Instant) {
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
        learned.insert(path.to_string(), now);
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
        assert!(r.is_expected("/mcp", now));
        assert!(r.is_expected("/mcp/", now));
        assert!(r.is_expected("/mcp/x", now));
        assert!(!r.is_expected("/mcpx", now));
        assert!(!r.is_expected("/.well-known/oauth-protected-resource", now));
        r.learn("/.well-known/oauth-protected-resource", now);
        assert!(r.is_expected("/.well-known/oauth-protected-resource", now));
        assert!(!r.is_expected(
            "/.well-known/oauth-protected-resource",
            now + Duration::from_secs(61)
        ));
        let off = ExpectedRoutes::new(vec!["/mcp".into()], false, Duration::from_secs(60));
        off.learn("/other", now);
        assert!(!off.is_expected("/other", now));
    }

    #[test]
    fn learned_paths_are_bounded() {
        let now = Instant::now();
        let r = ExpectedRoutes::new(vec![], true, Duration::from_secs(60));
        for i in 0..(MAX_LEARNED_PATHS + 10) {
            r.learn(&format!("/p{i}"), now + Duration::from_millis(i as u64));
        }
        assert_eq!(r.learned.lock().unwrap().len(), MAX_LEARNED_PATHS);
        // The oldest went first; the newest stayed.
        assert!(!r.is_expected("/p0", now + Duration::from_secs(1)));
        assert!(r.is_expected(
            &format!("/p{}", MAX_LEARNED_PATHS + 9),
            now + Duration::from_secs(1)
        ));
    }
}
