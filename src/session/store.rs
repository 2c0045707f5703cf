//! The sessions holdfast carries: what each was opened with, what was set on it since, and which
//! upstream session id stands for the client's now.
//!
//! Bounded three ways (see the README): at most `max_tracked` sessions (the least recently used
//! go first), at most `max_recorded_bytes` of recorded requests over all of them, and a session
//! idle for `idle_timeout` is forgotten. Nothing recorded is ever logged: an `initialize` body
//! may carry client details, and the session ids are credentials of a sort.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Uri};
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use super::rpc::StateChange;
use super::{LAST_EVENT_ID, MCP_SESSION_ID};
use crate::config;

/// How often, at most, a new session triggers a sweep for idle ones.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Most resource subscriptions remembered per session; more are not applied again on a resume.
const MAX_SUBSCRIPTIONS: usize = 256;

/// Every tracked session, by the id its client knows.
pub struct Sessions {
    settings: config::Sessions,
    inner: Mutex<Inner>,
    /// Recorded bytes over all sessions (initialize bodies and subscription URIs).
    recorded: Arc<AtomicUsize>,
    /// When this store was made: `last_used` times count from here.
    epoch: Instant,
    /// `holdfast_sessions_tracked`.
    tracked: Gauge,
}

struct Inner {
    by_client_id: HashMap<HeaderValue, Arc<Session>>,
    last_sweep: Instant,
}

/// One tracked session.
pub struct Session {
    /// The id the client holds (the first upstream id, which the client was given).
    client_id: HeaderValue,
    /// Milliseconds from the store's epoch to the last request on this session.
    last_used: AtomicU64,
    state: Mutex<State>,
    /// Held while the session is re-established: one resume at a time.
    resuming: tokio::sync::Mutex<()>,
    /// The store's byte count, given back when this session goes.
    recorded: Arc<AtomicUsize>,
}

struct State {
    /// The id the upstream knows this session by now.
    upstream_id: HeaderValue,
    /// The client's `initialize` request body, verbatim.
    initialize: Bytes,
    /// Where the client sent it (the upstream URI).
    uri: Uri,
    /// The `MCP-Protocol-Version` the client sends on this session.
    protocol_version: Option<HeaderValue>,
    /// The last `logging/setLevel` that succeeded.
    log_level: Option<String>,
    /// Resource URIs subscribed to and not unsubscribed.
    subscriptions: BTreeSet<String>,
    /// The upstream session changed since the client's GET stream last opened: a
    /// `Last-Event-ID` the client sends names an event of the old session, meaningless to the
    /// new one.
    drop_last_event_id: bool,
    /// Bytes of this session counted in the store's total.
    bytes: usize,
}

/// What re-establishing a session sends, copied out so no lock is held while it is sent.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The recorded `initialize` body.
    pub initialize: Bytes,
    /// `MCP-Protocol-Version` for the requests after the initialize, if the client sent one.
    pub protocol_version: Option<HeaderValue>,
    /// State to set again, in order.
    pub state: Vec<StateChange>,
}

/// What [`Sessions::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The session is tracked.
    Tracked,
    /// The initialize body is larger than `sessions.max_initialize_bytes`: not tracked.
    TooLarge,
}

impl Sessions {
    /// An empty store; `tracked` is the `holdfast_sessions_tracked` gauge.
    pub fn new(settings: config::Sessions, tracked: Gauge) -> Sessions {
        let now = Instant::now();
        Sessions {
            settings,
            inner: Mutex::new(Inner {
                by_client_id: HashMap::new(),
                last_sweep: now,
            }),
            recorded: Arc::new(AtomicUsize::new(0)),
            epoch: now,
            tracked,
        }
    }

    /// Whether sessions are carried across restarts at all (`sessions.resume`).
    pub fn enabled(&self) -> bool {
        self.settings.resume
    }

    /// Most bytes of an `initialize` body that is still tracked.
    pub fn max_initialize_bytes(&self) -> usize {
        self.settings.max_initialize_bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("sessions lock")
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn is_idle(&self, session: &Session, now_ms: u64) -> bool {
        let idle_ms = now_ms.saturating_sub(session.last_used.load(Ordering::Relaxed));
        Duration::from_millis(idle_ms) > self.settings.idle_timeout
    }

    /// The session a request's `Mcp-Session-Id` names, if tracked (and not idle too long).
    pub fn lookup(&self, client_id: &HeaderValue) -> Option<Arc<Session>> {
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        let session = inner.by_client_id.get(client_id)?.clone();
        if self.is_idle(&session, now_ms) {
            inner.by_client_id.remove(client_id);
            self.tracked.set(inner.by_client_id.len() as i64);
            return None;
        }
        session.last_used.store(now_ms, Ordering::Relaxed);
        Some(session)
    }

    /// Starts tracking a session the upstream just opened with `initialize` (sent to `uri`).
    /// Makes room first: idle sessions, then the least recently used, until both the count and
    /// the byte bounds hold.
    pub fn record(
        &self,
        client_id: HeaderValue,
        initialize: Bytes,
        uri: Uri,
        protocol_version: Option<HeaderValue>,
    ) -> Recorded {
        if initialize.len() > self.settings.max_initialize_bytes {
            return Recorded::TooLarge;
        }
        let now_ms = self.now_ms();
        let bytes = initialize.len();
        let session = Arc::new(Session {
            client_id: client_id.clone(),
            last_used: AtomicU64::new(now_ms),
            state: Mutex::new(State {
                upstream_id: client_id.clone(),
                initialize,
                uri,
                protocol_version,
                log_level: None,
                subscriptions: BTreeSet::new(),
                drop_last_event_id: false,
                bytes,
            }),
            resuming: tokio::sync::Mutex::new(()),
            recorded: self.recorded.clone(),
        });
        self.recorded.fetch_add(bytes, Ordering::AcqRel);
        let mut inner = self.lock();
        if inner.last_sweep.elapsed() >= SWEEP_EVERY {
            inner.last_sweep = Instant::now();
            inner.by_client_id.retain(|_, s| !self.is_idle(s, now_ms));
        }
        // A session with this id already (a server reusing ids): the new one replaces it.
        inner.by_client_id.insert(client_id.clone(), session);
        self.make_room(&mut inner, &client_id);
        self.tracked.set(inner.by_client_id.len() as i64);
        Recorded::Tracked
    }

    /// Evicts sessions while a bound is exceeded: first those never re-established (forgetting
    /// one costs nothing until the server restarts), least recently used first. One pass evicts
    /// a sixty-fourth of the store, so a full store does not scan on every new session. Bytes of
    /// evicted sessions still in use by a request come back only when it ends, so the byte bound
    /// gets one pass per new session, not a loop that could empty the store.
    fn make_room(&self, inner: &mut Inner, newest: &HeaderValue) {
        while inner.by_client_id.len() > self.settings.max_tracked {
            self.evict_batch(inner, newest);
        }
        if self.recorded.load(Ordering::Acquire) > self.settings.max_recorded_bytes {
            self.evict_batch(inner, newest);
        }
    }

    /// Evicts a batch, never `newest` (the session just recorded).
    fn evict_batch(&self, inner: &mut Inner, newest: &HeaderValue) {
        let mut ages: Vec<((bool, u64), HeaderValue)> = inner
            .by_client_id
            .values()
            .filter(|s| s.client_id != *newest)
            .map(|s| {
                let age = (s.is_mapped(), s.last_used.load(Ordering::Relaxed));
                (age, s.client_id.clone())
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
                 sessions.max_recorded_bytes: their next requests get the server's 404"
            );
        }
    }

    /// Stops tracking (the client ended the session with DELETE).
    pub fn forget(&self, client_id: &HeaderValue) {
        let mut inner = self.lock();
        if inner.by_client_id.remove(client_id).is_some() {
            self.tracked.set(inner.by_client_id.len() as i64);
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
        self.recorded.load(Ordering::Acquire) + len <= self.settings.max_recorded_bytes
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

impl Session {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("session lock")
    }

    /// The id the client knows.
    pub fn client_id(&self) -> &HeaderValue {
        &self.client_id
    }

    /// Whether `uri` is the endpoint the session was opened on (the path; the query may differ).
    pub fn is_endpoint(&self, uri: &Uri) -> bool {
        self.lock().uri.path() == uri.path()
    }

    /// The id the upstream knows this session by now.
    pub fn upstream_id(&self) -> HeaderValue {
        self.lock().upstream_id.clone()
    }

    /// Points a request at the upstream session: its `Mcp-Session-Id` becomes the current
    /// upstream id, and a stale `Last-Event-ID` is dropped from a GET. Notes the client's
    /// `MCP-Protocol-Version`. Returns the id sent.
    pub fn apply(&self, headers: &mut HeaderMap, is_get: bool) -> HeaderValue {
        let mut state = self.lock();
        if let Some(version) = headers.get(super::MCP_PROTOCOL_VERSION) {
            if state.protocol_version.as_ref() != Some(version) {
                state.protocol_version = Some(version.clone());
            }
        }
        if state.upstream_id != self.client_id {
            headers.insert(MCP_SESSION_ID, state.upstream_id.clone());
            if is_get && state.drop_last_event_id {
                headers.remove(LAST_EVENT_ID);
            }
        }
        state.upstream_id.clone()
    }

    /// Gives the client back its own id where the upstream's answer names `sent`, the upstream
    /// id the request went with (another request may have re-established the session since).
    pub fn rewrite_response(&self, headers: &mut HeaderMap, sent: &HeaderValue) {
        if *sent != self.client_id && headers.get(MCP_SESSION_ID) == Some(sent) {
            headers.insert(MCP_SESSION_ID, self.client_id.clone());
        }
    }

    /// Whether the session was re-established: the client's id then stands for another one
    /// upstream, and forgetting it breaks a session the server still has.
    fn is_mapped(&self) -> bool {
        self.lock().upstream_id != self.client_id
    }

    /// The client's GET stream opened on the current upstream session: the event ids it now
    /// receives are the new session's, so its `Last-Event-ID` is meaningful again.
    pub fn stream_opened(&self) {
        self.lock().drop_last_event_id = false;
    }

    /// What to send to re-establish this session.
    pub fn plan(&self) -> Plan {
        let state = self.lock();
        let mut changes: Vec<StateChange> = state
            .log_level
            .iter()
            .map(|l| StateChange::SetLevel(l.clone()))
            .collect();
        changes.extend(
            state
                .subscriptions
                .iter()
                .map(|u| StateChange::Subscribe(u.clone())),
        );
        Plan {
            initialize: state.initialize.clone(),
            protocol_version: state.protocol_version.clone(),
            state: changes,
        }
    }

    /// The session was re-established upstream as `upstream_id`.
    pub fn resumed(&self, upstream_id: HeaderValue) {
        let mut state = self.lock();
        state.upstream_id = upstream_id;
        state.drop_last_event_id = true;
    }

    /// Waits for any other resume of this session to finish, then holds the right to resume.
    pub async fn lock_resume(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.resuming.lock().await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let bytes = self.state.get_mut().map(|s| s.bytes).unwrap_or(0);
        self.recorded.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> config::Sessions {
        config::Sessions {
            resume: true,
            max_tracked: 4,
            max_initialize_bytes: 100,
            max_recorded_bytes: 1000,
            idle_timeout: Duration::from_secs(60),
        }
    }

    fn id(n: usize) -> HeaderValue {
        HeaderValue::from_str(&format!("session-{n}")).unwrap()
    }

    fn record(store: &Sessions, n: usize, bytes: usize) -> Recorded {
        store.record(
            id(n),
            Bytes::from(vec![b'x'; bytes]),
            Uri::from_static("/mcp"),
            None,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn least_recently_used_go_first() {
        let gauge = Gauge::default();
        let store = Sessions::new(settings(), gauge.clone());
        for n in 0..4 {
            assert_eq!(record(&store, n, 10), Recorded::Tracked);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // Session 0 is used again, so session 1 is now the least recently used.
        assert!(store.lookup(&id(0)).is_some());
        tokio::time::advance(Duration::from_millis(10)).await;
        record(&store, 4, 10);
        assert_eq!(store.len(), 4);
        assert_eq!(gauge.get(), 4);
        assert!(store.lookup(&id(1)).is_none());
        assert!(store.lookup(&id(0)).is_some());
        assert!(store.lookup(&id(4)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn re_established_sessions_are_evicted_last() {
        let store = Sessions::new(settings(), Gauge::default());
        for n in 0..4 {
            record(&store, n, 10);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // The server knows session 0 by another id now.
        store
            .lookup(&id(0))
            .unwrap()
            .resumed(HeaderValue::from_static("elsewhere"));
        // Looking it up made it the most recent; the others are used after it, so it is the
        // least recently used again.
        for n in 1..4 {
            tokio::time::advance(Duration::from_millis(10)).await;
            store.lookup(&id(n)).unwrap();
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        record(&store, 4, 10);
        assert!(store.lookup(&id(0)).is_some(), "the mapped one stays");
        assert!(
            store.lookup(&id(1)).is_none(),
            "the oldest unmapped one goes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_held_by_requests_do_not_empty_the_store() {
        let store = Sessions::new(settings(), Gauge::default());
        record(&store, 0, 100);
        // A request holds session 0 while it is evicted; its bytes stay counted until it ends.
        let held = store.lookup(&id(0)).unwrap();
        store.note_state(&held, vec![StateChange::Subscribe("u".repeat(850))]);
        tokio::time::advance(Duration::from_millis(10)).await;
        record(&store, 1, 100);
        tokio::time::advance(Duration::from_millis(10)).await;
        record(&store, 2, 100);
        assert!(store.recorded_bytes() > 1000);
        // Over the byte bound with bytes nobody can free now: one eviction per new session, and
        // the newest sessions stay.
        assert!(store.lookup(&id(2)).is_some());
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_bound_holds_and_is_given_back() {
        let store = Sessions::new(settings(), Gauge::default());
        assert_eq!(record(&store, 0, 101), Recorded::TooLarge);
        assert_eq!(store.recorded_bytes(), 0);
        for n in 0..4 {
            record(&store, n, 100);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        let session = store.lookup(&id(3)).unwrap();
        // 400 recorded; subscriptions count too, within the 1000-byte bound.
        store.note_state(&session, vec![StateChange::Subscribe("u".repeat(500))]);
        assert_eq!(store.recorded_bytes(), 900);
        store.note_state(&session, vec![StateChange::Subscribe("v".repeat(200))]);
        assert_eq!(store.recorded_bytes(), 900, "over the bound: not recorded");
        store.note_state(&session, vec![StateChange::Unsubscribe("u".repeat(500))]);
        assert_eq!(store.recorded_bytes(), 400);
        drop(session);
        store.forget(&id(3));
        assert_eq!(store.recorded_bytes(), 300);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_are_forgotten() {
        let gauge = Gauge::default();
        let store = Sessions::new(settings(), gauge.clone());
        record(&store, 0, 10);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(store.lookup(&id(0)).is_some(), "used within the idle time");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(store.lookup(&id(0)).is_none());
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn a_resumed_session_rewrites_both_ways_and_drops_a_stale_event_id() {
        let store = Sessions::new(settings(), Gauge::default());
        record(&store, 0, 10);
        let session = store.lookup(&id(0)).unwrap();
        let new = HeaderValue::from_static("fresh");
        session.resumed(new.clone());

        let mut request = HeaderMap::new();
        request.insert(MCP_SESSION_ID, id(0));
        request.insert(LAST_EVENT_ID, HeaderValue::from_static("old-7"));
        request.insert(
            super::super::MCP_PROTOCOL_VERSION,
            HeaderValue::from_static("2025-06-18"),
        );
        assert_eq!(session.apply(&mut request, true), new);
        assert_eq!(request.get(MCP_SESSION_ID), Some(&new));
        assert!(request.get(LAST_EVENT_ID).is_none());
        assert_eq!(
            session.plan().protocol_version,
            Some(HeaderValue::from_static("2025-06-18"))
        );

        // Once the stream opened on the new session, its event ids are the new session's.
        session.stream_opened();
        let mut again = HeaderMap::new();
        again.insert(MCP_SESSION_ID, id(0));
        again.insert(LAST_EVENT_ID, HeaderValue::from_static("new-1"));
        session.apply(&mut again, true);
        assert_eq!(again.get(LAST_EVENT_ID).unwrap(), "new-1");

        let mut response = HeaderMap::new();
        response.insert(MCP_SESSION_ID, new.clone());
        session.rewrite_response(&mut response, &new);
        assert_eq!(response.get(MCP_SESSION_ID), Some(&id(0)));
    }

    #[tokio::test]
    async fn the_plan_sets_the_last_level_and_live_subscriptions() {
        let store = Sessions::new(settings(), Gauge::default());
        record(&store, 0, 10);
        let session = store.lookup(&id(0)).unwrap();
        store.note_state(
            &session,
            vec![
                StateChange::SetLevel("debug".into()),
                StateChange::Subscribe("a".into()),
                StateChange::Subscribe("b".into()),
                StateChange::Unsubscribe("a".into()),
                StateChange::SetLevel("error".into()),
            ],
        );
        assert_eq!(
            session.plan().state,
            vec![
                StateChange::SetLevel("error".into()),
                StateChange::Subscribe("b".into())
            ]
        );
    }
}
