//! Validating `[routes]`: where the application is expected, and the router signatures that
//! tell a router's own answers from it.

use super::validate::Validator;
use super::{defaults, RawRoutes, Routes, UpstreamUrl};
use crate::signature::Signature;

impl Validator<'_> {
    /// Checks `[routes]`; `None` when a problem was recorded.
    pub(super) fn routes(&mut self, r: &RawRoutes) -> Option<Routes> {
        let learn_ttl = self.secs("routes.learn_ttl_secs", r.learn_ttl_secs);
        let horizon = self.secs("routes.horizon_secs", r.horizon_secs);
        let before = self.problem_count();
        let endpoints = self.endpoints(&r.endpoints);
        if r.max_peek_bytes == 0 || r.max_peek_bytes > 1 << 20 {
            self.fail::<()>(
                "routes.max_peek_bytes",
                "must be between 1 and 1048576".into(),
            );
        }
        let behind_router = r.behind_router.unwrap_or(defaults::BEHIND_ROUTER);
        let signatures = self.signatures(r, behind_router);
        if self.problem_count() > before {
            return None;
        }
        Some(Routes {
            endpoints,
            learn: r.learn,
            learn_ttl: learn_ttl?,
            horizon: horizon?,
            max_peek_bytes: r.max_peek_bytes,
            behind_router,
            behind_router_said: r.behind_router.is_some(),
            // No router, no router's answers: every answer is the application's own (a Go
            // server's `http.NotFound` is byte for byte Traefik's route-missing 404).
            signatures: if behind_router {
                signatures
            } else {
                Vec::new()
            },
        })
    }

    /// `routes.endpoints`: paths, stored without a trailing slash (matching is segment-aligned,
    /// see classify).
    fn endpoints(&mut self, raw: &[String]) -> Vec<String> {
        let mut endpoints = Vec::new();
        for (i, e) in raw.iter().enumerate() {
            if !e.starts_with('/') {
                self.fail::<()>(
                    &format!("routes.endpoints[{i}]"),
                    format!("a path must start with `/`, got `{e}`"),
                );
                continue;
            }
            let trimmed = e.trim_end_matches('/');
            endpoints.push(if trimmed.is_empty() {
                "/".into()
            } else {
                trimmed.into()
            });
        }
        endpoints
    }

    /// An upstream URL whose path ends in an endpoint (`http://b:8000/mcp`): its path is a
    /// prefix put before every request's path, and a client's `/mcp` keeps its own, so the
    /// server would see `/mcp/mcp`. Pasting the endpoint's full URL (what `holdfast probe` and
    /// MCP clients take) is the natural mistake, and nothing at start showed it: every call
    /// would have met the server's 404, indistinguishable from a route gone missing. A prefix
    /// that is no endpoint (`/api`) is kept; a server that really serves `/mcp/mcp` is
    /// configured with `routes.endpoints = ["/mcp/mcp"]`.
    pub(super) fn upstream_path(&mut self, upstream: &UpstreamUrl, endpoints: &[String]) {
        let prefix = upstream.path_prefix.as_str();
        let Some(endpoint) = endpoints
            .iter()
            .filter(|e| e.as_str() != "/")
            // Both start with `/` and end without one: a suffix is a whole segment's.
            .find(|e| prefix.ends_with(e.as_str()))
        else {
            return;
        };
        let base = prefix.strip_suffix(endpoint.as_str()).unwrap_or_default();
        let scheme = upstream.scheme();
        self.fail::<()>(
            "upstream",
            format!(
                "the URL's path ends in the endpoint `{endpoint}` (routes.endpoints), and a \
                 client's request keeps its own path: `{endpoint}` would reach the server as \
                 `{prefix}{endpoint}`. Give the server's base URL, without the endpoint: \
                 `{scheme}://{}{base}` (`holdfast probe` takes the endpoint's full URL, \
                 `upstream` the base; a path here is a prefix put before every request's)",
                upstream.authority
            ),
        );
    }

    /// `routes.presets` and `routes.signatures`, in that order: what a router's own answers
    /// look like. User signatures make no sense without a router.
    fn signatures(&mut self, r: &RawRoutes, behind_router: bool) -> Vec<Signature> {
        if !behind_router && !r.signatures.is_empty() {
            self.fail::<()>(
                "routes.signatures",
                "signatures recognise a router's own answers, and routes.behind_router = false \
                 says no router sits in front of the MCP server: remove them, or set \
                 routes.behind_router = true"
                    .into(),
            );
        }
        let mut signatures = Vec::new();
        for (i, name) in r.presets.iter().enumerate() {
            match crate::signature::Preset::from_name(name) {
                Some(p) => signatures.push(p.signature()),
                None => {
                    self.fail::<()>(
                        &format!("routes.presets[{i}]"),
                        format!(
                            "unknown preset `{name}`; known: {}",
                            crate::signature::Preset::names().join(", ")
                        ),
                    );
                }
            }
        }
        for (i, s) in r.signatures.iter().enumerate() {
            let key = format!("routes.signatures[{i}]");
            match Signature::from_raw(s) {
                Ok(sig) => {
                    if sig.body_len_needed() > r.max_peek_bytes {
                        self.fail::<()>(
                            &key,
                            format!(
                                "its body is longer than routes.max_peek_bytes ({}), so it could never match",
                                r.max_peek_bytes
                            ),
                        );
                    }
                    signatures.push(sig);
                }
                Err(msg) => {
                    self.fail::<()>(&key, msg);
                }
            }
        }
        signatures
    }
}
