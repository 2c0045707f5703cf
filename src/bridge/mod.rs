//! The era bridge (issue 48, docs/design/era-bridge.md): 2026-07-28 clients in front of 2025
//! servers, and 2025 clients in front of 2026-07-28-only servers.
//!
//! Behind `[bridge] mode = "auto"`. [`wire`] translates bodies and headers (pure functions),
//! [`modern`] the other way; [`era`] reads what the server speaks from its answer to
//! `server/discover`; [`listen`] and [`feed`] carry a 2026 client's `subscriptions/listen` on a
//! 2025 session's GET stream; [`rounds`] parks a call whose server asked for input until the
//! client's retry. This module owns the state: the era verdict, and one upstream session per principal (a client's
//! credentials and capabilities), opened with an `initialize` of holdfast's and carried by the
//! session table like any client's, so a server's restart re-establishes it. The exchanges
//! themselves are the proxy's (src/proxy/forward/bridged.rs): the bridge is a client of
//! holdfast's own core, so holding, exactly-once and re-establishment apply to what it sends.

pub mod asks;
pub mod era;
pub mod feed;
pub mod listen;
pub mod local;
pub mod modern;
pub mod rounds;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::config::BridgeMode;
pub use era::Era;

/// A random, unguessable name: `prefix` and `N` bytes of the system's random source, URL-safe
/// base64 (input rounds' handles, the ids of questions asked of clients).
fn random_name<const N: usize>(prefix: &str) -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    let random = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    format!("{prefix}{random}")
}

/// The largest event translated: an answer beyond it (a huge tool result) is cut by the reader
/// and cannot be rewritten whole.
pub const MAX_EVENT: usize = 8 * 1024 * 1024;

/// Which way a request goes through the bridge.
pub enum Direction {
    /// A 2026-07-28 client's request, to be sent on a 2025 session when the server speaks only
    /// that revision.
    ToLegacy,
    /// A 2025 client's request, to be made a 2026-07-28 one when the server speaks only that
    /// revision: its session token's contents when it names a session holdfast answered itself.
    ToModern(Option<Box<crate::session::token::Contents>>),
}

/// What a principal's upstream session is, once opened.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The `Mcp-Session-Id` the bridge sends: holdfast's sealed token for the session.
    pub session: HeaderValue,
    /// The 2025 version the server answered the `initialize` with.
    pub version: String,
    /// The server's `initialize` result: its capabilities, serverInfo and instructions, what a
    /// `server/discover` and a listen are answered from.
    pub server: Arc<Value>,
    /// The lowest log level set on the session (a rank of [`wire::level_rank`]): requests that
    /// opted in to a higher one filter what it lets through.
    pub level: Arc<Mutex<Option<usize>>>,
    /// The URIs subscribed on the session (`resources/subscribe`, recorded state: a
    /// re-established session has them again).
    pub subscribed: Arc<Mutex<std::collections::HashSet<String>>>,
    /// The session's GET stream, while a listen reads it.
    pub feed: Arc<tokio::sync::Mutex<Option<Arc<feed::Feed>>>>,
}

impl Opened {
    /// Whether a request that opted in to log messages from `rank` needs the session's level
    /// lowered first.
    pub fn needs_level(&self, rank: usize) -> bool {
        lock(&self.level).is_none_or(|set| rank < set)
    }

    /// Whether `uri` is subscribed on the session.
    pub fn is_subscribed(&self, uri: &str) -> bool {
        lock(&self.subscribed).contains(uri)
    }

    /// Records that `uri` was subscribed on the session.
    pub fn subscribed_to(&self, uri: &str) {
        lock(&self.subscribed).insert(uri.to_owned());
    }

    /// Records that the session's level was set to `rank`.
    pub fn level_set(&self, rank: usize) {
        let mut set = lock(&self.level);
        *set = Some(set.map_or(rank, |s| s.min(rank)));
    }
}

/// Whose requests may share an upstream session: a digest of the credentials they carry and of
/// the capabilities their client declared. Two `Authorization` values never share one; the
/// values themselves are never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal([u8; 32]);

/// The request headers that name a principal.
const CREDENTIALS: [http::HeaderName; 2] = [http::header::AUTHORIZATION, http::header::COOKIE];

impl Principal {
    /// The principal of a request with `headers` whose envelope declared `capabilities`.
    pub fn of(headers: &HeaderMap, capabilities: Option<&Value>) -> Principal {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for name in CREDENTIALS {
            for value in headers.get_all(&name) {
                // Lengths first: no two lists of values digest alike.
                digest.update(&(value.len() as u64).to_be_bytes());
                digest.update(value.as_bytes());
            }
            digest.update(b"\0");
        }
        // serde_json's maps keep their keys sorted: the same capabilities, the same bytes.
        let capabilities = capabilities.map(Value::to_string).unwrap_or_default();
        digest.update(capabilities.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.finish().as_ref());
        Principal(key)
    }
}

/// One principal's session: opened once, by the first of its requests that needs it.
type Slot = Arc<OnceCell<Opened>>;

/// The upstream sessions, one per principal, the oldest forgotten beyond the cap.
struct Sessions {
    slots: HashMap<Principal, Slot>,
    /// Principals in the order their sessions were first asked for.
    order: VecDeque<Principal>,
    max: usize,
    /// `holdfast_bridge_sessions`: how many there are.
    gauge: Gauge,
}

impl Sessions {
    fn slot(&mut self, principal: Principal) -> Slot {
        if let Some(slot) = self.slots.get(&principal) {
            return slot.clone();
        }
        while self.slots.len() >= self.max {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.slots.remove(&oldest);
        }
        let slot = Slot::default();
        self.slots.insert(principal, slot.clone());
        self.order.push_back(principal);
        self.gauge.set(self.slots.len() as i64);
        slot
    }

    fn forget(&mut self, principal: &Principal) {
        if self.slots.remove(principal).is_some() {
            self.order.retain(|p| p != principal);
        }
        self.gauge.set(self.slots.len() as i64);
    }
}

/// A bridged request its client gave up on (it closed its stream: 2026 cancellation), to be
/// cancelled on its session with `notifications/cancelled`.
pub struct Cancel {
    /// The head the notification goes with: the client's credentials, the session, the
    /// version, as the request had them.
    pub head: http::Request<()>,
    /// The id the request went upstream with.
    pub upstream_id: u64,
    /// The client's address, for the notification's `X-Forwarded-For`.
    pub peer: std::net::SocketAddr,
}

/// A 2025 client's call that a 2026-07-28 server answered with an input round: what asking the
/// client and calling again needs (src/bridge/asks.rs).
pub struct Asking {
    /// The head the call went upstream with, for its retries.
    pub head: http::Request<()>,
    /// The call as the server got it.
    pub sent: bytes::Bytes,
    /// The client's id for the call.
    pub client_id: Value,
    /// The server's `input_required` result.
    pub first: Value,
    /// The client's session token: its answers come on it.
    pub token: Vec<u8>,
    /// The client's stream: the questions, then the result.
    pub out: tokio::sync::mpsc::Sender<bytes::Bytes>,
    pub peer: std::net::SocketAddr,
}

/// Most cancellations waiting to be sent: beyond, one is dropped (the server finishes that
/// request for nobody, as it would without holdfast).
const MAX_CANCELS: usize = 1024;

/// Cancels a bridged request on its session when dropped before [`CancelOnDrop::answered`]: the
/// client closed its stream (or went away) before the answer.
pub struct CancelOnDrop {
    cancel: Option<Cancel>,
    to: tokio::sync::mpsc::Sender<Cancel>,
}

impl CancelOnDrop {
    /// The request was answered: nothing to cancel.
    pub fn answered(&mut self) {
        self.cancel = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            if self.to.try_send(cancel).is_err() {
                tracing::debug!("bridge: a cancellation was dropped (too many waiting)");
            }
        }
    }
}

/// The bridge's state: one per holdfast, carried over a reload.
pub struct Bridge {
    /// `mode = "auto"`: read on every POST, so a load and nothing more when off.
    on: AtomicBool,
    /// `answer_discover`: a 2026-07-28 client's `server/discover` is answered for a 2025 server.
    answer_discover: AtomicBool,
    era: Mutex<Era>,
    /// The server's DiscoverResult, when it speaks 2026-07-28: what `initialize` is answered
    /// from for 2025 clients.
    discovered: Mutex<Option<Value>>,
    /// What each of its tools mirrors in `Mcp-Param-*` headers, once listed.
    mirrored: Mutex<Option<Arc<HashMap<String, modern::Mirrored>>>>,
    sessions: Mutex<Sessions>,
    /// Ids of the requests the bridge sends: unique on a session shared by several clients.
    ids: AtomicU64,
    /// Input rounds parked until their clients call again.
    rounds: rounds::Rounds,
    /// What each 2025 client's local session set (its log level, its subscriptions) and its
    /// open GET stream, by the session's token.
    locals: Mutex<HashMap<Vec<u8>, local::LocalState>>,
    /// Where dropped requests' cancellations go, and (until the task that sends them takes it)
    /// where they come out.
    cancels: tokio::sync::mpsc::Sender<Cancel>,
    cancelled: Mutex<Option<tokio::sync::mpsc::Receiver<Cancel>>>,
    /// Where calls whose clients are to be asked for input go, and where they come out (for
    /// the task that drives them).
    asking: tokio::sync::mpsc::Sender<Asking>,
    asked: Mutex<Option<tokio::sync::mpsc::Receiver<Asking>>>,
    /// The questions waiting for 2025 clients' answers.
    asks: asks::Asks,
    /// 2025 clients' calls in progress on 2026-07-28 servers, by session token and the call's
    /// id: a `notifications/cancelled` of one closes its stream (2026 cancellation).
    calls: Mutex<HashMap<local::CallKey, (u64, tokio::sync::oneshot::Sender<()>)>>,
}

impl Bridge {
    /// The bridge `cfg` says, counting its sessions in `gauge`.
    pub fn new(cfg: &crate::config::Bridge, gauge: Gauge) -> Bridge {
        let (cancels, cancelled) = tokio::sync::mpsc::channel(MAX_CANCELS);
        let (asking, asked) = tokio::sync::mpsc::channel(MAX_CANCELS);
        Bridge {
            asking,
            asked: Mutex::new(Some(asked)),
            asks: asks::Asks::default(),
            calls: Mutex::new(HashMap::new()),
            cancels,
            cancelled: Mutex::new(Some(cancelled)),
            on: AtomicBool::new(cfg.mode == BridgeMode::Auto),
            answer_discover: AtomicBool::new(cfg.answer_discover),
            era: Mutex::new(Era::Unknown),
            discovered: Mutex::new(None),
            mirrored: Mutex::new(None),
            sessions: Mutex::new(Sessions {
                slots: HashMap::new(),
                order: VecDeque::new(),
                max: cfg.max_sessions,
                gauge,
            }),
            ids: AtomicU64::new(1),
            rounds: rounds::Rounds::default(),
            locals: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a reload's settings; the sessions and the verdict stay.
    pub fn reconfigure(&self, cfg: &crate::config::Bridge) {
        self.on
            .store(cfg.mode == BridgeMode::Auto, Ordering::Relaxed);
        self.answer_discover
            .store(cfg.answer_discover, Ordering::Relaxed);
        lock(&self.sessions).max = cfg.max_sessions;
    }

    /// Which way, if any, a request goes through the bridge. A 2026-07-28 client's POST:
    /// [`Direction::ToLegacy`]. A 2025 client's, unless the server is known to speak 2025: a
    /// POST without a session (an `initialize`, whose answer decides), or any request naming a
    /// session holdfast answered itself (`open` reads its token). Off: none, at the cost of one
    /// load.
    pub fn route(
        &self,
        method: &http::Method,
        headers: &HeaderMap,
        open: impl FnOnce(&[u8]) -> Option<crate::session::token::Contents>,
    ) -> Option<Direction> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        if method == http::Method::POST && wire::is_modern(headers) {
            return Some(Direction::ToLegacy);
        }
        if matches!(self.era(), Era::Legacy | Era::Both) {
            return None;
        }
        match headers.get(crate::session::MCP_SESSION_ID) {
            Some(id) => open(id.as_bytes())
                .filter(|c| c.upstream_id == modern::LOCAL_SESSION)
                .map(|c| Direction::ToModern(Some(Box::new(c)))),
            None if method == http::Method::POST => Some(Direction::ToModern(None)),
            None => None,
        }
    }

    /// Whether a 2026-07-28 client's `server/discover` is answered for a 2025 server (its
    /// client then speaks 2026-07-28 through the bridge), or passed to get the server's refusal
    /// (a dual-era client then falls back to the handshake).
    pub fn answers_discover(&self) -> bool {
        self.answer_discover.load(Ordering::Relaxed)
    }

    /// What the server is known to speak.
    pub fn era(&self) -> Era {
        *lock(&self.era)
    }

    /// Records what the server was found to speak.
    pub fn found(&self, era: Era) {
        *lock(&self.era) = era;
    }

    /// Records the server's DiscoverResult.
    pub fn discovered(&self, result: Value) {
        *lock(&self.discovered) = Some(result);
    }

    /// What the server's tools mirror in headers, if they were listed.
    pub fn mirrored(&self) -> Option<Arc<HashMap<String, modern::Mirrored>>> {
        lock(&self.mirrored).clone()
    }

    /// Records what the server's tools mirror in headers (a whole listing).
    pub fn learn_mirrored(&self, tools: Vec<(String, modern::Mirrored)>) {
        *lock(&self.mirrored) = Some(Arc::new(tools.into_iter().collect()));
    }

    /// Forgets what the server's tools mirror: the next call lists them again.
    pub fn unlearn_mirrored(&self) {
        *lock(&self.mirrored) = None;
    }

    /// The server's DiscoverResult, if it gave one.
    pub fn discover_result(&self) -> Option<Value> {
        lock(&self.discovered).clone()
    }

    /// The session slot of `principal`, new if it had none.
    pub fn slot(&self, principal: Principal) -> Slot {
        lock(&self.sessions).slot(principal)
    }

    /// Forgets `principal`'s session (its opening failed, or the server ended it): the next
    /// request opens another.
    pub fn forget(&self, principal: &Principal) {
        lock(&self.sessions).forget(principal);
    }

    /// Sessions kept now.
    #[cfg(test)]
    fn sessions(&self) -> usize {
        lock(&self.sessions).slots.len()
    }

    /// A guard that cancels `cancel`'s request unless told it was answered.
    pub fn cancel_on_drop(&self, cancel: Cancel) -> CancelOnDrop {
        CancelOnDrop {
            cancel: Some(cancel),
            to: self.cancels.clone(),
        }
    }

    /// The cancellations to send, once: for the one task that sends them.
    pub fn take_cancellations(&self) -> Option<tokio::sync::mpsc::Receiver<Cancel>> {
        lock(&self.cancelled).take()
    }

    /// Hands a call whose client is to be asked for input to the task that drives such calls:
    /// false when too many wait (it is dropped).
    pub fn ask(&self, asking: Asking) -> bool {
        self.asking.try_send(asking).is_ok()
    }

    /// The calls to drive, once: for the one task that drives them.
    pub fn take_asking(&self) -> Option<tokio::sync::mpsc::Receiver<Asking>> {
        lock(&self.asked).take()
    }

    /// The questions waiting for 2025 clients' answers.
    pub fn asks(&self) -> &asks::Asks {
        &self.asks
    }

    /// The parked input rounds.
    pub fn rounds(&self) -> &rounds::Rounds {
        &self.rounds
    }

    /// A fresh id for a request the bridge sends.
    pub fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// A lock nobody holds across a panic that could leave its value half-changed.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn two_credentials_never_share_a_principal() {
        let caps = serde_json::json!({"sampling": {}});
        let a = Principal::of(&headers(&[("authorization", "Bearer a")]), Some(&caps));
        let a_again = Principal::of(&headers(&[("authorization", "Bearer a")]), Some(&caps));
        let b = Principal::of(&headers(&[("authorization", "Bearer b")]), Some(&caps));
        let anonymous = Principal::of(&headers(&[]), Some(&caps));
        let by_cookie = Principal::of(&headers(&[("cookie", "Bearer a")]), Some(&caps));
        let other_caps = Principal::of(&headers(&[("authorization", "Bearer a")]), None);
        assert_eq!(a, a_again);
        for other in [b, anonymous, by_cookie, other_caps] {
            assert_ne!(a, other);
        }
        // Two values in one header are not one value joined.
        let split = Principal::of(&headers(&[("cookie", "x"), ("cookie", "y")]), None);
        let joined = Principal::of(&headers(&[("cookie", "xy")]), None);
        assert_ne!(split, joined);
    }

    #[test]
    fn the_oldest_session_is_forgotten_beyond_the_cap() {
        let gauge = Gauge::default();
        let bridge = Bridge::new(
            &crate::config::Bridge {
                mode: BridgeMode::Auto,
                max_sessions: 2,
                answer_discover: false,
            },
            gauge.clone(),
        );
        let p = |n: &str| Principal::of(&headers(&[("authorization", n)]), None);
        let first = bridge.slot(p("1"));
        assert!(Arc::ptr_eq(&first, &bridge.slot(p("1"))), "kept");
        bridge.slot(p("2"));
        bridge.slot(p("3"));
        assert_eq!(bridge.sessions(), 2);
        assert_eq!(gauge.get(), 2);
        assert!(
            !Arc::ptr_eq(&first, &bridge.slot(p("1"))),
            "1 was the oldest"
        );
        bridge.forget(&p("1"));
        assert_eq!(bridge.sessions(), 1);
        assert_eq!(gauge.get(), 1);
    }

    #[test]
    fn a_guard_cancels_only_what_was_not_answered() {
        let bridge = Bridge::new(&crate::config::Bridge::default(), Gauge::default());
        let mut cancelled = bridge.take_cancellations().expect("once");
        assert!(bridge.take_cancellations().is_none(), "only once");
        let cancel = |upstream_id| Cancel {
            head: http::Request::new(()),
            upstream_id,
            peer: ([127, 0, 0, 1], 1).into(),
        };
        let mut answered = bridge.cancel_on_drop(cancel(1));
        answered.answered();
        drop(answered);
        drop(bridge.cancel_on_drop(cancel(2)));
        assert_eq!(cancelled.try_recv().map(|c| c.upstream_id).ok(), Some(2));
        assert!(
            cancelled.try_recv().is_err(),
            "nothing for the answered one"
        );
    }

    #[test]
    fn requests_are_routed_by_their_era_and_the_servers() {
        let modern = headers(&[("mcp-protocol-version", wire::MODERN)]);
        let legacy = headers(&[("mcp-protocol-version", wire::LEGACY)]);
        let bridge = Bridge::new(
            &crate::config::Bridge {
                mode: BridgeMode::Auto,
                max_sessions: 2,
                answer_discover: false,
            },
            Gauge::default(),
        );
        let route = |method, h: &HeaderMap| match bridge.route(&method, h, |_| None) {
            None => "pass",
            Some(Direction::ToLegacy) => "to legacy",
            Some(Direction::ToModern(_)) => "to modern",
        };
        assert_eq!(route(http::Method::POST, &modern), "to legacy");
        assert_eq!(route(http::Method::GET, &modern), "pass");
        // A 2025 client's POST without a session, while the server's era is unknown: its
        // answer decides (an initialize of a 2026-only server is answered by holdfast).
        assert_eq!(route(http::Method::POST, &legacy), "to modern");
        // A session that is not one holdfast answered itself is the server's.
        let session = headers(&[("mcp-session-id", "abc")]);
        assert_eq!(route(http::Method::POST, &session), "pass");
        bridge.found(Era::Legacy);
        assert_eq!(route(http::Method::POST, &legacy), "pass");
        assert_eq!(route(http::Method::POST, &modern), "to legacy");
        // A server of 2026-07-28 whose handshake was refused bridges 2025 clients; one that
        // took it, none.
        bridge.found(Era::ModernOnly);
        assert_eq!(route(http::Method::POST, &legacy), "to modern");
        bridge.found(Era::Both);
        assert_eq!(route(http::Method::POST, &legacy), "pass");
        bridge.reconfigure(&crate::config::Bridge::default());
        assert_eq!(route(http::Method::POST, &modern), "pass");
    }
}
