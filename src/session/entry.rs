//! One tracked session: what it was opened with, what was set on it since, and which upstream
//! session id stands for the client's now.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Uri};

use super::rpc::StateChange;
use super::shared::SharedState;
use super::told::{List, Offer, Told};
use super::{LAST_EVENT_ID, MCP_SESSION_ID};

/// One tracked session.
pub struct Session {
    /// The id the client holds: a token ([`super::token`]) or, when none could be made, the
    /// first upstream id itself.
    pub(super) client_id: HeaderValue,
    /// The upstream id the session started with (the token's): re-established once it differs.
    first_upstream: HeaderValue,
    /// Where the record came from, for the metrics of a re-establishment.
    pub(super) origin: Origin,
    /// When its token was sealed (seconds since the Unix epoch); `None` without a token.
    issued: Option<u64>,
    /// Milliseconds from the store's epoch to the last request on this session.
    pub(super) last_used: AtomicU64,
    /// The keys' generation its token was last seen to open under ([`super::Keys`]).
    pub(super) keys_checked: AtomicU64,
    state: Mutex<State>,
    /// Held while the session is re-established: one resume at a time.
    resuming: tokio::sync::Mutex<()>,
    /// Woken when the client has notifications waiting ([`Session::tell`]): its kept event
    /// stream writes them.
    news: tokio::sync::Notify,
    /// Ended: by its client (DELETE), or by holdfast because the server changed
    /// (`[sessions.on_change]`). A request that waited for that re-establishment does not try
    /// another, and its kept event stream is not reopened.
    ended: std::sync::atomic::AtomicBool,
    /// A DELETE of it is on its way: the server may end its streams before it answers.
    closing: std::sync::atomic::AtomicBool,
    /// The store's byte count, given back when this session goes.
    recorded: Arc<AtomicUsize>,
}

/// Where a session's record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This holdfast saw the `initialize`.
    Initialize,
    /// Opened from the client's token: the session started before this holdfast did, or at
    /// another replica.
    Token,
}

pub(super) struct State {
    /// The id the upstream knows this session by now.
    upstream_id: HeaderValue,
    /// The client's `initialize` request body, verbatim.
    initialize: Bytes,
    /// The endpoint path it was sent to.
    endpoint: String,
    /// The `MCP-Protocol-Version` the client sends on this session (until it sent one, the
    /// version its `initialize` asked for).
    protocol_version: Option<HeaderValue>,
    /// The client sent `protocol_version` itself: the version it agreed on.
    version_sent: bool,
    /// The last `logging/setLevel` that succeeded.
    pub(super) log_level: Option<String>,
    /// Resource URIs subscribed to and not unsubscribed.
    pub(super) subscriptions: BTreeSet<String>,
    /// The upstream session changed since the client's GET stream last opened: a
    /// `Last-Event-ID` the client sends names an event of the old session, meaningless to the
    /// new one.
    drop_last_event_id: bool,
    /// What the client was told: the `initialize` result and the lists, as digests.
    told: Told,
    /// Bytes of this session counted in the store's total.
    pub(super) bytes: usize,
}

/// What re-establishing a session sends, copied out so no lock is held while it is sent.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The recorded `initialize` body.
    pub initialize: Bytes,
    /// `MCP-Protocol-Version` for the requests after the initialize, if the client sent one.
    pub protocol_version: Option<HeaderValue>,
    /// The version the client sends on every request, the one it agreed on, when it sends one
    /// (clients of 2025-03-26 send none).
    pub agreed: Option<HeaderValue>,
    /// State to set again, in order.
    pub state: Vec<StateChange>,
}

/// What a new [`Session`] is made of.
pub(super) struct Opened {
    pub client_id: HeaderValue,
    pub upstream_id: HeaderValue,
    pub origin: Origin,
    pub issued: Option<u64>,
    pub initialize: Bytes,
    pub endpoint: String,
    pub protocol_version: Option<HeaderValue>,
}

/// Seconds since the Unix epoch now.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Session {
    /// A session as `opened`, used last at `now_ms`, its bytes counted in `recorded`.
    pub(super) fn new(opened: Opened, now_ms: u64, recorded: Arc<AtomicUsize>) -> Session {
        let bytes = opened.initialize.len();
        recorded.fetch_add(bytes, Ordering::AcqRel);
        Session {
            client_id: opened.client_id,
            first_upstream: opened.upstream_id.clone(),
            origin: opened.origin,
            issued: opened.issued,
            last_used: AtomicU64::new(now_ms),
            // The store sets it to the keys in use as it tracks the session.
            keys_checked: AtomicU64::new(0),
            state: Mutex::new(State {
                upstream_id: opened.upstream_id,
                initialize: opened.initialize,
                endpoint: opened.endpoint,
                protocol_version: opened.protocol_version,
                version_sent: false,
                log_level: None,
                subscriptions: BTreeSet::new(),
                drop_last_event_id: false,
                told: Told::default(),
                bytes,
            }),
            resuming: tokio::sync::Mutex::new(()),
            news: tokio::sync::Notify::new(),
            ended: std::sync::atomic::AtomicBool::new(false),
            closing: std::sync::atomic::AtomicBool::new(false),
            recorded,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("session lock")
    }

    /// The id the client knows.
    pub fn client_id(&self) -> &HeaderValue {
        &self.client_id
    }

    /// Where the record came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the session's token is older than `max_age`: it is not re-established then.
    pub fn is_too_old(&self, max_age: Duration) -> bool {
        self.issued
            .is_some_and(|issued| unix_now().saturating_sub(issued) > max_age.as_secs())
    }

    /// Whether `uri` is the endpoint the session was opened on (the path; the query may differ).
    pub fn is_endpoint(&self, uri: &Uri) -> bool {
        self.lock().endpoint == uri.path()
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
            state.version_sent = true;
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

    /// Whether the session was re-established here: the client's id then stands for another
    /// upstream session than its token says, and forgetting it breaks a session the server
    /// still has.
    pub fn is_mapped(&self) -> bool {
        self.lock().upstream_id != self.first_upstream
    }

    /// The client's GET stream opened on the current upstream session: the event ids it now
    /// receives are the new session's, so its `Last-Event-ID` is meaningful again.
    pub fn stream_opened(&self) {
        self.lock().drop_last_event_id = false;
    }

    /// The nonce of the session's token, which names it in the shared store (`None` without a
    /// token).
    pub fn nonce(&self) -> Option<[u8; 12]> {
        super::token::nonce(self.client_id.as_bytes())
    }

    /// What was set on the session after its initialize: what a re-establishment sets again,
    /// and what is shared with other replicas ([`super::shared`]).
    pub fn shared_state(&self) -> SharedState {
        Self::set_since_initialize(&self.lock())
    }

    fn set_since_initialize(state: &State) -> SharedState {
        SharedState {
            level: state.log_level.clone(),
            subscriptions: state.subscriptions.iter().cloned().collect(),
        }
    }

    /// What to send to re-establish this session.
    pub fn plan(&self) -> Plan {
        let state = self.lock();
        Plan {
            initialize: state.initialize.clone(),
            protocol_version: state.protocol_version.clone(),
            agreed: state
                .protocol_version
                .clone()
                .filter(|_| state.version_sent),
            state: Self::set_since_initialize(&state).changes(),
        }
    }

    /// The session was re-established upstream as `upstream_id`.
    pub fn resumed(&self, upstream_id: HeaderValue) {
        let mut state = self.lock();
        state.upstream_id = upstream_id;
        state.drop_last_event_id = true;
    }

    /// The server answered the session's `initialize` with `result` (what its client caches).
    pub fn offered(&self, result: &serde_json::Value) {
        self.lock().told.offered(result);
    }

    /// The client received a page of `list` (`first`: asked without a cursor); `None` when it
    /// could not be read.
    pub fn listed(&self, list: List, first: bool, result: Option<&serde_json::Value>) {
        self.lock().told.page(list, first, result);
    }

    /// Reads what the client was told.
    pub fn told<R>(&self, read: impl FnOnce(&Told) -> R) -> R {
        read(&self.lock().told)
    }

    /// After a re-establishment: the client is now told of `offer` and these lists, and is to
    /// hear that `changed` lists changed (its event stream is woken).
    pub fn told_now(
        &self,
        offer: Offer,
        lists: &[(List, Option<super::told::Digest>)],
        changed: &[List],
    ) {
        {
            let mut state = self.lock();
            state.told.now(offer, lists);
            state.told.tell(changed.iter().copied());
        }
        if !changed.is_empty() {
            // A permit is kept when no stream waits: the next one to open takes it.
            self.news.notify_one();
        }
    }

    /// The notifications waiting for the client (as [`List`] bits), taken.
    pub fn take_news(&self) -> u8 {
        self.lock().told.take_pending()
    }

    /// Resolves when notifications may be waiting ([`Session::take_news`]).
    pub async fn news(&self) {
        self.news.notified().await;
    }

    /// The session ended: its client ended it, or the server changed in a way
    /// `[sessions.on_change]` ends it for.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// Whether the session ended ([`Session::end`]).
    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Its client's DELETE is on its way (`true`), or was answered without ending it.
    pub fn closing(&self, closing: bool) {
        self.closing.store(closing, Ordering::Release);
    }

    /// Whether it ended, or a DELETE of it is on its way: its streams are not asked for again.
    pub fn is_ending(&self) -> bool {
        self.is_ended() || self.closing.load(Ordering::Acquire)
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
