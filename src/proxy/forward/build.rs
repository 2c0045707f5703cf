//! Building the proxy from validated configuration, and building it again on a reload with what
//! it has learned and holds carried over: the outages and held requests, the sessions, the
//! learned routes and tool annotations, the requests in flight, the body copies' budget. A
//! reloaded proxy serves new requests; a request already going keeps the proxy it began with.

use std::sync::Arc;

use http::Uri;

use super::Proxy;
use crate::classify::ExpectedRoutes;
use crate::config::{Config, HostHeader};
use crate::hold::{Health, OutageRoutes, Template};
use crate::metrics::Metrics;
use crate::proxy::answer::Answers;
use crate::proxy::attempt::Upstream;
use crate::proxy::sessions::Keeper;
use crate::proxy::{
    ending, handoff, health, in_flight, Bodies, Destination, Reading, Timeouts, ID_COPY_CAP,
};
use crate::replay::CopyBudget;
use crate::session::Table;
use crate::telemetry::trace::Tracing;
use crate::upstream::{self, Client};

/// What a proxy holds that outlives a reload.
struct Carried {
    hold: Arc<OutageRoutes>,
    sessions: Arc<Table>,
    idempotency: Arc<crate::idempotent::Idempotency>,
    routes: ExpectedRoutes,
    copy_budget: Arc<CopyBudget>,
    in_flight: Arc<in_flight::InFlight>,
    ending: Arc<ending::Ending>,
    /// This process's id among its peers.
    me: http::HeaderValue,
    /// Tracing, when on: started once, with holdfast.
    tracing: Option<Arc<Tracing>>,
    /// The era bridge's verdict and sessions.
    bridge: Arc<crate::bridge::Bridge>,
}

impl Proxy {
    /// Builds the proxy from validated configuration.
    pub fn new(cfg: &Config, metrics: Arc<Metrics>) -> Self {
        warn_if_unsaid_router(cfg);
        let client = client(cfg, &metrics);
        let carried = Carried {
            hold: Arc::new(OutageRoutes::new(
                template(cfg, &client, &metrics),
                cfg.routes.behind_router,
            )),
            sessions: Arc::new(Table::new(
                cfg.sessions.clone(),
                metrics.sessions_tracked.clone(),
            )),
            idempotency: Arc::new(crate::idempotent::Idempotency::new(
                cfg.retry.enabled,
                cfg.retry.learn_annotations,
                &cfg.retry.idempotent_tools,
                &cfg.retry.never_tools,
            )),
            routes: ExpectedRoutes::new(
                cfg.routes.endpoints.clone(),
                cfg.routes.learn,
                cfg.routes.learn_ttl,
            ),
            copy_budget: CopyBudget::new(cfg.hold.max_buffered_bytes),
            in_flight: Arc::default(),
            ending: Arc::default(),
            me: handoff::Peers::new_id(),
            tracing: None,
            bridge: Arc::new(crate::bridge::Bridge::new(
                &cfg.bridge,
                metrics.bridge.sessions.clone(),
            )),
        };
        Proxy::assemble(cfg, metrics, client, carried)
    }

    /// The proxy for `cfg` (a reload), carrying over what this one holds and has learned. Its
    /// upstream client is new (its settings may have changed): this one's pooled connections
    /// close with it, once the requests still using it are done. What `cfg` would change but
    /// cannot while holdfast runs is left as it is and named, by key.
    pub fn reconfigured(&self, cfg: &Config) -> (Proxy, Vec<&'static str>) {
        let client = client(cfg, &self.metrics);
        self.hold.reconfigure(
            template(cfg, &client, &self.metrics),
            cfg.routes.behind_router,
        );
        let fixed = self.keeper.sessions.reconfigure(&cfg.sessions);
        self.bodies.copy_budget.set_max(cfg.hold.max_buffered_bytes);
        let carried = Carried {
            hold: self.hold.clone(),
            sessions: self.keeper.sessions.clone(),
            idempotency: Arc::new(self.idempotency.reconfigured(
                cfg.retry.enabled,
                cfg.retry.learn_annotations,
                &cfg.retry.idempotent_tools,
                &cfg.retry.never_tools,
            )),
            routes: self.upstream.reading.routes.reconfigured(
                cfg.routes.endpoints.clone(),
                cfg.routes.learn,
                cfg.routes.learn_ttl,
            ),
            copy_budget: self.bodies.copy_budget.clone(),
            in_flight: self.in_flight.clone(),
            ending: self.ending.clone(),
            me: self.peers.me().clone(),
            tracing: self.tracing.clone(),
            bridge: {
                self.bridge.reconfigure(&cfg.bridge);
                self.bridge.clone()
            },
        };
        let proxy = Proxy::assemble(cfg, self.metrics.clone(), client, carried);
        (proxy, fixed)
    }

    fn assemble(cfg: &Config, metrics: Arc<Metrics>, client: Arc<Client>, c: Carried) -> Proxy {
        Proxy {
            dest: Destination::new(cfg),
            upstream: Upstream {
                client,
                reading: Reading {
                    signatures: cfg.routes.signatures.clone(),
                    routes: c.routes,
                    horizon: cfg.routes.horizon,
                    max_peek_bytes: cfg.routes.max_peek_bytes,
                },
                response_timeout: cfg.response_timeout,
                stream_idle: cfg.stream_idle_timeout,
                url: cfg.upstream.original.as_str().into(),
                hold: c.hold.clone(),
            },
            answers: Answers {
                metrics: metrics.clone(),
                stream_idle: cfg.stream_idle_timeout,
                ending: c.ending.clone(),
                idempotency: c.idempotency.clone(),
                hold: c.hold.clone(),
            },
            timeouts: Timeouts {
                stream_idle: cfg.stream_idle_timeout,
                pause_max: cfg.pause.max,
            },
            bodies: Bodies {
                replay_cap: if cfg.hold.enabled {
                    cfg.hold.max_body_bytes
                } else {
                    ID_COPY_CAP
                },
                copy_budget: c.copy_budget,
            },
            access_log: cfg.access_log,
            request_ids: crate::proxy::request_id::RequestIds::new(cfg.request_id.header.clone()),
            hold: c.hold,
            keeper: Keeper {
                sessions: c.sessions,
                metrics: metrics.clone(),
                resume_wait: cfg.hold.timeout,
                on_change: cfg.sessions.on_change,
            },
            idempotency: c.idempotency,
            in_flight: c.in_flight,
            ending: c.ending,
            peers: Arc::new(handoff::Peers::new(cfg, c.me, metrics.clone())),
            tracing: c.tracing,
            bridge: c.bridge,
            metrics,
            this: std::sync::Weak::new(),
        }
    }

    /// The same proxy, tracing its requests with `tracing` (started by the caller, which
    /// flushes it at the end).
    pub fn traced(self, tracing: Option<Arc<Tracing>>) -> Proxy {
        Proxy { tracing, ..self }
    }
}

/// The upstream client `cfg` asks for.
fn client(cfg: &Config, metrics: &Metrics) -> Arc<Client> {
    Arc::new(Client::new(
        cfg.upstream.base_uri(),
        cfg.connect_timeout,
        cfg.pool_idle_timeout,
        cfg.upstream_tls.as_ref().map(|t| t.config.clone()),
        metrics.upstream_closed.clone(),
        crate::upstream::ResponseLimits {
            max_headers: cfg.max_headers,
            max_head_bytes: cfg.max_header_bytes,
        },
        metrics.upstream_connections.clone(),
    ))
}

/// What every route's outage is made from.
fn template(cfg: &Config, client: &Arc<Client>, metrics: &Arc<Metrics>) -> Template {
    Template {
        cfg: cfg.hold.clone(),
        retry_after: cfg.retry_after,
        probe_uri: cfg.upstream.base_uri(),
        connector: upstream::Connector::new(cfg.connect_timeout),
        health: cfg
            .hold
            .probe_path
            .as_ref()
            .map(|path| health_check(cfg, client, http::Method::GET, path)),
        presence: presence_path(cfg)
            .map(|path| health_check(cfg, client, http::Method::OPTIONS, &path)),
        metrics: metrics.clone(),
    }
}

/// Warns when a router is assumed in front of an upstream on this host without being said.
fn warn_if_unsaid_router(cfg: &Config) {
    let unsaid = cfg.routes.behind_router && !cfg.routes.behind_router_said;
    if unsaid && is_loopback(cfg.upstream.authority.host()) {
        tracing::warn!(
            upstream = %cfg.upstream.original,
            "the upstream is on this host, as a sidecar's MCP server is, and routes.behind_router \
             is not set, so an answer that looks like a router's (a Go server's own 404 is byte \
             for byte Traefik's) is masked. Set routes.behind_router = false when nothing \
             sits in between, true to keep this and silence the warning"
        );
    }
}

/// The health check of `hold.probe_path`: a GET of `path` on the upstream, through the same
/// client as every request. A pause's presence check without it: `OPTIONS` on the first
/// endpoint under the upstream's path prefix (it answers without running anything, and a router
/// routes it as it routes the endpoint).
fn health_check(
    cfg: &Config,
    client: &Arc<Client>,
    method: http::Method,
    path: &http::uri::PathAndQuery,
) -> Arc<dyn Health> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(cfg.upstream.scheme());
    parts.authority = Some(cfg.upstream.authority.clone());
    parts.path_and_query = Some(path.clone());
    Arc::new(health::HealthCheck {
        client: client.clone(),
        method,
        uri: Uri::from_parts(parts).expect("scheme, authority and path make a URI"),
        upstream_host: http::HeaderValue::from_str(cfg.upstream.authority.as_str())
            .expect("an authority is a header value"),
        signatures: cfg.routes.signatures.clone(),
    })
}

/// Where a pause's presence check asks: the first endpoint, under the upstream's path prefix.
fn presence_path(cfg: &Config) -> Option<http::uri::PathAndQuery> {
    let endpoint = cfg.routes.endpoints.first().map_or("/", String::as_str);
    format!("{}{endpoint}", cfg.upstream.path_prefix)
        .parse()
        .ok()
}

/// Whether `host` names this machine: `localhost`, or a loopback address.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Destination {
    fn new(cfg: &Config) -> Self {
        Destination {
            url: cfg.upstream.clone(),
            origin: format!("{}://{}", cfg.upstream.scheme(), cfg.upstream.authority)
                .to_ascii_lowercase()
                .into(),
            scheme: cfg.upstream.scheme(),
            host: http::HeaderValue::from_str(cfg.upstream.authority.as_str())
                .expect("an authority is a header value"),
            host_header: cfg.host_header,
            client_proto: if cfg.tls.is_some() { "https" } else { "http" },
            trusted_proxies: cfg.trusted_proxies.clone(),
            note_hosts: cfg.host_header == HostHeader::Preserve,
        }
    }
}
