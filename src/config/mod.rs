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
//! # Layout
//! - `raw`: phase one, what figment fills (and the flags layer), with the defaults.
//! - `validate`: phase two, [`Config::from_raw`] and its checks.
//! - here: the validated types and the layering.
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

use crate::tls::{self, Identity, TlsError};

mod bridge;
mod changes;
pub mod duration;
mod forwarded;
mod hold;
mod layers;
mod log_level;
mod messages;
mod pause;
mod peers;
mod raw;
mod request_id;
mod retry;
mod routes;
mod sessions;
mod traces;
mod validate;

pub use layers::origins;
pub use peers::{Peers, RawPeers};
pub use raw::*;

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
    /// What is logged (a `RUST_LOG`-style filter), unless `RUST_LOG` says otherwise.
    pub log_level: String,
    /// Whether `log_level` was said (file, environment or flag), not the default: then it
    /// decides over `RUST_LOG`.
    pub log_level_said: bool,
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
    /// Most header lines in a request or upstream response head.
    pub max_headers: usize,
    /// How often HTTP/2 clients are pinged (they have two thirds of it to answer).
    pub h2_ping_interval: Duration,
    /// Drain time on shutdown.
    pub drain_timeout: Duration,
    /// Time after SIGTERM during which new connections are still accepted.
    pub accept_grace: Duration,
    /// Hold and replay.
    pub hold: Hold,
    /// TLS on the proxy listener (`None`: plain HTTP).
    pub tls: Option<InboundTls>,
    /// TLS to an `https://` upstream (`None` for `http://`).
    pub upstream_tls: Option<UpstreamTls>,
    /// Session continuity.
    pub sessions: Sessions,
    /// `[retry]`.
    pub retry: Retry,
    /// `[pause]`.
    pub pause: Pause,
    /// `[peers]`: the replicas a terminating holdfast hands to what never reached a server.
    pub peers: Peers,
    /// The admin token (`admin_token_file`, read at start).
    pub admin_token: Option<AdminToken>,
    /// `forwarded.trusted_proxies`: whose `X-Forwarded-*` are kept.
    pub trusted_proxies: TrustedProxies,
    /// `[request_id]`: the header each request's id travels in.
    pub request_id: RequestId,
    /// `[tracing]`: OpenTelemetry traces.
    pub tracing: Tracing,
    /// `[bridge]`: the era bridge.
    pub bridge: Bridge,
}

pub use bridge::{Bridge, BridgeMode, RawBridge};
pub use changes::{Act, OnChange, RawOnChange};
pub use forwarded::{RawForwarded, TrustedProxies};
pub use pause::{AdminToken, Pause};
pub use request_id::{RawRequestId, RawRequestIdFlags, RequestId};
pub use sessions::{
    check_key_file_mode, parse_session_keys, redact_store_url, store_is_tls, RawSessions,
    SessionKey, SessionKeys, Sessions, StoreTls,
};
pub use traces::{parse_endpoint as parse_tracing_endpoint, RawTracing, Tracing};

/// Validated `[retry]` (what `crate::idempotent` is built from).
#[derive(Debug, Clone, Default)]
pub struct Retry {
    /// Send a safe request once more after an ambiguous failure.
    pub enabled: bool,
    /// Learn safe tools from `tools/list` annotations.
    pub learn_annotations: bool,
    /// Tools safe to call twice (added to what the server announces).
    pub idempotent_tools: Vec<String>,
    /// Tools never called twice (they win over everything else).
    pub never_tools: Vec<String>,
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
    /// `tls.session_resumption`.
    pub session_resumption: bool,
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
            .field("session_resumption", &self.session_resumption)
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
    /// `hold.probe_path`: the health check's path on the upstream, if set.
    pub probe_path: Option<http::uri::PathAndQuery>,
    /// `hold.check_interval_secs`: how often the upstream is checked without traffic (with
    /// `probe_path` only); none when 0.
    pub check_interval: Option<Duration>,
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
    /// Whether a router sits between holdfast and the MCP server.
    pub behind_router: bool,
    /// Whether the configuration said so (else it is the default, and a loopback upstream
    /// gets a warning).
    pub behind_router_said: bool,
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

/// A listen address as Go tools take them: `IP:PORT`, `:PORT` (every IPv4 interface,
/// `0.0.0.0`) or `localhost:PORT` (`127.0.0.1`). No other name: a listener binds an address,
/// and resolving one at start would make the bind depend on a resolver.
pub fn listen_addr(value: &str) -> Option<SocketAddr> {
    if let Ok(addr) = value.parse() {
        return Some(addr);
    }
    let (host, port) = value.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    match host {
        "" => Some(SocketAddr::from(([0, 0, 0, 0], port))),
        h if h.eq_ignore_ascii_case("localhost") => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        _ => None,
    }
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
        if self.origin == ORIGIN_NOT_SET {
            // Nothing set it: there is no "from" to name.
            return write!(f, "{}: {}", self.key, self.message);
        }
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
    let mut fig = Figment::from(Named(
        Serialized::defaults(RawConfig::default()),
        ORIGIN_DEFAULT,
    ));
    if let Some(path) = config_file(file) {
        // `file_exact`: a missing file is an error, not silently an empty layer.
        fig = fig.merge(Toml::file_exact(path));
    }
    fig.merge(env_layer())
        .merge(Named(Serialized::defaults(flags), ORIGIN_FLAG))
}

/// The configuration file: `--config`, else `HOLDFAST_CONFIG`.
fn config_file(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from))
}

/// The environment layer: `HOLDFAST_*` variables that name a configuration key, `__` between
/// nested keys. Others are not read (see [`unknown_env`]): a Kubernetes pod gets
/// `<SERVICE>_SERVICE_HOST` and `<SERVICE>_PORT*` for every Service in its namespace, so a Service
/// named `holdfast-gateway` puts `HOLDFAST_GATEWAY_SERVICE_HOST` into every holdfast pod, and a
/// compose file has its own `HOLDFAST_IMAGE`. A typo in the file or a flag stays an error.
fn env_layer() -> Env {
    env_variables().filter(|key| !is_service_link(key.as_str()) && names_a_key(key.as_str()))
}

/// Every `HOLDFAST_*` variable but `HOLDFAST_CONFIG` (it names the file).
fn env_variables() -> Env {
    Env::prefixed(ENV_PREFIX).split("__").ignore(&["config"])
}

/// Kubernetes' service links for a Service named `holdfast` (`HOLDFAST_PORT=tcp://…`,
/// `HOLDFAST_SERVICE_HOST`, `HOLDFAST_PORT_8080_TCP_ADDR`, …): never settings, never warned of.
fn is_service_link(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "port" || key.starts_with("port_") || key.starts_with("service_")
}

/// Whether the variable `HOLDFAST_<key>` names a configuration key: serde, which knows every
/// field, is asked with that variable alone (a wrong value is not this question's).
fn names_a_key(key: &str) -> bool {
    // As figment's filters see a key: lower case, `__` already a dot.
    let key = key.to_ascii_lowercase().replace("__", ".");
    let alone = Figment::from(env_variables().only(&[key.as_str()]));
    match alone.extract::<RawConfig>() {
        Ok(_) => true,
        Err(errors) => !errors
            .into_iter()
            .any(|e| matches!(e.kind, figment::error::Kind::UnknownField(..))),
    }
}

/// The `HOLDFAST_*` variables that name no configuration key (service links aside), which are
/// not read: for one warning at start and in `check-config`.
pub fn unknown_env() -> Vec<String> {
    let mut unknown: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter_map(|name| {
            let key = name.strip_prefix(ENV_PREFIX)?.to_owned();
            let config = key.eq_ignore_ascii_case("config");
            (!config && !is_service_link(&key) && !names_a_key(&key)).then_some(name)
        })
        .collect();
    unknown.sort();
    unknown
}

/// A required key nobody set, beside an ignored variable close to its own: the problem says
/// which variable was likely meant.
fn name_mistyped_variables(problems: &mut [Problem]) {
    let mut unknown = None;
    for p in problems.iter_mut().filter(|p| p.origin == ORIGIN_NOT_SET) {
        let unknown = unknown.get_or_insert_with(unknown_env);
        if let Some(hint) = messages::mistyped_variable(&p.key, unknown) {
            p.message = format!("{}; {hint}", p.message);
        }
    }
}

pub(crate) const ORIGIN_DEFAULT: &str = "default";
/// The origin of a required key nobody set.
pub(crate) const ORIGIN_NOT_SET: &str = "not set";
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

/// Loads and validates: the one entry point the binary uses.
///
/// A value that a higher layer overrides is still checked in its own layer: a mistyped `listen`
/// in the file is an error even when `--listen` is given, because the file would start failing
/// the day the flag goes away.
pub fn load(file: Option<&Path>, flags: &RawFlags) -> Result<Config, ConfigError> {
    let mut merged = Config::from_figment(&figment(file, flags));
    let hidden = layers::hidden_problems(config_file(file).as_deref(), env_layer());
    if let Err(e) = &mut merged {
        name_mistyped_variables(&mut e.problems);
    }
    match merged {
        Ok(config) if hidden.is_empty() => Ok(config),
        Ok(_) => Err(ConfigError { problems: hidden }),
        Err(mut e) => {
            for p in hidden {
                if !e
                    .problems
                    .iter()
                    .any(|q| q.key == p.key && q.origin == p.origin)
                {
                    e.problems.push(p);
                }
            }
            Err(e)
        }
    }
}
