//! The sessions holdfast carries, by the id their clients hold.
//!
//! A session enters the store two ways: this holdfast saw its `initialize` ([`Table::record`]:
//! the client is handed a token instead of the upstream's id), or a request brings a token this
//! holdfast did not make, or made before a restart of its own ([`Table::lookup`] opens it).
//!
//! Bounded three ways (see the README): at most `max_tracked` sessions (the least recently used
//! go first), at most `max_recorded_bytes` of recorded requests over all of them, and a session
//! idle for `idle_timeout` is forgotten. A forgotten session with a token comes back from its
//! next request; one without (see [`Recorded`]) is gone. Nothing recorded is ever logged: an
//! `initialize` body may carry client details, and the session ids are credentials of a sort.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Uri};
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use super::entry::{unix_now, Opened, Origin, Session};
use super::forgotten::Doubt;
use super::keys::Keys;
use super::live::{fixed_changes, Live};
use super::rpc::StateChange;
use super::shared::SharedStore;
use super::token::{self, Contents, Refused};
use crate::config;

/// How often, at most, a new session triggers a sweep for idle ones.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Most resource subscriptions remembered per session; more are not applied again on a resume.
const MAX_SUBSCRIPTIONS: usize = 256;

/// Every tracked session, by the id its client knows.
pub struct Table {
    /// What a reload may change.
    live: Live,
    /// The settings as started, for what a reload cannot change.
    fixed: config::Sessions,
    keys: Arc<Keys>,
    /// `sessions.store`, when set.
    shared: Option<SharedStore>,
    inner: Mutex<Inner>,
    /// Recorded bytes over all sessions (initialize bodies and subscription URIs).
    recorded: Arc<AtomicUsize>,
    /// When this store was made: `last_used` times count from here.
    epoch: Instant,
    /// `holdfast_sessions_tracked`.
    tracked: Gauge,
    /// Whether "too large for a token" was logged: once per process is enough.
    said_too_large: AtomicBool,
    /// Whether the server's pings are doubted as witnesses of a forgotten session.
    ping_doubt: Doubt,
    /// Held requests their clients may cancel.
    cancels: super::cancels::Cancels,
}

struct Inner {
    by_client_id: HashMap<HeaderValue, Arc<Session>>,
    last_sweep: Instant,
    /// Tokens of sessions their clients ended (DELETE), by their nonce: never opened again
    /// here. The oldest go first past `max_tracked`.
    ended: HashSet<[u8; 12]>,
    ended_order: VecDeque<[u8; 12]>,
}

/// What [`Table::record`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The session is tracked; the client is to hold this id (a token, or the upstream's own
    /// id when the `initialize` is too large for one).
    Tracked(HeaderValue),
    /// The initialize body is larger than `sessions.max_initialize_bytes`: not tracked.
    TooLarge,
}

/// Why [`Table::lookup`] found no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// Not tracked, and not a token: the server's own id, or one this holdfast forgot.
    Unknown,
    /// A token that does not open; the request goes with the id unchanged.
    Refused(TokenRefusal),
}

/// Why a token was not used (`holdfast_session_tokens_refused_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not the shape of a token: cut short, altered characters, too long.
    Malformed,
    /// No key opens it: another key (rotated away, another deployment's) or altered.
    Unopened,
    /// Its session was ended with DELETE.
    Ended,
    /// Older than `sessions.token_max_age_secs`: not re-established.
    Expired,
}

impl Table {
    /// An empty store; `tracked` is the `holdfast_sessions_tracked` gauge.
    pub fn new(settings: config::Sessions, tracked: Gauge) -> Table {
        let keys = Arc::new(Keys::new(&settings.keys));
        let shared = settings.store.as_deref().and_then(|url| {
            let store = SharedStore::new(
                url,
                settings.idle_timeout,
                settings.token_max_age,
                settings.store_tls.as_ref(),
            );
            // Validation checked the URL; a store that cannot be made is logged, not fatal.
            store
                .map_err(|e| tracing::error!(error = %e, "sessions.store is not used"))
                .ok()
        });
        let now = Instant::now();
        Table {
            live: Live::new(&settings),
            fixed: settings,
            keys,
            shared,
            inner: Mutex::new(Inner {
                by_client_id: HashMap::new(),
                last_sweep: now,
                ended: HashSet::new(),
                ended_order: VecDeque::new(),
            }),
            recorded: Arc::new(AtomicUsize::new(0)),
            epoch: now,
            tracked,
            said_too_large: AtomicBool::new(false),
            ping_doubt: Doubt::default(),
            cancels: Default::default(),
        }
    }

    /// Whether sessions are carried across restarts at all (`sessions.resume`).
    pub fn enabled(&self) -> bool {
        self.live.resume()
    }

    /// Takes a reloaded `[sessions]`: its limits and timeouts from now on, and the key file's
    /// keys as validation read them again. What it cannot change (the key file's path, the
    /// store) is returned by key, and stays as started.
    pub fn reconfigure(&self, settings: &config::Sessions) -> Vec<&'static str> {
        self.live.set(settings);
        let fixed = fixed_changes(&self.fixed, settings);
        if !fixed.contains(&"sessions.key_file") && !settings.keys.keys.is_empty() {
            self.keys.replace(&settings.keys.keys);
        }
        fixed
    }

    /// The keys tokens are sealed with (for the reloader).
    pub fn keys(&self) -> Arc<Keys> {
        self.keys.clone()
    }

    /// The shared store (`sessions.store`), when set.
    pub fn shared(&self) -> Option<&SharedStore> {
        self.shared.as_ref()
    }

    /// Most bytes of an `initialize` body that is still tracked.
    pub fn max_initialize_bytes(&self) -> usize {
        self.live.max_initialize_bytes()
    }

    /// Whether the server's pings are doubted as witnesses (see [`super::forgotten`]).
    pub fn ping_doubt(&self) -> &Doubt {
        &self.ping_doubt
    }

    /// Held requests their clients may cancel.
    pub fn cancels(&self) -> &super::cancels::Cancels {
        &self.cancels
    }

    /// Oldest token re-established.
    pub fn token_max_age(&self) -> Duration {
        self.live.token_max_age()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("sessions lock")
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn is_idle(&self, session: &Session, now_ms: u64) -> bool {
        let idle_ms = now_ms.saturating_sub(session.last_used.load(Ordering::Relaxed));
        Duration::from_millis(idle_ms) > self.live.idle_timeout()
    }

    /// Whether `session`'s token still opens under the keys in use: a key removed from the key
    /// file ends, at their next use, the sessions sealed with it that this holdfast tracks, as
    /// it ends them at every replica that never saw them (their tokens no longer open there).
    /// One atomic load while the keys are unchanged; one opening per session after a change. A
    /// session whose id is the server's own (no token) is not the keys' to end.
    fn keys_still_open(&self, session: &Session) -> bool {
        let now = self.keys.generation();
        if session.keys_checked.load(Ordering::Acquire) == now {
            return true;
        }
        let opens = !matches!(
            self.keys.current().open(session.client_id().as_bytes()),
            Err(Refused::Unopened | Refused::Malformed)
        );
        if opens {
            session.keys_checked.store(now, Ordering::Release);
        }
        opens
    }

    /// The session a request's `Mcp-Session-Id` names: tracked (and not idle too long), or
    /// opened from its token.
    pub fn lookup(&self, client_id: &HeaderValue) -> Result<Arc<Session>, Miss> {
        let now_ms = self.now_ms();
        {
            let mut inner = self.lock();
            if let Some(session) = inner.by_client_id.get(client_id).cloned() {
                if !self.is_idle(&session, now_ms) && self.keys_still_open(&session) {
                    session.last_used.store(now_ms, Ordering::Relaxed);
                    return Ok(session);
                }
                inner.by_client_id.remove(client_id);
                self.tracked.set(inner.by_client_id.len() as i64);
            }
        }
        // Opened outside the lock: a failed open costs every key's try.
        let contents = match self.keys.current().open(client_id.as_bytes()) {
            Ok(contents) => contents,
            Err(Refused::NotAToken) => return Err(Miss::Unknown),
            Err(Refused::Malformed) => return Err(Miss::Refused(TokenRefusal::Malformed)),
            Err(Refused::Unopened) => return Err(Miss::Refused(TokenRefusal::Unopened)),
        };
        let nonce = token::nonce(client_id.as_bytes()).expect("an opened token has a nonce");
        let mut inner = self.lock();
        if inner.ended.contains(&nonce) {
            return Err(Miss::Refused(TokenRefusal::Ended));
        }
        // Another request with the same token may have opened it meanwhile.
        if let Some(session) = inner.by_client_id.get(client_id) {
            return Ok(session.clone());
        }
        let opened = Opened {
            client_id: client_id.clone(),
            upstream_id: contents.upstream_id,
            origin: Origin::Token,
            issued: Some(contents.issued),
            initialize: contents.initialize,
            endpoint: contents.endpoint,
            protocol_version: contents.protocol_version,
        };
        Ok(self.insert(&mut inner, opened, now_ms))
    }

    /// Starts tracking a session the upstream just opened as `upstream_id` with `initialize`
    /// (sent to `uri`), and seals the token its client holds from now on.
    pub fn record(
        &self,
        upstream_id: HeaderValue,
        initialize: Bytes,
        uri: &Uri,
        protocol_version: Option<HeaderValue>,
    ) -> Recorded {
        if initialize.len() > self.live.max_initialize_bytes() {
            return Recorded::TooLarge;
        }
        let issued = unix_now();
        let contents = Contents {
            issued,
            upstream_id: upstream_id.clone(),
            protocol_version: protocol_version.clone(),
            endpoint: uri.path().to_owned(),
            initialize: initialize.clone(),
        };
        let token = self.keys.current().seal(&contents);
        let (client_id, issued) = match token.map(HeaderValue::try_from) {
            Some(Ok(token)) => (token, Some(issued)),
            _ => {
                if !self.said_too_large.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        limit = token::MAX_TOKEN_LEN,
                        "an initialize does not fit a session token even compressed: its \
                         session keeps the server's id and lives in this holdfast's memory \
                         only (said once)"
                    );
                }
                (upstream_id.clone(), None)
            }
        };
        let opened = Opened {
            client_id: client_id.clone(),
            upstream_id,
            origin: Origin::Initialize,
            issued,
            initialize,
            endpoint: contents.endpoint,
            protocol_version,
        };
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        if inner.last_sweep.elapsed() >= SWEEP_EVERY {
            inner.last_sweep = Instant::now();
            inner.by_client_id.retain(|_, s| !self.is_idle(s, now_ms));
        }
        self.insert(&mut inner, opened, now_ms);
        Recorded::Tracked(client_id)
    }

    /// Adds a session and makes room for it.
    fn insert(&self, inner: &mut Inner, opened: Opened, now_ms: u64) -> Arc<Session> {
        let session = Arc::new(Session::new(opened, now_ms, self.recorded.clone()));
        session
            .keys_checked
            .store(self.keys.generation(), Ordering::Release);
        let client_id = session.client_id().clone();
        // A session with this id already (a server reusing ids): the new one replaces it.
        inner
            .by_client_id
            .insert(client_id.clone(), session.clone());
        self.make_room(inner, &client_id);
        self.tracked.set(inner.by_client_id.len() as i64);
        session
    }

    /// Evicts sessions while a bound is exceeded: first those never re-established (forgetting
    /// one costs nothing until the server restarts, and one with a token comes back from its
    /// next request), least recently used first. One pass evicts a sixty-fourth of the store,
    /// so a full store does not scan on every new session. Bytes of evicted sessions still in
    /// use by a request come back only when it ends, so the byte bound gets one pass per new
    /// session, not a loop that could empty the store.
    fn make_room(&self, inner: &mut Inner, newest: &HeaderValue) {
        while inner.by_client_id.len() > self.live.max_tracked() {
            self.evict_batch(inner, newest);
        }
        if self.recorded.load(Ordering::Acquire) > self.live.max_recorded_bytes() {
            self.evict_batch(inner, newest);
        }
    }

    /// Evicts a batch, never `newest` (the session just recorded).
    fn evict_batch(&self, inner: &mut Inner, newest: &HeaderValue) {
        let mut ages: Vec<((bool, u64), HeaderValue)> = inner
            .by_client_id
            .values()
            .filter(|s| s.client_id() != newest)
            .map(|s| {
                let age = (s.is_mapped(), s.last_used.load(Ordering::Relaxed));
                (age, s.client_id().clone())
            })
            .collect();
        let evict = (ages.len() / 64).max(1).min(ages.len());
        if evict == 0 {
            return;
        }
        if evict < ages.len() {
            ages.select_nth_unstable_by_key(evict - 1, |(age, _)| *age);
        }
        let mut mapped = 0;
        for ((was_mapped, _), id) in ages.into_iter().take(evict) {
            mapped += usize::from(was_mapped);
            inner.by_client_id.remove(&id);
        }
        if mapped > 0 {
            tracing::warn!(
                forgotten = mapped,
                "forgot re-established MCP sessions to stay within sessions.max_tracked or \
                 sessions.max_recorded_bytes: their next requests re-establish them again"
            );
        }
    }

    /// Seals a token for a session no server keeps (the era bridge's sessions for 2025 clients of
    /// a 2026-07-28-only server, src/proxy/forward/modern.rs): the token is all there is of it,
    /// so it is not tracked. `None` when the `initialize` does not fit a token.
    pub fn seal_untracked(
        &self,
        upstream_id: HeaderValue,
        initialize: Bytes,
        uri: &Uri,
        protocol_version: Option<HeaderValue>,
    ) -> Option<HeaderValue> {
        let contents = Contents {
            issued: unix_now(),
            upstream_id,
            protocol_version,
            endpoint: uri.path().to_owned(),
            initialize,
        };
        HeaderValue::try_from(self.keys.current().seal(&contents)?).ok()
    }

    /// What an untracked session's token ([`Table::seal_untracked`]) carries, unless it does not
    /// open, was ended here (DELETE) or is older than `sessions.token_max_age_secs`.
    pub fn open_untracked(&self, token: &[u8]) -> Option<Contents> {
        let contents = self.keys.current().open(token).ok()?;
        let age = Duration::from_secs(unix_now().saturating_sub(contents.issued));
        let nonce = token::nonce(token)?;
        let ended = self.lock().ended.contains(&nonce);
        (!ended && age <= self.token_max_age()).then_some(contents)
    }

    /// The client ended the session (DELETE): forgotten, and its token never opened here again.
    pub fn end(&self, client_id: &HeaderValue) {
        let mut inner = self.lock();
        if inner.by_client_id.remove(client_id).is_some() {
            self.tracked.set(inner.by_client_id.len() as i64);
        }
        let Some(nonce) = token::nonce(client_id.as_bytes()) else {
            return;
        };
        if inner.ended.insert(nonce) {
            inner.ended_order.push_back(nonce);
            if inner.ended_order.len() > self.live.max_tracked() {
                let oldest = inner.ended_order.pop_front().expect("not empty");
                inner.ended.remove(&oldest);
            }
        }
    }

    /// Sessions tracked now.
    pub fn len(&self) -> usize {
        self.lock().by_client_id.len()
    }

    /// Whether no session is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes recorded over all sessions.
    pub fn recorded_bytes(&self) -> usize {
        self.recorded.load(Ordering::Acquire)
    }

    /// Whether one more subscription URI of `len` bytes fits the store's byte bound.
    fn has_room_for(&self, len: usize) -> bool {
        self.recorded.load(Ordering::Acquire) + len <= self.live.max_recorded_bytes()
    }

    /// Records what a successful request changed on `session`.
    pub fn note_state(&self, session: &Session, changes: Vec<StateChange>) {
        let mut state = session.lock();
        for change in changes {
            match change {
                StateChange::SetLevel(level) => state.log_level = Some(level),
                StateChange::Subscribe(uri) => {
                    if state.subscriptions.contains(&uri) {
                        continue;
                    }
                    if state.subscriptions.len() >= MAX_SUBSCRIPTIONS
                        || !self.has_room_for(uri.len())
                    {
                        tracing::warn!(
                            "a resource subscription is not recorded (too many on this session, \
                             or sessions.max_recorded_bytes reached): it will not be applied \
                             again if the server restarts"
                        );
                        continue;
                    }
                    state.bytes += uri.len();
                    self.recorded.fetch_add(uri.len(), Ordering::AcqRel);
                    state.subscriptions.insert(uri);
                }
                StateChange::Unsubscribe(uri) => {
                    if state.subscriptions.remove(&uri) {
                        state.bytes -= uri.len();
                        self.recorded.fetch_sub(uri.len(), Ordering::AcqRel);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
