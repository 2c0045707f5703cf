//! Phase one: what figment deserializes, layer by layer, and the defaults every layer starts
//! from. Nothing here is checked; [`Config::from_raw`](super::Config::from_raw) does that.

use serde::{Deserialize, Serialize};

pub use crate::signature::{RawHeaderMatch, RawSignature};

/// The documented defaults, one constant each.
pub mod defaults {
    /// Proxy listener.
    pub const LISTEN: &str = "0.0.0.0:8080";
    /// Admin listener (metrics, health). Loopback so metrics are not exposed by accident.
    /// Not 9090 (Prometheus's own default, so a Prometheus on the same host would collide with
    /// holdfast or scrape itself), nor a common exporter's.
    pub const ADMIN: &str = "127.0.0.1:9362";
    /// `Retry-After` on synthetic 503s, in seconds. Short: a container recreation takes seconds.
    pub const RETRY_AFTER_SECS: u64 = 2;
    /// TCP connect timeout to the upstream. A missing container usually refuses at once; a
    /// blackholed address (a stale IP after recreation) needs this bound.
    pub const CONNECT_TIMEOUT_SECS: f64 = 2.0;
    /// Time allowed from sending a request to the upstream's response headers. Generous because
    /// an MCP tool call answered as JSON sends its headers only when the tool is done.
    pub const RESPONSE_TIMEOUT_SECS: f64 = 300.0;
    /// How long an idle pooled upstream connection is kept. Below the 5 s keep-alive of Node's
    /// http server and uvicorn (the TypeScript and Python SDKs' servers): the server must not close
    /// a connection just as holdfast sends a request on it (that request would get a 502).
    pub const POOL_IDLE_TIMEOUT_SECS: f64 = 4.0;
    /// Idle timeout between body frames (both directions). Reset by every frame; there is no
    /// total deadline, so an SSE stream with regular events lives as long as it likes.
    pub const STREAM_IDLE_TIMEOUT_SECS: f64 = 300.0;
    /// Paths on which a router's 404 means "the backend is missing".
    pub const ENDPOINTS: &[&str] = &["/mcp"];
    /// Route-missing 404s later than this after the last healthy answer pass through.
    pub const HORIZON_SECS: f64 = 120.0;
    /// How long a path the application answered counts as "known to exist".
    pub const LEARN_TTL_SECS: f64 = 3600.0;
    /// Most body bytes read from an error response to decide whether a router sent it.
    pub const MAX_PEEK_BYTES: usize = 4096;
    /// A router (Traefik, nginx, an ingress) sits between holdfast and the MCP server: the seed
    /// case, holdfast in front of Traefik's Docker provider.
    pub const BEHIND_ROUTER: bool = true;
    /// Built-in router signatures that are on by default.
    pub const PRESETS: &[&str] = &[
        "traefik-404",
        "traefik-503",
        "traefik-502",
        "traefik-504",
        "nginx-404",
        "nginx-502",
        "nginx-503",
        "nginx-504",
        "ingress-gce-404",
    ];
    /// Largest request head accepted from a client.
    pub const MAX_HEADER_BYTES: usize = 64 * 1024;
    /// Time a client has to send a complete request head (slowloris guard).
    pub const HEADER_READ_TIMEOUT_SECS: f64 = 120.0;
    /// How often an HTTP/2 client is pinged; it has two thirds of this to answer (20 s).
    pub const H2_PING_INTERVAL_SECS: f64 = 30.0;
    /// Concurrent client connections; at the limit the longest-idle one makes room, and with
    /// none idle accepting pauses until one closes or turns idle.
    /// From the memory budget (README, "Memory"): 4096 connections, each an open stream, fit
    /// the shipped 256 MiB limit with the held bodies on top.
    pub const MAX_CONNECTIONS: usize = 4096;
    /// Most header lines in a request head or an upstream response head: hyper's default, and
    /// HAProxy's (`tune.http.maxhdr` 101). A larger count costs a heap allocation per request.
    pub const MAX_HEADERS: usize = 100;
    /// Time in-flight requests get to finish after SIGTERM before streams are closed. Below
    /// Kubernetes' default 30 s grace period, so holdfast closes streams itself before SIGKILL.
    pub const DRAIN_TIMEOUT_SECS: f64 = 20.0;
    /// Time after SIGTERM during which new connections are still accepted and served, with
    /// readiness already failing: none by default (a standalone holdfast has nobody to tell).
    pub const ACCEPT_GRACE_SECS: f64 = 0.0;
    /// Hold requests while the backend is missing and replay them once it is back.
    pub const HOLD_ENABLED: bool = true;
    /// Longest a request is held before it gets the 503: below the TypeScript SDK client's
    /// default request timeout (60 s, the client most desktop tools use) and nginx's default
    /// `proxy_read_timeout` (60 s), so a recreation of up to 50 s (an image pulled, a cache
    /// warmed) is held through, and one longer gets holdfast's 503 before the client or the
    /// router in front gives up with an error of its own (docs/holding.md "How long the client
    /// waits"). A client that gives up first is never sent anything.
    pub const HOLD_TIMEOUT_SECS: f64 = 50.0;
    /// Largest request body kept for a replay (MCP requests are small JSON documents).
    pub const HOLD_MAX_BODY_BYTES: usize = 1024 * 1024;
    /// Most requests held at once. From the memory budget (README, "Memory"): a full hold and
    /// its release fit in 128 MiB, half the shipped Kubernetes limit.
    pub const HOLD_MAX_REQUESTS: usize = 2048;
    /// Most request-body bytes held at once, over all held requests (in the memory budget).
    pub const HOLD_MAX_BUFFERED_BYTES: usize = 32 * 1024 * 1024;
    /// First probe delay of an outage (Envoy's retry backoff base).
    pub const HOLD_BACKOFF_INITIAL_MS: u64 = 25;
    /// Longest probe delay.
    pub const HOLD_BACKOFF_MAX_MS: u64 = 250;
    /// How often the upstream is checked without traffic, with `hold.probe_path` (a tenth of
    /// the default alert's 2 min, so it settles well before).
    pub const HOLD_CHECK_INTERVAL_SECS: f64 = 10.0;
    /// `observed` (from past outages) or `fixed` (`retry_after_secs`).
    pub const HOLD_RETRY_AFTER: &str = "observed";
    /// Bounds of an observed Retry-After.
    pub const HOLD_RETRY_AFTER_MIN_SECS: u64 = 1;
    /// Upper bound of an observed Retry-After.
    pub const HOLD_RETRY_AFTER_MAX_SECS: u64 = 30;
    /// Log format.
    pub const LOG_FORMAT: &str = "text";
    /// What is logged, as a `RUST_LOG`-style filter (`RUST_LOG` wins when set).
    pub const LOG_LEVEL: &str = "info";
    /// Per-request access log.
    pub const ACCESS_LOG: bool = false;
    /// Which Host the upstream sees.
    pub const HOST_HEADER: &str = "preserve";
    /// Learn expected paths from the application's answers.
    pub const LEARN: bool = true;
    /// How often the listener's certificate files are read to see whether they changed. Cheap
    /// (two small files); Kubernetes takes up to a minute or so to update a mounted Secret anyway.
    pub const TLS_RELOAD_INTERVAL_SECS: f64 = 5.0;
    /// Verify the upstream's certificate (the switch that turns it off is loud on purpose).
    pub const INSECURE_SKIP_VERIFY: bool = false;
    /// Carry MCP sessions across backend restarts: what a spec-following client does anyway.
    pub const SESSIONS_RESUME: bool = true;
    /// Most sessions tracked; past it the least recently used are forgotten. About 1 KiB each
    /// with a typical `initialize`.
    pub const SESSIONS_MAX_TRACKED: usize = 100_000;
    /// Largest `initialize` body recorded; a larger one is forwarded but its session not tracked.
    pub const SESSIONS_MAX_INITIALIZE_BYTES: usize = 64 * 1024;
    /// Most recorded bytes over all sessions (initialize bodies and subscription URIs).
    pub const SESSIONS_MAX_RECORDED_BYTES: usize = 64 * 1024 * 1024;
    /// A session without a request for this long is forgotten: a day, so an IDE left open
    /// overnight keeps its session.
    pub const SESSIONS_IDLE_TIMEOUT_SECS: f64 = 86_400.0;
    /// A session token older than this is not used to re-establish its session: a week, so a
    /// session outlives a weekend but a leaked id does not open a session for ever.
    pub const SESSIONS_TOKEN_MAX_AGE_SECS: f64 = 7.0 * 86_400.0;
    /// Send a request that may have reached the application once more after an ambiguous
    /// failure, when repeating it is safe (read-only methods, idempotent tools).
    pub const RETRY_ENABLED: bool = true;
    /// Learn which tools are safe from the annotations in `tools/list` answers.
    pub const RETRY_LEARN_ANNOTATIONS: bool = true;
    /// Longest a pause lasts before holdfast resumes by itself. A planned restart (drain, stop,
    /// start) takes seconds; MCP clients' own request timeouts are typically 60 s, so a request
    /// held since the pause began is released before most clients give up on it.
    pub const PAUSE_MAX_SECS: f64 = 60.0;
}

/// Phase one: what figment deserializes. Every field optional-by-default so that each layer may
/// set any subset; unknown keys are errors (a typo must not be silently ignored).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    /// Proxy listen address.
    pub listen: String,
    /// Upstream base URL (`http[s]://host:port[/prefix]`).
    pub upstream: String,
    /// Admin listen address.
    pub admin: String,
    /// `Retry-After` seconds on synthetic 503s.
    #[serde(deserialize_with = "super::duration::whole_secs")]
    pub retry_after_secs: u64,
    /// `text` or `json`.
    pub log_format: String,
    /// What is logged: a level or a `RUST_LOG`-style filter.
    pub log_level: String,
    /// One log line per request (target `holdfast::access`).
    pub access_log: bool,
    /// Upstream connection settings.
    pub client: RawClient,
    /// Stream settings.
    pub streams: RawStreams,
    /// Route-missing detection.
    pub routes: RawRoutes,
    /// Inbound limits.
    pub limits: RawLimits,
    /// Shutdown behaviour.
    pub shutdown: RawShutdown,
    /// Hold and replay.
    pub hold: RawHold,
    /// TLS on the proxy listener.
    pub tls: RawTls,
    /// Session continuity.
    pub sessions: super::RawSessions,
    /// `[retry]`.
    pub retry: RawRetry,
    /// `[pause]`.
    pub pause: RawPause,
    /// `[peers]`.
    pub peers: super::RawPeers,
    /// `[forwarded]`.
    pub forwarded: super::RawForwarded,
    /// `[request_id]`.
    pub request_id: super::RawRequestId,
    /// `[tracing]`.
    pub tracing: super::RawTracing,
    /// `[bridge]`.
    pub bridge: super::RawBridge,
    /// A file holding the bearer token that the admin endpoints which change state (`POST
    /// /pause`, `POST /resume`) require; unset: only loopback peers may call them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<String>,
}

/// `[pause]`: planned restarts (`holdfast pause`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPause {
    /// Longest a pause lasts before holdfast resumes by itself.
    #[serde(deserialize_with = "super::duration::secs")]
    pub max_secs: f64,
}

impl Default for RawPause {
    fn default() -> Self {
        Self {
            max_secs: defaults::PAUSE_MAX_SECS,
        }
    }
}

/// `[retry]`: sending a request that may have reached the application once more, when doing so
/// is safe.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetry {
    /// On or off.
    pub enabled: bool,
    /// Learn safe tools from `tools/list` annotations.
    pub learn_annotations: bool,
    /// Tools that are safe to call twice, whatever the server announces.
    pub idempotent_tools: Vec<String>,
    /// Tools never called twice, whatever the server announces.
    pub never_tools: Vec<String>,
}

impl Default for RawRetry {
    fn default() -> Self {
        Self {
            enabled: defaults::RETRY_ENABLED,
            learn_annotations: defaults::RETRY_LEARN_ANNOTATIONS,
            idempotent_tools: Vec::new(),
            never_tools: Vec::new(),
        }
    }
}

/// `[tls]`: TLS on the proxy listener. Off unless both `cert` and `key` are set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTls {
    /// PEM certificate chain, leaf first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// PEM private key of the leaf certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// PEM CA bundle; when set, clients must present a certificate it issued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<String>,
    /// How often the certificate and key files are checked for changes.
    #[serde(deserialize_with = "super::duration::secs")]
    pub reload_interval_secs: f64,
    /// Whether a returning client may resume its TLS session (an abbreviated handshake) instead
    /// of a full one.
    pub session_resumption: bool,
}

impl Default for RawTls {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            reload_interval_secs: defaults::TLS_RELOAD_INTERVAL_SECS,
            session_resumption: true,
        }
    }
}

/// `[hold]`: holding requests while the backend is missing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHold {
    /// Hold (true) or answer 503 at once (false).
    pub enabled: bool,
    /// Longest hold.
    #[serde(deserialize_with = "super::duration::secs")]
    pub timeout_secs: f64,
    /// Largest body kept for a replay.
    pub max_body_bytes: usize,
    /// Most held requests.
    pub max_requests: usize,
    /// Most body bytes held in all.
    pub max_buffered_bytes: usize,
    /// First probe delay.
    #[serde(deserialize_with = "super::duration::whole_ms")]
    pub backoff_initial_ms: u64,
    /// Longest probe delay.
    #[serde(deserialize_with = "super::duration::whole_ms")]
    pub backoff_max_ms: u64,
    /// `observed` or `fixed`.
    pub retry_after: String,
    /// Lower bound of an observed Retry-After.
    #[serde(deserialize_with = "super::duration::whole_secs")]
    pub retry_after_min_secs: u64,
    /// Upper bound of an observed Retry-After.
    #[serde(deserialize_with = "super::duration::whole_secs")]
    pub retry_after_max_secs: u64,
    /// A path on the upstream whose answer says the application is there; empty: none.
    pub probe_path: String,
    /// How often the upstream is checked without traffic (with `probe_path`); 0: never.
    #[serde(deserialize_with = "super::duration::secs")]
    pub check_interval_secs: f64,
}

impl Default for RawHold {
    fn default() -> Self {
        Self {
            enabled: defaults::HOLD_ENABLED,
            timeout_secs: defaults::HOLD_TIMEOUT_SECS,
            max_body_bytes: defaults::HOLD_MAX_BODY_BYTES,
            max_requests: defaults::HOLD_MAX_REQUESTS,
            max_buffered_bytes: defaults::HOLD_MAX_BUFFERED_BYTES,
            backoff_initial_ms: defaults::HOLD_BACKOFF_INITIAL_MS,
            backoff_max_ms: defaults::HOLD_BACKOFF_MAX_MS,
            retry_after: defaults::HOLD_RETRY_AFTER.into(),
            retry_after_min_secs: defaults::HOLD_RETRY_AFTER_MIN_SECS,
            retry_after_max_secs: defaults::HOLD_RETRY_AFTER_MAX_SECS,
            probe_path: String::new(),
            check_interval_secs: defaults::HOLD_CHECK_INTERVAL_SECS,
        }
    }
}

/// `[client]`: how holdfast talks to the upstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawClient {
    /// `preserve` (the client's Host) or `upstream` (the upstream URL's authority).
    pub host_header: String,
    /// TCP connect timeout.
    #[serde(deserialize_with = "super::duration::secs")]
    pub connect_timeout_secs: f64,
    /// Time from sending to response headers.
    #[serde(deserialize_with = "super::duration::secs")]
    pub response_timeout_secs: f64,
    /// Idle pooled connection lifetime.
    #[serde(deserialize_with = "super::duration::secs")]
    pub pool_idle_timeout_secs: f64,
    /// PEM CA bundle that an `https://` upstream's certificate must chain to (instead of the
    /// system's roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// PEM client certificate chain for an upstream that asks for one (mTLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// PEM private key of `cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Accept any certificate from an `https://` upstream. Insecure; logs a warning at start.
    pub insecure_skip_verify: bool,
}

/// `[streams]`: body timeouts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStreams {
    /// Idle timeout between body frames, both directions.
    #[serde(deserialize_with = "super::duration::secs")]
    pub idle_timeout_secs: f64,
}

/// `[routes]`: when is a 404 the router's and not the application's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRoutes {
    /// Whether a router sits between holdfast and the MCP server (signatures apply only then).
    /// Unset means yes, with a warning when the upstream is on this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind_router: Option<bool>,
    /// Path prefixes where the route is expected to exist.
    pub endpoints: Vec<String>,
    /// Also treat paths the application answered recently as expected.
    pub learn: bool,
    /// How long a learned path stays expected.
    #[serde(deserialize_with = "super::duration::secs")]
    pub learn_ttl_secs: f64,
    /// Route-missing answers later than this after the last healthy answer pass through.
    #[serde(deserialize_with = "super::duration::secs")]
    pub horizon_secs: f64,
    /// Most body bytes read to match a signature.
    pub max_peek_bytes: usize,
    /// Built-in signatures to use (names from [`crate::signature::Preset`]).
    pub presets: Vec<String>,
    /// User-defined signatures.
    pub signatures: Vec<RawSignature>,
}

/// `[limits]`: protection against misbehaving clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Time to receive a full request head.
    #[serde(deserialize_with = "super::duration::secs")]
    pub header_read_timeout_secs: f64,
    /// Concurrent client connections.
    pub max_connections: usize,
    /// Most header lines in a head, both ways.
    pub max_headers: usize,
    /// HTTP/2 ping interval towards clients.
    pub h2_ping_interval_secs: f64,
}

/// `[shutdown]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawShutdown {
    /// Time after SIGTERM during which new connections are still accepted.
    #[serde(deserialize_with = "super::duration::secs")]
    pub accept_grace_secs: f64,
    /// Time in-flight requests get after SIGTERM (after the accept grace).
    #[serde(deserialize_with = "super::duration::secs")]
    pub drain_timeout_secs: f64,
}

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            listen: defaults::LISTEN.into(),
            upstream: String::new(),
            admin: defaults::ADMIN.into(),
            retry_after_secs: defaults::RETRY_AFTER_SECS,
            log_format: defaults::LOG_FORMAT.into(),
            log_level: defaults::LOG_LEVEL.into(),
            access_log: defaults::ACCESS_LOG,
            client: RawClient::default(),
            streams: RawStreams::default(),
            routes: RawRoutes::default(),
            limits: RawLimits::default(),
            shutdown: RawShutdown::default(),
            hold: RawHold::default(),
            tls: RawTls::default(),
            sessions: super::RawSessions::default(),
            retry: RawRetry::default(),
            pause: RawPause::default(),
            peers: super::RawPeers::default(),
            forwarded: super::RawForwarded::default(),
            request_id: super::RawRequestId::default(),
            tracing: super::RawTracing::default(),
            bridge: super::RawBridge::default(),
            admin_token_file: None,
        }
    }
}

impl Default for RawClient {
    fn default() -> Self {
        Self {
            host_header: defaults::HOST_HEADER.into(),
            connect_timeout_secs: defaults::CONNECT_TIMEOUT_SECS,
            response_timeout_secs: defaults::RESPONSE_TIMEOUT_SECS,
            pool_idle_timeout_secs: defaults::POOL_IDLE_TIMEOUT_SECS,
            ca: None,
            cert: None,
            key: None,
            insecure_skip_verify: defaults::INSECURE_SKIP_VERIFY,
        }
    }
}

impl Default for RawStreams {
    fn default() -> Self {
        Self {
            idle_timeout_secs: defaults::STREAM_IDLE_TIMEOUT_SECS,
        }
    }
}

impl Default for RawRoutes {
    fn default() -> Self {
        Self {
            behind_router: None,
            endpoints: defaults::ENDPOINTS.iter().map(|s| s.to_string()).collect(),
            learn: defaults::LEARN,
            learn_ttl_secs: defaults::LEARN_TTL_SECS,
            horizon_secs: defaults::HORIZON_SECS,
            max_peek_bytes: defaults::MAX_PEEK_BYTES,
            presets: defaults::PRESETS.iter().map(|s| s.to_string()).collect(),
            signatures: Vec::new(),
        }
    }
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_header_bytes: defaults::MAX_HEADER_BYTES,
            header_read_timeout_secs: defaults::HEADER_READ_TIMEOUT_SECS,
            max_connections: defaults::MAX_CONNECTIONS,
            max_headers: defaults::MAX_HEADERS,
            h2_ping_interval_secs: defaults::H2_PING_INTERVAL_SECS,
        }
    }
}

impl Default for RawShutdown {
    fn default() -> Self {
        Self {
            accept_grace_secs: defaults::ACCEPT_GRACE_SECS,
            drain_timeout_secs: defaults::DRAIN_TIMEOUT_SECS,
        }
    }
}

/// Values given as flags. `None` means "not given", so lower layers show through.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RawFlags {
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// `--admin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// `--retry-after`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    /// `--log-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<String>,
    /// `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// `--access-log`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
    /// `--tls-cert`, `--tls-key`.
    #[serde(skip_serializing_if = "RawTlsFlags::is_empty")]
    pub tls: RawTlsFlags,
    /// `--request-id-header`.
    #[serde(skip_serializing_if = "super::RawRequestIdFlags::is_empty")]
    pub request_id: super::RawRequestIdFlags,
}

/// Flags of the `[tls]` section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RawTlsFlags {
    /// `--tls-cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// `--tls-key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl RawTlsFlags {
    /// No TLS flag given.
    pub fn is_empty(&self) -> bool {
        self.cert.is_none() && self.key.is_none()
    }
}
