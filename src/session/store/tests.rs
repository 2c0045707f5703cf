use http::HeaderMap;

use super::*;
use crate::config::{SessionKey, SessionKeys};
use crate::session::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};

fn settings() -> config::Sessions {
    config::Sessions {
        resume: true,
        max_tracked: 4,
        max_initialize_bytes: 100,
        max_recorded_bytes: 1000,
        idle_timeout: Duration::from_secs(60),
        keys: keys(&[1]),
        token_max_age: Duration::from_secs(3600),
        store: None,
        store_tls: None,
        key_file_warning: None,
        on_change: crate::config::OnChange::default(),
    }
}

/// A key file's keys, each made from one byte.
fn keys(bytes: &[u8]) -> SessionKeys {
    SessionKeys {
        file: Some("/keys".into()),
        keys: bytes
            .iter()
            .map(|&b| {
                let mut k = [b; 32];
                k[31] = !b;
                SessionKey(k)
            })
            .collect(),
        deployment: String::new(),
    }
}

/// The upstream's id of session `n`.
fn upstream(n: usize) -> HeaderValue {
    HeaderValue::from_str(&format!("session-{n}")).unwrap()
}

/// Records session `n` with an initialize of `bytes`; the id its client holds.
fn record(store: &Table, n: usize, bytes: usize) -> HeaderValue {
    match store.record(
        upstream(n),
        Bytes::from(vec![b'x'; bytes]),
        &Uri::from_static("/mcp?x=1"),
        None,
    ) {
        Recorded::Tracked(id) => id,
        Recorded::TooLarge => panic!("not tracked"),
    }
}

impl Table {
    /// Whether `client_id` is in the store now (without opening it as [`Table::lookup`]
    /// would).
    fn tracks(&self, client_id: &HeaderValue) -> bool {
        self.lock().by_client_id.contains_key(client_id)
    }
}

#[tokio::test(start_paused = true)]
async fn least_recently_used_go_first() {
    let gauge = Gauge::default();
    let store = Table::new(settings(), gauge.clone());
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(record(&store, n, 10));
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    // Session 0 is used again, so session 1 is now the least recently used.
    assert!(store.lookup(&ids[0]).is_ok());
    tokio::time::advance(Duration::from_millis(10)).await;
    let newest = record(&store, 4, 10);
    assert_eq!(store.len(), 4);
    assert_eq!(gauge.get(), 4);
    assert!(!store.tracks(&ids[1]));
    assert!(store.tracks(&ids[0]));
    assert!(store.tracks(&newest));
    // Its token brings the forgotten one back, with the upstream id it started with.
    let back = store.lookup(&ids[1]).expect("opened from its token");
    assert_eq!(back.upstream_id(), upstream(1));
    assert_eq!(back.origin(), Origin::Token);
}

#[tokio::test(start_paused = true)]
async fn re_established_sessions_are_evicted_last() {
    let store = Table::new(settings(), Gauge::default());
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(record(&store, n, 10));
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    // The server knows session 0 by another id now.
    store
        .lookup(&ids[0])
        .unwrap()
        .resumed(HeaderValue::from_static("elsewhere"));
    // Looking it up made it the most recent; the others are used after it, so it is the
    // least recently used again.
    for id in &ids[1..] {
        tokio::time::advance(Duration::from_millis(10)).await;
        store.lookup(id).unwrap();
    }
    tokio::time::advance(Duration::from_millis(10)).await;
    record(&store, 4, 10);
    assert!(store.tracks(&ids[0]), "the mapped one stays");
    assert!(!store.tracks(&ids[1]), "the oldest unmapped one goes");
}

#[tokio::test(start_paused = true)]
async fn sessions_held_by_requests_do_not_empty_the_store() {
    let store = Table::new(settings(), Gauge::default());
    let first = record(&store, 0, 100);
    // A request holds session 0 while it is evicted; its bytes stay counted until it ends.
    let held = store.lookup(&first).unwrap();
    store.note_state(&held, vec![StateChange::Subscribe("u".repeat(850))]);
    tokio::time::advance(Duration::from_millis(10)).await;
    record(&store, 1, 100);
    tokio::time::advance(Duration::from_millis(10)).await;
    let third = record(&store, 2, 100);
    assert!(store.recorded_bytes() > 1000);
    // Over the byte bound with bytes nobody can free now: one eviction per new session, and
    // the newest sessions stay.
    assert!(store.tracks(&third));
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn the_byte_bound_holds_and_is_given_back() {
    let store = Table::new(settings(), Gauge::default());
    let too_large = store.record(
        upstream(0),
        Bytes::from(vec![b'x'; 101]),
        &Uri::from_static("/mcp"),
        None,
    );
    assert_eq!(too_large, Recorded::TooLarge);
    assert_eq!(store.recorded_bytes(), 0);
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(record(&store, n, 100));
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let session = store.lookup(&ids[3]).unwrap();
    // 400 recorded; subscriptions count too, within the 1000-byte bound.
    store.note_state(&session, vec![StateChange::Subscribe("u".repeat(500))]);
    assert_eq!(store.recorded_bytes(), 900);
    store.note_state(&session, vec![StateChange::Subscribe("v".repeat(200))]);
    assert_eq!(store.recorded_bytes(), 900, "over the bound: not recorded");
    store.note_state(&session, vec![StateChange::Unsubscribe("u".repeat(500))]);
    assert_eq!(store.recorded_bytes(), 400);
    drop(session);
    store.end(&ids[3]);
    assert_eq!(store.recorded_bytes(), 300);
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_are_forgotten() {
    let gauge = Gauge::default();
    let store = Table::new(settings(), gauge.clone());
    let id = record(&store, 0, 10);
    tokio::time::advance(Duration::from_secs(59)).await;
    store.lookup(&id).expect("used within the idle time");
    assert!(store.tracks(&id));
    tokio::time::advance(Duration::from_secs(61)).await;
    // Forgotten as idle, then opened again from the token: a fresh record.
    let again = store.lookup(&id).unwrap();
    assert_eq!(again.origin(), Origin::Token);
    assert_eq!(gauge.get(), 1);
}

#[tokio::test]
async fn the_client_holds_a_token_and_another_replica_opens_it() {
    let here = Table::new(settings(), Gauge::default());
    let init = Bytes::from_static(br#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#);
    let version = Some(HeaderValue::from_static("2025-06-18"));
    let Recorded::Tracked(id) = here.record(
        upstream(7),
        init.clone(),
        &Uri::from_static("/mcp?token=secret"),
        version.clone(),
    ) else {
        panic!("tracked")
    };
    assert!(id.to_str().unwrap().starts_with(token::PREFIX));
    assert_eq!(here.lookup(&id).unwrap().origin(), Origin::Initialize);

    // Another holdfast with the same key (a replica, or this one after a restart).
    let there = Table::new(settings(), Gauge::default());
    let opened = there.lookup(&id).expect("the same key opens it");
    assert_eq!(opened.origin(), Origin::Token);
    assert_eq!(opened.client_id(), &id);
    assert_eq!(opened.upstream_id(), upstream(7));
    assert!(opened.is_endpoint(&Uri::from_static("/mcp")));
    assert!(!opened.is_endpoint(&Uri::from_static("/other")));
    let plan = opened.plan();
    assert_eq!(
        plan.initialize, init,
        "the initialize as the client sent it"
    );
    assert_eq!(plan.protocol_version, version);
    // Requests go upstream with the upstream's id.
    let mut headers = HeaderMap::new();
    headers.insert(MCP_SESSION_ID, id.clone());
    assert_eq!(opened.apply(&mut headers, false), upstream(7));
    assert_eq!(headers.get(MCP_SESSION_ID), Some(&upstream(7)));
    assert!(!opened.is_too_old(Duration::from_secs(3600)));
    // A token sealed two hours ago, with a one-hour limit: mapped, but too old to re-establish.
    let old = there
        .keys()
        .current()
        .seal(&Contents {
            issued: unix_now() - 7200,
            upstream_id: upstream(8),
            protocol_version: None,
            endpoint: "/mcp".into(),
            initialize: init.clone(),
        })
        .unwrap();
    let aged = there.lookup(&HeaderValue::try_from(old).unwrap()).unwrap();
    assert_eq!(aged.upstream_id(), upstream(8));
    assert!(aged.is_too_old(Duration::from_secs(3600)));

    // A holdfast with other keys: an opaque id, refused.
    let elsewhere = Table::new(
        config::Sessions {
            keys: keys(&[9]),
            ..settings()
        },
        Gauge::default(),
    );
    assert_eq!(
        elsewhere.lookup(&id).err(),
        Some(Miss::Refused(TokenRefusal::Unopened))
    );
    assert_eq!(
        here.lookup(&upstream(1)).err(),
        Some(Miss::Unknown),
        "the server's own id"
    );
    let mut cut = id.as_bytes().to_vec();
    cut.truncate(cut.len() - 1);
    assert!(matches!(
        there.lookup(&HeaderValue::from_bytes(&cut).unwrap()),
        Err(Miss::Refused(_))
    ));
}

#[tokio::test]
async fn an_ended_session_is_not_opened_again_here() {
    let store = Table::new(settings(), Gauge::default());
    let id = record(&store, 0, 10);
    store.end(&id);
    assert!(!store.tracks(&id));
    assert_eq!(
        store.lookup(&id).err(),
        Some(Miss::Refused(TokenRefusal::Ended))
    );
    // The tombstones are bounded by max_tracked (4): the oldest goes first.
    for n in 1..=4 {
        let other = record(&store, n, 10);
        store.end(&other);
    }
    assert!(
        store.lookup(&id).is_ok(),
        "past the bound, the oldest ended token opens again (the README says so)"
    );
}

#[tokio::test]
async fn rotation_a_new_first_key_still_opens_the_old_tokens() {
    let old = Table::new(settings(), Gauge::default());
    let id = record(&old, 0, 10);
    let rotated = Table::new(
        config::Sessions {
            keys: keys(&[2, 1]),
            ..settings()
        },
        Gauge::default(),
    );
    assert!(rotated.lookup(&id).is_ok());
    let new = record(&rotated, 1, 10);
    assert_eq!(
        old.lookup(&new).err(),
        Some(Miss::Refused(TokenRefusal::Unopened)),
        "sealed with the new first key"
    );
}

#[tokio::test]
async fn an_initialize_too_large_for_a_token_keeps_the_servers_id() {
    let store = Table::new(
        config::Sessions {
            max_initialize_bytes: 10_000,
            max_recorded_bytes: 100_000,
            ..settings()
        },
        Gauge::default(),
    );
    // Bytes that do not deflate: no token fits.
    let mut noise = vec![0u8; 5000];
    fastrand::fill(&mut noise);
    let recorded = store.record(upstream(3), noise.into(), &Uri::from_static("/mcp"), None);
    assert_eq!(recorded, Recorded::Tracked(upstream(3)));
    let session = store.lookup(&upstream(3)).expect("tracked locally");
    let mut headers = HeaderMap::new();
    headers.insert(MCP_SESSION_ID, upstream(3));
    session.apply(&mut headers, false);
    assert_eq!(headers.get(MCP_SESSION_ID), Some(&upstream(3)));
    assert!(
        !session.is_too_old(Duration::from_secs(1)),
        "no token, no age"
    );
}

#[tokio::test]
async fn a_resumed_session_rewrites_both_ways_and_drops_a_stale_event_id() {
    let store = Table::new(settings(), Gauge::default());
    let id = record(&store, 0, 10);
    let session = store.lookup(&id).unwrap();
    let new = HeaderValue::from_static("fresh");
    session.resumed(new.clone());

    // Until the client sends a version, none is known to be agreed on.
    assert_eq!(session.plan().agreed, None);
    let mut request = HeaderMap::new();
    request.insert(MCP_SESSION_ID, id.clone());
    request.insert(LAST_EVENT_ID, HeaderValue::from_static("old-7"));
    request.insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2025-06-18"));
    assert_eq!(session.apply(&mut request, true), new);
    assert_eq!(
        session.plan().agreed,
        Some(HeaderValue::from_static("2025-06-18"))
    );
    assert_eq!(request.get(MCP_SESSION_ID), Some(&new));
    assert!(request.get(LAST_EVENT_ID).is_none());
    assert_eq!(
        session.plan().protocol_version,
        Some(HeaderValue::from_static("2025-06-18"))
    );

    // Once the stream opened on the new session, its event ids are the new session's.
    session.stream_opened();
    let mut again = HeaderMap::new();
    again.insert(MCP_SESSION_ID, id.clone());
    again.insert(LAST_EVENT_ID, HeaderValue::from_static("new-1"));
    session.apply(&mut again, true);
    assert_eq!(again.get(LAST_EVENT_ID).unwrap(), "new-1");

    let mut response = HeaderMap::new();
    response.insert(MCP_SESSION_ID, new.clone());
    session.rewrite_response(&mut response, &new);
    assert_eq!(response.get(MCP_SESSION_ID), Some(&id));
}

#[tokio::test]
async fn the_plan_sets_the_last_level_and_live_subscriptions() {
    let store = Table::new(settings(), Gauge::default());
    let id = record(&store, 0, 10);
    let session = store.lookup(&id).unwrap();
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

/// A key removed from the key file ends the sessions sealed with it that this holdfast tracks,
/// at their next use, as at any replica that never saw them; a rotation that keeps the old key
/// among the others ends nothing.
#[test]
fn removing_a_key_ends_the_sessions_sealed_with_it_here_too() {
    let store = Table::new(settings(), Gauge::default());
    let id = record(&store, 1, 10);
    assert!(store.lookup(&id).is_ok());
    // Rotation: a new first key, the old one still opens.
    store.keys().replace(&keys(&[2, 1]).keys);
    assert!(store.lookup(&id).is_ok(), "the old key still opens it");
    // Removal: the old key is gone.
    store.keys().replace(&keys(&[2]).keys);
    assert_eq!(
        store.lookup(&id).map(|_| ()),
        Err(Miss::Refused(TokenRefusal::Unopened))
    );
    assert!(!store.tracks(&id), "forgotten here");
    // A session sealed under the new key lives on.
    let fresh = record(&store, 2, 10);
    store.keys().replace(&keys(&[2, 3]).keys);
    assert!(store.lookup(&fresh).is_ok());
}

#[test]
fn an_untracked_token_opens_until_it_is_ended() {
    let store = Table::new(settings(), Gauge::default());
    let initialize = Bytes::from_static(br#"{"method":"initialize"}"#);
    let uri: Uri = "/mcp".parse().unwrap();
    let token = store
        .seal_untracked(
            HeaderValue::from_static("local"),
            initialize.clone(),
            &uri,
            None,
        )
        .expect("fits a token");
    let opened = store.open_untracked(token.as_bytes()).expect("opens");
    assert_eq!(opened.upstream_id, "local");
    assert_eq!(opened.initialize, initialize);
    assert_eq!(store.len(), 0, "not tracked");
    assert!(store.open_untracked(b"not a token").is_none());
    store.end(&token);
    assert!(store.open_untracked(token.as_bytes()).is_none(), "ended");
}
