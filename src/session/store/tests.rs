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
