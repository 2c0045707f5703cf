//! The shared session store (`sessions.store`, a real `redis-server`): what a session set after
//! its initialize reaches every replica's re-establishment, and a session ended at one replica
//! is not re-established at another.
//!
//! Two pods (the real holdfast in front of the TypeScript SDK's stateful server) behind nginx
//! round-robin, as in `session_replicas.rs`; the servers of both pods append every
//! `logging/setLevel` they receive to one file.

use crate::session_replicas::{round_robin, token_of, Files, KEY_A};
use crate::support::clients::PeerClient;
use crate::support::mcp::raw_http;
use crate::support::nginx::Nginx;
use crate::support::redis::Redis;

/// The client sets a log level (at whichever pod), makes calls at both, both servers restart,
/// and more calls make each pod re-establish the session with its new server. Returns every
/// `setLevel` the servers received.
async fn levels_through_restarts(store: Option<&Redis>) -> Vec<String> {
    let files = Files::new(&[KEY_A]);
    let env: Vec<(String, String)> = store
        .map(|r| vec![("HOLDFAST_SESSIONS__STORE".to_owned(), r.url())])
        .unwrap_or_default();
    let mut a = files.pod_with(Some(files.keys()), env.clone()).await;
    let mut b = files.pod_with(Some(files.keys()), env).await;
    let nginx = Nginx::start(round_robin(&[a.addr(), b.addr()])).await;
    let mut client = PeerClient::start(&nginx.url("/mcp")).await;
    let session = token_of(&client);

    client.set_level("debug").await.expect("setLevel");
    client.count_from(&session, 0, 4).await;
    a.server.restart().await;
    b.server.restart().await;
    client.count_from(&session, 4, 4).await;
    assert_eq!(files.ledger_lines(), 8);
    let errors = a.metric("holdfast_session_store_errors_total").await
        + b.metric("holdfast_session_store_errors_total").await;
    assert_eq!(errors, 0.0);
    client.close().await.expect("DELETE the session");
    files.levels()
}

#[tokio::test]
async fn with_the_store_every_replica_sets_the_level_again() {
    let redis = Redis::start().await;
    let levels = levels_through_restarts(Some(&redis)).await;
    // The client's own, and one per pod's re-establishment after its server restarted.
    assert_eq!(levels, ["setLevel debug"; 3]);
}

/// The control: each pod re-applies only what it saw itself, so the pod that did not see the
/// setLevel re-establishes the session without it.
#[tokio::test]
async fn without_the_store_only_the_replica_that_saw_the_level_sets_it_again() {
    let levels = levels_through_restarts(None).await;
    assert_eq!(levels, ["setLevel debug"; 2]);
}

#[tokio::test]
async fn a_session_ended_at_one_replica_is_not_re_established_at_another() {
    let redis = Redis::start().await;
    let files = Files::new(&[KEY_A]);
    let env = vec![("HOLDFAST_SESSIONS__STORE".to_owned(), redis.url())];
    let mut a = files.pod_with(Some(files.keys()), env.clone()).await;
    let mut b = files.pod_with(Some(files.keys()), env).await;
    // The client talks to pod a only; pod b never saw the session.
    let client = PeerClient::start(&a.url("/mcp")).await;
    let session = token_of(&client);
    client.close().await.expect("DELETE the session");

    // Both servers restart; a request on the ended session at either pod gets the server's 404
    // and re-establishes nothing (b learns the end from the store).
    a.server.restart().await;
    b.server.restart().await;
    let refused = "holdfast_session_tokens_refused_total{reason=\"ended\"}";
    for pod in [&a, &b] {
        // Counted for this request alone: the client's own GET stream may have reconnected
        // once at pod a before its process exited, on the ended session, and been refused too.
        let before = pod.metric(refused).await;
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{}}}"#;
        let request = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\naccept: application/json, text/event-stream\r\n\
             content-type: application/json\r\nmcp-session-id: {session}\r\n\
             mcp-protocol-version: 2025-06-18\r\ncontent-length: {}\r\n\r\n{call}",
            pod.addr(),
            call.len()
        );
        let answer = raw_http(pod.addr(), request.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(answer.status_line, "HTTP/1.1 404 Not Found", "{answer:?}");
        assert_eq!(pod.metric(refused).await - before, 1.0);
    }
    assert_eq!(files.ledger_lines(), 0, "nothing ran");
    assert_eq!(
        b.metric("holdfast_session_reestablished_total{cause=\"unknown_to_this_replica\"}")
            .await,
        0.0
    );
}

/// A DELETE is durable where the store is asked for: while the store is down the client hears a
/// 503 it can retry (never a 200 the other replicas would not know of), and the session is not
/// ended here either; the retry, once the store is back, ends it for good, at every replica.
#[tokio::test]
async fn a_delete_while_the_store_is_down_is_a_503_and_its_retry_ends_the_session() {
    use crate::session::{count_call, open_session, send};
    use crate::support::forgetful::ForgetfulServer;
    use crate::support::proxy::{raw_config, Holdfast};

    let redis = Redis::start().await;
    let port = redis.addr.port();
    let dir = crate::support::files::TempDir::new("store-delete");
    let keys = dir.write("keys", &format!("{KEY_A}\n"));
    let server = ForgetfulServer::start().await;
    let mut raw = raw_config(&server.upstream.url());
    raw.sessions.key_file = Some(keys);
    raw.sessions.store = Some(redis.url());
    let holdfast = Holdfast::start_with(raw.clone()).await;
    let id = open_session(&holdfast).await;

    drop(redis);
    let refused = send(&holdfast, "DELETE", Some(&id), "").await;
    assert_eq!(refused.status_line, "HTTP/1.1 503 Service Unavailable");
    assert_eq!(refused.header("holdfast-reason"), Some("session_store"));
    assert!(refused.header("retry-after").is_some());

    // The store is back; the server ended the session on the first DELETE. The retry meets the
    // server's 404, holdfast brings the session back and ends it, recorded this time.
    let _redis = Redis::start_on(port).await;
    server.forget();
    let ended = send(&holdfast, "DELETE", Some(&id), "").await;
    assert_eq!(ended.status_line, "HTTP/1.1 200 OK", "{ended:?}");

    // Another replica, with the same key and store, never saw the session: it knows it ended.
    let other = Holdfast::start_with(raw).await;
    server.forget();
    let opened = server.opened();
    let call = send(&other, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(call.status_line, "HTTP/1.1 404 Not Found", "{call:?}");
    assert_eq!(server.opened(), opened, "nothing re-established");
}

/// Whoever can write to the store cannot make holdfast replay a subscription with a client's
/// credentials, nor end a session: values no session key signed are ignored.
#[tokio::test]
async fn what_no_session_key_signed_in_the_store_is_ignored() {
    use crate::session::{count_call, open_session, result_text, send};
    use crate::support::forgetful::ForgetfulServer;
    use crate::support::proxy::{raw_config, Holdfast};

    let redis = Redis::start().await;
    let dir = crate::support::files::TempDir::new("store-forged");
    let keys = dir.write("keys", &format!("{KEY_A}\n"));
    let server = ForgetfulServer::start().await;
    let mut raw = raw_config(&server.upstream.url());
    raw.sessions.key_file = Some(keys);
    raw.sessions.store = Some(redis.url());
    let holdfast = Holdfast::start_with(raw).await;
    let id = open_session(&holdfast).await;
    let nonce: String = holdfast::session::token::nonce(id.as_bytes())
        .expect("a token")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Forged: a subscription, and the session's end.
    redis
        .set(
            &format!("holdfast:session:{nonce}"),
            r#"{"level":null,"subscriptions":["file:///etc/shadow"]}"#,
        )
        .await;
    redis.set(&format!("holdfast:ended:{nonce}"), "1").await;

    server.forget();
    let call = send(&holdfast, "POST", Some(&id), &count_call(1)).await;
    assert_eq!(
        result_text(&call),
        "1",
        "re-established: the forged end ignored"
    );
    let subscribed = server
        .upstream
        .seen()
        .iter()
        .any(|s| String::from_utf8_lossy(&s.body).contains("resources/subscribe"));
    assert!(!subscribed, "the forged subscription was not sent");
}

/// A store over TLS (`rediss://`, as managed Redis services require), trusted by `client.ca`:
/// what one replica recorded reaches the other through it.
#[tokio::test]
async fn the_store_works_over_tls_trusted_by_the_clients_ca() {
    use crate::session::{count_call, open_session, result_text, send};
    use crate::support::forgetful::ForgetfulServer;
    use crate::support::proxy::{raw_config, Holdfast};
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    // A CA, and a certificate for localhost it issued.
    let dir = crate::support::files::TempDir::new("store-tls");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    let ca_file = dir.write("ca.pem", &ca.pem());
    let cert = dir.write("redis.pem", &leaf.pem());
    let key = dir.write("redis.key", &leaf_key.serialize_pem());
    let redis = Redis::start_tls(&cert, &key).await;

    let keys = dir.write("keys", &format!("{KEY_A}\n"));
    let server = ForgetfulServer::start().await;
    let mut raw = raw_config(&server.upstream.url());
    raw.sessions.key_file = Some(keys);
    raw.sessions.store = Some(format!("rediss://localhost:{}/0", redis.addr.port()));
    raw.client.ca = Some(ca_file.to_str().unwrap().to_owned());
    let a = Holdfast::start_with(raw.clone()).await;
    let b = Holdfast::start_with(raw).await;

    let id = open_session(&a).await;
    let level =
        r#"{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}"#;
    let set = send(&a, "POST", Some(&id), level).await;
    assert_eq!(set.status_line, "HTTP/1.1 200 OK");
    // In the store once its answer is: b's re-establishment reads it there.
    server.forget();
    let call = send(&b, "POST", Some(&id), &count_call(3)).await;
    assert_eq!(result_text(&call), "1");
    let levels = server
        .upstream
        .seen()
        .iter()
        .filter(|s| String::from_utf8_lossy(&s.body).contains("logging/setLevel"))
        .count();
    assert_eq!(levels, 2, "the client's, and b's from the store over TLS");
    assert_eq!(b.metric("holdfast_session_store_errors_total").await, 0.0);
}
