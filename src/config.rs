//! Configuration in two phases.
//!
//! Phase one ([`RawConfig`]) is a plain serde struct that figment fills from, in rising order of
//! precedence: built-in defaults, a TOML file (`--config FILE` or `HOLDFAST_CONFIG`), the
//! environment (`HOLDFAST_` prefix, `__` between nested keys) and command-line flags. Phase two
//! ([`Config::from_raw`]) checks every value, reports *every* problem at once, each naming its key
//! and the layer it came from, and produces the validated [`Config`] that the rest of the crate
//! uses. Nothing outside this module sees a raw value.
//!
//! Every default lives in [`defaults`] and is documented in `config/holdfast.toml`.
//!
//! Validation reads the TLS files (certificates, keys, CA bundles, the system's roots for an
//! `https://` upstream), so that `check-config` reports a certificate that does not load, and the
//! proxy starts with what was checked.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use http::Uri;
use serde::{Deserialize, Serialize};

pub use crate::signature::{RawHeaderMatch, RawSignature};
use crate::tls::{self, Identity, TlsError};

/// The documented defaults, one constant each.
pub mod defaults {
    /// Proxy listener.
    pub const LISTEN: &str = "0.0.0.0:8080";
    /// Admin listener (metrics, health). Loopback so metrics are not exposed by accident.
    pub const ADMIN: &str = "127.0.0.1:9090";
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
    /// Built-in router signatures that are on by default.
    pub const PRESETS: &[&str] = &[
        "traefik-404",
        "traefik-503",
        "traefik-502",
        "traefik-504",
        "nginx-404",
        "ingress-gce-404",
    ];
    /// Largest request head accepted from a client.
    pub const MAX_HEADER_BYTES: usize = 64 * 1024;
    /// Time a client has to send a complete request head (slowloris guard).
    pub const HEADER_READ_TIMEOUT_SECS: f64 = 120.0;
    /// Concurrent client connections; past this, accepting pauses until one closes.
    pub const MAX_CONNECTIONS: usize = 10_000;
    /// Time in-flight requests get to finish after SIGTERM before streams are closed. Below
    /// Kubernetes' default 30 s grace period, so holdfast closes streams itself before SIGKILL.
    pub const DRAIN_TIMEOUT_SECS: f64 = 20.0;
    /// Hold requests while the backend is missing and replay them once it is back.
    pub const HOLD_ENABLED: bool = true;
    /// Longest a request is held before it gets the 503. A container recreation usually takes a
    /// few seconds; MCP clients' own request timeouts are typically 30 s or more.
    pub const HOLD_TIMEOUT_SECS: f64 = 15.0;
    /// Largest request body kept for a replay (MCP requests are small JSON documents).
    pub const HOLD_MAX_BODY_BYTES: usize = 1024 * 1024;
    /// Most requests held at once (Knative's activator queue is 10 000 deep too).
    pub const HOLD_MAX_REQUESTS: usize = 10_000;
    /// Most request-body bytes held at once, over all held requests.
    pub const HOLD_MAX_BUFFERED_BYTES: usize = 64 * 1024 * 1024;
    /// First probe delay of an outage (Envoy's retry backoff base).
    pub const HOLD_BACKOFF_INITIAL_MS: u64 = 25;
    /// Longest probe delay.
    pub const HOLD_BACKOFF_MAX_MS: u64 = 250;
    /// `observed` (from past outages) or `fixed` (`retry_after_secs`).
    pub const HOLD_RETRY_AFTER: &str = "observed";
    /// Bounds of an observed Retry-After.
    pub const HOLD_RETRY_AFTER_MIN_SECS: u64 = 1;
    /// Upper bound of an observed Retry-After.
    pub const HOLD_RETRY_AFTER_MAX_SECS: u64 = 30;
    /// Log format.
    pub const LOG_FORMAT: &str = "text";
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
    pub retry_after_secs: u64,
    /// `text` or `json`.
    pub log_format: String,
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
    pub sessions: RawSessions,
}

/// `[sessions]`: carrying MCP sessions across backend restarts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSessions {
    /// Re-establish a session the restarted server forgot.
    pub resume: bool,
    /// Most sessions tracked.
    pub max_tracked: usize,
    /// Largest `initialize` body recorded.
    pub max_initialize_bytes: usize,
    /// Most recorded bytes over all sessions.
    pub max_recorded_bytes: usize,
    /// Idle time after which a session is forgotten.
    pub idle_timeout_secs: f64,
}

impl Default for RawSessions {
    fn default() -> Self {
        Self {
            resume: defaults::SESSIONS_RESUME,
            max_tracked: defaults::SESSIONS_MAX_TRACKED,
            max_initialize_bytes: defaults::SESSIONS_MAX_INITIALIZE_BYTES,
            max_recorded_bytes: defaults::SESSIONS_MAX_RECORDED_BYTES,
            idle_timeout_secs: defaults::SESSIONS_IDLE_TIMEOUT_SECS,
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
    pub reload_interval_secs: f64,
}

impl Default for RawTls {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            reload_interval_secs: defaults::TLS_RELOAD_INTERVAL_SECS,
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
    pub timeout_secs: f64,
    /// Largest body kept for a replay.
    pub max_body_bytes: usize,
    /// Most held requests.
    pub max_requests: usize,
    /// Most body bytes held in all.
    pub max_buffered_bytes: usize,
    /// First probe delay.
    pub backoff_initial_ms: u64,
    /// Longest probe delay.
    pub backoff_max_ms: u64,
    /// `observed` or `fixed`.
    pub retry_after: String,
    /// Lower bound of an observed Retry-After.
    pub retry_after_min_secs: u64,
    /// Upper bound of an observed Retry-After.
    pub retry_after_max_secs: u64,
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
    pub connect_timeout_secs: f64,
    /// Time from sending to response headers.
    pub response_timeout_secs: f64,
    /// Idle pooled connection lifetime.
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
    pub idle_timeout_secs: f64,
}

/// `[routes]`: when is a 404 the router's and not the application's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRoutes {
    /// Path prefixes where the route is expected to exist.
    pub endpoints: Vec<String>,
    /// Also treat paths the application answered recently as expected.
    pub learn: bool,
    /// How long a learned path stays expected.
    pub learn_ttl_secs: f64,
    /// Route-missing answers later than this after the last healthy answer pass through.
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
    pub header_read_timeout_secs: f64,
    /// Concurrent client connections.
    pub max_connections: usize,
}

/// `[shutdown]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawShutdown {
    /// Time in-flight requests get after SIGTERM.
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
            access_log: defaults::ACCESS_LOG,
            client: RawClient::default(),
            streams: RawStreams::default(),
            routes: RawRoutes::default(),
            limits: RawLimits::default(),
            shutdown: RawShutdown::default(),
            hold: RawHold::default(),
            tls: RawTls::default(),
            sessions: RawSessions::default(),
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
        }
    }
}

impl Default for RawShutdown {
    fn default() -> Self {
        Self {
            drain_timeout_secs: defaults::DRAIN_TIMEOUT_SECS,
        }
    }
}

/// Phase two: the validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Proxy listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin: SocketAddr,
    /// Upstream base.
    pub upstream: UpstreamUrl,
    /// `Retry-After` on synthetic 503s.
    pub retry_after: Duration,
    /// Log output format.
    pub log_format: LogFormat,
    /// Whether to log one line per request.
    pub access_log: bool,
    /// Which Host header the upstream sees.
    pub host_header: HostHeader,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Time from sending to response headers.
    pub response_timeout: Duration,
    /// Idle pooled connection lifetime.
    pub pool_idle_timeout: Duration,
    /// Idle timeout between body frames.
    pub stream_idle_timeout: Duration,
    /// Route-missing detection settings.
    pub routes: Routes,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Time to receive a request head.
    pub header_read_timeout: Duration,
    /// Concurrent client connections.
    pub max_connections: usize,
    /// Drain time on shutdown.
    pub drain_timeout: Duration,
    /// Hold and replay.
    pub hold: Hold,
    /// TLS on the proxy listener (`None`: plain HTTP).
    pub tls: Option<InboundTls>,
    /// TLS to an `https://` upstream (`None` for `http://`).
    pub upstream_tls: Option<UpstreamTls>,
    /// Session continuity.
    pub sessions: Sessions,
}

/// Validated `[sessions]`.
#[derive(Debug, Clone)]
pub struct Sessions {
    /// Re-establish a session the restarted server forgot.
    pub resume: bool,
    /// Most sessions tracked.
    pub max_tracked: usize,
    /// Largest `initialize` body recorded.
    pub max_initialize_bytes: usize,
    /// Most recorded bytes over all sessions.
    pub max_recorded_bytes: usize,
    /// Idle time after which a session is forgotten.
    pub idle_timeout: Duration,
    /// Longest a request waits for another request's resume of its session: the hold timeout,
    /// the same bound as any other wait for the backend.
    pub resume_wait: Duration,
}

/// Validated `[tls]`: the listener's certificate, as loaded, and where to reload it from.
#[derive(Clone)]
pub struct InboundTls {
    /// Certificate chain file (`tls.cert`).
    pub cert: PathBuf,
    /// Private key file (`tls.key`).
    pub key: PathBuf,
    /// CA bundle for client certificates (`tls.client_ca`).
    pub client_ca: Option<PathBuf>,
    /// How often the files are checked for changes.
    pub reload_interval: Duration,
    /// The certificate and key as loaded during validation: served until the files change.
    pub identity: Identity,
    /// Verifies client certificates, when `client_ca` is set.
    pub client_verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
}

impl fmt::Debug for InboundTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .field("reload_interval", &self.reload_interval)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Validated TLS settings for an `https://` upstream (`client.ca`, `client.cert`, `client.key`,
/// `client.insecure_skip_verify`).
#[derive(Clone)]
pub struct UpstreamTls {
    /// What the connector uses: trust, client certificate, ALPN.
    pub config: Arc<rustls::ClientConfig>,
    /// Where trust comes from.
    pub verify: UpstreamVerify,
    /// The client certificate file, when one is sent.
    pub client_cert: Option<PathBuf>,
    /// Whether `h2` is offered by ALPN (only with `client.host_header = "upstream"`: see
    /// `Validator::upstream_tls`).
    pub offers_h2: bool,
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("verify", &self.verify)
            .field("client_cert", &self.client_cert)
            .field("offers_h2", &self.offers_h2)
            .finish_non_exhaustive()
    }
}

/// How an `https://` upstream's certificate is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamVerify {
    /// Against the operating system's roots.
    SystemRoots,
    /// Against the CA bundle in `client.ca`.
    Ca(PathBuf),
    /// Not at all (`client.insecure_skip_verify = true`).
    InsecureSkipVerify,
}

/// Validated `[hold]`.
#[derive(Debug, Clone)]
pub struct Hold {
    /// Hold requests (true) or answer 503 at once.
    pub enabled: bool,
    /// Longest hold of one request.
    pub timeout: Duration,
    /// Largest body kept for a replay.
    pub max_body_bytes: usize,
    /// Most held requests.
    pub max_requests: usize,
    /// Most body bytes held in all.
    pub max_buffered_bytes: usize,
    /// First probe delay.
    pub backoff_initial: Duration,
    /// Longest probe delay.
    pub backoff_max: Duration,
    /// How Retry-After is chosen.
    pub retry_after: RetryAfter,
    /// Bounds of an observed Retry-After.
    pub retry_after_min: Duration,
    /// Upper bound of an observed Retry-After.
    pub retry_after_max: Duration,
}

/// How the Retry-After of a synthetic 503 is chosen while holding is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// From the outages seen so far, minus the time already waited, within bounds.
    Observed,
    /// Always `retry_after_secs`.
    Fixed,
}

/// Validated `[routes]`.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Path prefixes (segment-aligned) where the route is expected.
    pub endpoints: Vec<String>,
    /// Learn expected paths from the application's answers.
    pub learn: bool,
    /// Lifetime of a learned path.
    pub learn_ttl: Duration,
    /// Horizon after which route-missing 404s pass through.
    pub horizon: Duration,
    /// Most bytes peeked from a candidate body.
    pub max_peek_bytes: usize,
    /// Every active signature, presets first, in match order.
    pub signatures: Vec<crate::signature::Signature>,
}

/// The upstream base URL, split into what the proxy needs per request.
#[derive(Debug, Clone)]
pub struct UpstreamUrl {
    /// The URL as configured (for logs).
    pub original: String,
    /// `host:port` of the upstream.
    pub authority: http::uri::Authority,
    /// Path prefix without a trailing slash (`""` when none).
    pub path_prefix: String,
    /// `https://`: connections are TLS.
    pub tls: bool,
}

impl UpstreamUrl {
    /// `http` or `https`.
    pub fn scheme(&self) -> http::uri::Scheme {
        if self.tls {
            http::uri::Scheme::HTTPS
        } else {
            http::uri::Scheme::HTTP
        }
    }

    /// `scheme://authority/`: where connections go (the TCP probe's target; the scheme gives the
    /// default port).
    pub fn base_uri(&self) -> Uri {
        Uri::builder()
            .scheme(self.scheme())
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .expect("scheme, authority and path are valid")
    }
}

/// Which `Host` header the upstream sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostHeader {
    /// The client's Host (MCP SDK servers check it against their allowed hosts).
    Preserve,
    /// The upstream URL's authority.
    Upstream,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// One problem found while loading or validating the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The dotted key at fault (`client.connect_timeout_secs`).
    pub key: String,
    /// Where the value came from (`default`, `file PATH`, `environment variable HOLDFAST_…`,
    /// `command-line flag`, `not set`).
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {}): {}", self.key, self.origin, self.message)
    }
}

/// Every problem found, reported together so a user fixes them in one round.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    /// The problems, in key order of discovery.
    pub problems: Vec<Problem>,
}

/// Name of the environment variable that points at the config file.
pub const CONFIG_ENV: &str = "HOLDFAST_CONFIG";
/// Prefix of environment variables that set keys.
pub const ENV_PREFIX: &str = "HOLDFAST_";

/// Builds the layered figment: defaults < file < environment < flags.
///
/// `file` is the `--config` flag; when absent `HOLDFAST_CONFIG` is consulted. `flags` holds only
/// the values the user actually passed on the command line.
pub fn figment(file: Option<&Path>, flags: &RawFlags) -> Figment {
    let file: Option<PathBuf> = file
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from));
    let mut fig = Figment::from(Named(
        Serialized::defaults(RawConfig::default()),
        ORIGIN_DEFAULT,
    ));
    if let Some(path) = file {
        // `file_exact`: a missing file is an error, not silently an empty layer.
        fig = fig.merge(Toml::file_exact(path));
    }
    fig.merge(
        Env::prefixed(ENV_PREFIX)
            .split("__")
            // HOLDFAST_CONFIG names the file; it is not a key.
            .ignore(&["config"])
            // Kubernetes injects service links for a Service named `holdfast` into every pod
            // (HOLDFAST_PORT=tcp://…, HOLDFAST_SERVICE_HOST, HOLDFAST_PORT_8080_TCP_ADDR, …).
            // They are not settings; without this filter they would be unknown keys.
            .filter(|key| {
                let key = key.as_str().to_ascii_lowercase();
                !(key == "port" || key.starts_with("port_") || key.starts_with("service_"))
            }),
    )
    .merge(Named(Serialized::defaults(flags), ORIGIN_FLAG))
}

const ORIGIN_DEFAULT: &str = "default";
const ORIGIN_FLAG: &str = "command-line flag";

/// A provider under a name of our choosing, so errors can say "default" or "command-line flag"
/// instead of figment's generic name for both serialized layers.
struct Named<P>(P, &'static str);

impl<P: figment::Provider> figment::Provider for Named<P> {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(self.1)
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        self.0.data()
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
    /// `--access-log`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
    /// `--tls-cert`, `--tls-key`.
    #[serde(skip_serializing_if = "RawTlsFlags::is_empty")]
    pub tls: RawTlsFlags,
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

/// Loads and validates: the one entry point the binary uses.
pub fn load(file: Option<&Path>, flags: &RawFlags) -> Result<Config, ConfigError> {
    Config::from_figment(&figment(file, flags))
}

impl Config {
    /// Extracts the raw layer from `fig` and validates it, naming origins from `fig`'s metadata.
    ///
    /// serde stops at the first unknown key or mistyped value, so extraction is repeated with
    /// each offending key removed until it succeeds; validation then runs on the rest, and every
    /// problem found on the way is reported together.
    pub fn from_figment(fig: &Figment) -> Result<Config, ConfigError> {
        let origin = |key: &str| describe_origin(key, fig.find_metadata(key));
        // Reading the layers themselves (a missing file, TOML syntax) is fatal: there is nothing
        // to validate.
        let mut data: figment::value::Dict = fig.extract().map_err(|e| ConfigError {
            problems: e
                .into_iter()
                .map(|e| Problem {
                    key: "(configuration)".into(),
                    origin: e
                        .metadata
                        .as_ref()
                        .map(|md| describe_origin("", Some(md)))
                        .unwrap_or_else(|| "configuration".into()),
                    message: e.kind.to_string().trim().to_string(),
                })
                .collect(),
        })?;
        let mut problems = Vec::new();
        let raw = loop {
            match Figment::from(Serialized::defaults(&data)).extract::<RawConfig>() {
                Ok(raw) => break raw,
                Err(errors) => {
                    let mut removed_any = false;
                    for e in errors {
                        let key = e.path.join(".");
                        problems.push(Problem {
                            origin: origin(&key),
                            key: if key.is_empty() {
                                "(top level)".into()
                            } else {
                                key
                            },
                            message: e.kind.to_string(),
                        });
                        removed_any |= remove_path(&mut data, &e.path);
                    }
                    if !removed_any {
                        return Err(ConfigError { problems });
                    }
                }
            }
        };
        match Config::from_raw(&raw, &origin) {
            Ok(config) if problems.is_empty() => Ok(config),
            Ok(_) => Err(ConfigError { problems }),
            Err(e) => {
                // A removed key falls back to its default, which may fail validation again
                // (`upstream`): report each key once.
                for p in e.problems {
                    if !problems.iter().any(|q| q.key == p.key) {
                        problems.push(p);
                    }
                }
                Err(ConfigError { problems })
            }
        }
    }

    /// Validates `raw`. `origin(key)` names the layer a key came from, for error messages.
    pub fn from_raw(
        raw: &RawConfig,
        origin: &dyn Fn(&str) -> String,
    ) -> Result<Config, ConfigError> {
        let mut v = Validator {
            problems: Vec::new(),
            origin,
        };

        let listen = v.socket_addr("listen", &raw.listen);
        let admin = v.socket_addr("admin", &raw.admin);
        let upstream = v.upstream("upstream", &raw.upstream);
        let tls = v.inbound_tls(&raw.tls);
        let log_format = match raw.log_format.as_str() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            other => v.fail(
                "log_format",
                format!("expected `text` or `json`, got `{other}`"),
            ),
        };
        let host_header = match raw.client.host_header.as_str() {
            "preserve" => Some(HostHeader::Preserve),
            "upstream" => Some(HostHeader::Upstream),
            other => v.fail(
                "client.host_header",
                format!("expected `preserve` or `upstream`, got `{other}`"),
            ),
        };
        let upstream_tls = match &upstream {
            Some(u) => v.upstream_tls(&raw.client, u, host_header),
            None => None,
        };
        if raw.retry_after_secs == 0 {
            v.fail::<()>("retry_after_secs", "must be at least 1".into());
        }
        let connect_timeout = v.secs(
            "client.connect_timeout_secs",
            raw.client.connect_timeout_secs,
        );
        let response_timeout = v.secs(
            "client.response_timeout_secs",
            raw.client.response_timeout_secs,
        );
        let pool_idle_timeout = v.secs(
            "client.pool_idle_timeout_secs",
            raw.client.pool_idle_timeout_secs,
        );
        let stream_idle_timeout =
            v.secs("streams.idle_timeout_secs", raw.streams.idle_timeout_secs);
        let learn_ttl = v.secs("routes.learn_ttl_secs", raw.routes.learn_ttl_secs);
        let horizon = v.secs("routes.horizon_secs", raw.routes.horizon_secs);
        let header_read_timeout = v.secs(
            "limits.header_read_timeout_secs",
            raw.limits.header_read_timeout_secs,
        );
        let drain_timeout = v.secs(
            "shutdown.drain_timeout_secs",
            raw.shutdown.drain_timeout_secs,
        );
        let hold_timeout = v.secs("hold.timeout_secs", raw.hold.timeout_secs);
        let h = &raw.hold;
        let retry_after_mode = match h.retry_after.as_str() {
            "observed" => Some(RetryAfter::Observed),
            "fixed" => Some(RetryAfter::Fixed),
            other => v.fail(
                "hold.retry_after",
                format!("expected `observed` or `fixed`, got `{other}`"),
            ),
        };
        if h.max_body_bytes > h.max_buffered_bytes {
            v.fail::<()>(
                "hold.max_body_bytes",
                format!(
                    "larger than hold.max_buffered_bytes ({}): no such body could ever be held",
                    h.max_buffered_bytes
                ),
            );
        }
        if h.max_requests == 0 {
            v.fail::<()>("hold.max_requests", "must be at least 1".into());
        }
        if h.backoff_initial_ms == 0 {
            v.fail::<()>("hold.backoff_initial_ms", "must be at least 1".into());
        }
        if h.backoff_max_ms < h.backoff_initial_ms {
            v.fail::<()>(
                "hold.backoff_max_ms",
                format!(
                    "must not be below hold.backoff_initial_ms ({})",
                    h.backoff_initial_ms
                ),
            );
        }
        if h.retry_after_min_secs == 0 {
            v.fail::<()>("hold.retry_after_min_secs", "must be at least 1".into());
        }
        if h.retry_after_max_secs < h.retry_after_min_secs {
            v.fail::<()>(
                "hold.retry_after_max_secs",
                format!(
                    "must not be below hold.retry_after_min_secs ({})",
                    h.retry_after_min_secs
                ),
            );
        }

        let mut endpoints = Vec::new();
        for (i, e) in raw.routes.endpoints.iter().enumerate() {
            if !e.starts_with('/') {
                v.fail::<()>(
                    &format!("routes.endpoints[{i}]"),
                    format!("a path must start with `/`, got `{e}`"),
                );
            } else {
                // Stored without a trailing slash; matching is segment-aligned (see classify).
                let trimmed = e.trim_end_matches('/');
                endpoints.push(if trimmed.is_empty() {
                    "/".into()
                } else {
                    trimmed.into()
                });
            }
        }
        if raw.routes.max_peek_bytes == 0 || raw.routes.max_peek_bytes > 1 << 20 {
            v.fail::<()>(
                "routes.max_peek_bytes",
                "must be between 1 and 1048576".into(),
            );
        }
        let mut signatures = Vec::new();
        for (i, name) in raw.routes.presets.iter().enumerate() {
            match crate::signature::Preset::from_name(name) {
                Some(p) => signatures.push(p.signature()),
                None => {
                    v.fail::<()>(
                        &format!("routes.presets[{i}]"),
                        format!(
                            "unknown preset `{name}`; known: {}",
                            crate::signature::Preset::names().join(", ")
                        ),
                    );
                }
            }
        }
        for (i, s) in raw.routes.signatures.iter().enumerate() {
            let key = format!("routes.signatures[{i}]");
            match crate::signature::Signature::from_raw(s) {
                Ok(sig) => {
                    if sig.body_len_needed() > raw.routes.max_peek_bytes {
                        v.fail::<()>(
                            &key,
                            format!(
                                "its body is longer than routes.max_peek_bytes ({}), so it could never match",
                                raw.routes.max_peek_bytes
                            ),
                        );
                    }
                    signatures.push(sig);
                }
                Err(msg) => {
                    v.fail::<()>(&key, msg);
                }
            }
        }
        let sessions_idle = v.secs("sessions.idle_timeout_secs", raw.sessions.idle_timeout_secs);
        let se = &raw.sessions;
        if se.max_tracked == 0 {
            v.fail::<()>("sessions.max_tracked", "must be at least 1".into());
        }
        if se.max_initialize_bytes == 0 {
            v.fail::<()>("sessions.max_initialize_bytes", "must be at least 1".into());
        }
        if se.max_recorded_bytes < se.max_initialize_bytes {
            v.fail::<()>(
                "sessions.max_recorded_bytes",
                format!(
                    "must not be below sessions.max_initialize_bytes ({}): no session could ever be tracked",
                    se.max_initialize_bytes
                ),
            );
        }
        // hyper's HTTP/1 read buffer cannot be smaller than 8 KiB.
        if raw.limits.max_header_bytes < 8192 {
            v.fail::<()>("limits.max_header_bytes", "must be at least 8192".into());
        }
        if raw.limits.max_connections == 0 {
            v.fail::<()>("limits.max_connections", "must be at least 1".into());
        }

        if !v.problems.is_empty() {
            return Err(ConfigError {
                problems: v.problems,
            });
        }
        // Every Option below is Some: a None always recorded a problem above.
        let ok = "validated above";
        Ok(Config {
            listen: listen.expect(ok),
            admin: admin.expect(ok),
            upstream: upstream.expect(ok),
            retry_after: Duration::from_secs(raw.retry_after_secs),
            log_format: log_format.expect(ok),
            access_log: raw.access_log,
            host_header: host_header.expect(ok),
            connect_timeout: connect_timeout.expect(ok),
            response_timeout: response_timeout.expect(ok),
            pool_idle_timeout: pool_idle_timeout.expect(ok),
            stream_idle_timeout: stream_idle_timeout.expect(ok),
            routes: Routes {
                endpoints,
                learn: raw.routes.learn,
                learn_ttl: learn_ttl.expect(ok),
                horizon: horizon.expect(ok),
                max_peek_bytes: raw.routes.max_peek_bytes,
                signatures,
            },
            max_header_bytes: raw.limits.max_header_bytes,
            header_read_timeout: header_read_timeout.expect(ok),
            max_connections: raw.limits.max_connections,
            drain_timeout: drain_timeout.expect(ok),
            hold: Hold {
                enabled: h.enabled,
                timeout: hold_timeout.expect(ok),
                max_body_bytes: h.max_body_bytes,
                max_requests: h.max_requests,
                max_buffered_bytes: h.max_buffered_bytes,
                backoff_initial: Duration::from_millis(h.backoff_initial_ms),
                backoff_max: Duration::from_millis(h.backoff_max_ms),
                retry_after: retry_after_mode.expect(ok),
                retry_after_min: Duration::from_secs(h.retry_after_min_secs),
                retry_after_max: Duration::from_secs(h.retry_after_max_secs),
            },
            tls,
            upstream_tls,
            sessions: Sessions {
                resume: se.resume,
                max_tracked: se.max_tracked,
                max_initialize_bytes: se.max_initialize_bytes,
                max_recorded_bytes: se.max_recorded_bytes,
                idle_timeout: sessions_idle.expect(ok),
                resume_wait: hold_timeout.expect(ok),
            },
        })
    }
}

/// Collects problems while validating.
struct Validator<'a> {
    problems: Vec<Problem>,
    origin: &'a dyn Fn(&str) -> String,
}

impl Validator<'_> {
    fn fail<T>(&mut self, key: &str, message: String) -> Option<T> {
        // Array elements share their array's origin.
        let base = key.split('[').next().unwrap_or(key);
        self.problems.push(Problem {
            key: key.into(),
            origin: (self.origin)(base),
            message,
        });
        None
    }

    fn socket_addr(&mut self, key: &str, value: &str) -> Option<SocketAddr> {
        match value.parse() {
            Ok(a) => Some(a),
            Err(_) => self.fail(
                key,
                format!("expected an IP address and port such as `0.0.0.0:8080`, got `{value}`"),
            ),
        }
    }

    fn secs(&mut self, key: &str, value: f64) -> Option<Duration> {
        if value.is_finite() && value > 0.0 && value < 1e9 {
            Some(Duration::from_secs_f64(value))
        } else {
            self.fail(
                key,
                format!("must be a positive number of seconds, got {value}"),
            )
        }
    }

    fn upstream(&mut self, key: &str, value: &str) -> Option<UpstreamUrl> {
        if value.is_empty() {
            self.problems.push(Problem {
                key: key.into(),
                origin: "not set".into(),
                message: "required: the MCP server's base URL, e.g. `--upstream \
                          http://mcp-backend:8000` or HOLDFAST_UPSTREAM"
                    .into(),
            });
            return None;
        }
        let uri: Uri = match value.parse() {
            Ok(u) => u,
            Err(e) => return self.fail(key, format!("not a URL ({e}): `{value}`")),
        };
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return self.fail(
                    key,
                    format!("expected an http:// or https:// URL, got `{value}`"),
                )
            }
        };
        let Some(authority) = uri.authority().cloned() else {
            return self.fail(key, format!("the URL has no host: `{value}`"));
        };
        if authority.as_str().contains('@') {
            return self.fail(
                key,
                "credentials in the upstream URL are not supported".into(),
            );
        }
        if uri.query().is_some() {
            return self.fail(key, "the upstream URL must not have a query".into());
        }
        if tls {
            // The certificate is verified for this name, and it is sent as SNI.
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            if let Err(e) = rustls::pki_types::ServerName::try_from(host) {
                return self.fail(
                    key,
                    format!("`{host}` cannot be verified as a TLS server name ({e})"),
                );
            }
        }
        Some(UpstreamUrl {
            original: value.into(),
            authority,
            path_prefix: uri.path().trim_end_matches('/').into(),
            tls,
        })
    }

    /// Records a problem with a certificate and key pair under the key of the file at fault:
    /// `cert_key` for the certificate, `key_key` for the private key (which may share one file).
    fn pair_fail<T>(
        &mut self,
        err: TlsError,
        (cert_key, cert_path): (&str, &Path),
        (key_key, key_path): (&str, &Path),
    ) -> Option<T> {
        let at = match &err {
            TlsError::NoCertificate { .. } => cert_key,
            TlsError::NoKey { .. } | TlsError::Key { .. } => key_key,
            _ if err.file() == Some(key_path) && cert_path != key_path => key_key,
            _ => cert_key,
        };
        self.fail(at, err.to_string())
    }

    /// A path setting; empty counts as unset (so an environment variable can clear a file's).
    fn path(value: &Option<String>) -> Option<PathBuf> {
        value
            .as_deref()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    /// `[tls]`: both files or neither; the files must load.
    fn inbound_tls(&mut self, raw: &RawTls) -> Option<InboundTls> {
        let reload_interval = self.secs("tls.reload_interval_secs", raw.reload_interval_secs);
        let client_ca = Self::path(&raw.client_ca);
        let (cert, key) = match (Self::path(&raw.cert), Self::path(&raw.key)) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) => {
                if client_ca.is_some() {
                    self.fail::<()>(
                        "tls.client_ca",
                        "client certificates need TLS: set tls.cert and tls.key too".into(),
                    );
                }
                return None;
            }
            (Some(_), None) => {
                return self.fail(
                    "tls.key",
                    "tls.cert is set, so the key is needed too".into(),
                )
            }
            (None, Some(_)) => {
                return self.fail(
                    "tls.cert",
                    "tls.key is set, so the certificate is needed too".into(),
                )
            }
        };
        let identity = match Identity::load(&cert, &key) {
            Ok(identity) => Some(identity),
            Err(e) => self.pair_fail(e, ("tls.cert", &cert), ("tls.key", &key)),
        };
        let client_verifier = match &client_ca {
            Some(ca) => match tls::client_verifier(ca) {
                Ok(verifier) => Some(Some(verifier)),
                Err(e) => self.fail("tls.client_ca", e.to_string()),
            },
            None => Some(None),
        };
        Some(InboundTls {
            cert,
            key,
            client_ca,
            reload_interval: reload_interval?,
            identity: identity?,
            client_verifier: client_verifier?,
        })
    }

    /// The `client.*` TLS keys: only for an `https://` upstream, whose trust (system roots, a
    /// CA bundle, or none) and optional client certificate they set.
    fn upstream_tls(
        &mut self,
        raw: &RawClient,
        upstream: &UpstreamUrl,
        host_header: Option<HostHeader>,
    ) -> Option<UpstreamTls> {
        let (ca, cert, key) = (
            Self::path(&raw.ca),
            Self::path(&raw.cert),
            Self::path(&raw.key),
        );
        if !upstream.tls {
            // A TLS setting for a plain upstream means the URL or the setting is a mistake.
            for (k, set) in [
                ("client.ca", ca.is_some()),
                ("client.cert", cert.is_some()),
                ("client.key", key.is_some()),
                ("client.insecure_skip_verify", raw.insecure_skip_verify),
            ] {
                if set {
                    self.fail::<()>(
                        k,
                        "applies only to an https:// upstream, and the upstream is http://".into(),
                    );
                }
            }
            return None;
        }
        let trust = match (&ca, raw.insecure_skip_verify) {
            (Some(_), true) => self.fail(
                "client.insecure_skip_verify",
                "contradicts client.ca: either verify against the CA bundle or not at all".into(),
            ),
            (Some(ca), false) => match tls::load_roots(ca) {
                Ok(roots) => Some((tls::Trust::Roots(roots), UpstreamVerify::Ca(ca.clone()))),
                Err(e) => self.fail("client.ca", e.to_string()),
            },
            (None, true) => Some((
                tls::Trust::InsecureSkipVerify,
                UpstreamVerify::InsecureSkipVerify,
            )),
            (None, false) => match tls::system_roots() {
                Ok(roots) => Some((tls::Trust::Roots(roots), UpstreamVerify::SystemRoots)),
                Err(e) => self.fail("client.ca", e.to_string()),
            },
        };
        let identity = match (&cert, &key) {
            (Some(cert), Some(key)) => match Identity::load(cert, key) {
                Ok(identity) => Some(Some(identity.certified_key())),
                Err(e) => self.pair_fail(e, ("client.cert", cert), ("client.key", key)),
            },
            (None, None) => Some(None),
            (Some(_), None) => self.fail(
                "client.key",
                "client.cert is set, so its key is needed too".into(),
            ),
            (None, Some(_)) => self.fail(
                "client.cert",
                "client.key is set, so the certificate is needed too".into(),
            ),
        };
        let (trust, verify) = trust?;
        // HTTP/2 carries the host in `:authority`, which hyper's pooled client takes from the
        // URI it connects to: the upstream's authority. A preserved client Host would have to
        // travel as a `Host` header that differs from `:authority`, which RFC 9113 §8.3.1
        // forbids (and servers resolve either way). So h2 is offered only when the upstream is
        // to see its own authority anyway; otherwise the connection stays HTTP/1.1, where Host
        // is preserved exactly.
        let offers_h2 = host_header == Some(HostHeader::Upstream);
        Some(UpstreamTls {
            config: tls::client_config(trust, identity?, offers_h2),
            verify,
            client_cert: cert,
            offers_h2,
        })
    }
}

/// Names where `key`'s value came from in the terms a user knows.
fn describe_origin(key: &str, md: Option<&figment::Metadata>) -> String {
    let Some(md) = md else {
        return ORIGIN_DEFAULT.into();
    };
    match &md.source {
        Some(figment::Source::File(p)) => format!("file {}", p.display()),
        _ if md.name.contains("environment") && !key.is_empty() => format!(
            "environment variable {ENV_PREFIX}{}",
            key.to_ascii_uppercase().replace('.', "__")
        ),
        _ if md.name.contains("environment") => "environment".into(),
        _ => md.name.to_string(),
    }
}

/// Removes the value at `path` from `data` (or the array that contains it). Returns whether
/// something was removed.
fn remove_path(data: &mut figment::value::Dict, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    if rest.is_empty() {
        return data.remove(first).is_some();
    }
    match data.get_mut(first) {
        Some(figment::value::Value::Dict(_, inner)) => remove_path(inner, rest),
        // Inside an array (or a scalar): drop the whole value.
        Some(_) => data.remove(first).is_some(),
        None => false,
    }
}
