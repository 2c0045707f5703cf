//! Rollouts as a cluster does them, not an idealised one: a balancer that never learns that a pod
//! is going (nginx round-robin, never reloaded; it skips a pod only when its connect is refused),
//! and a pod whose server has died while its holdfast still accepts, as when Kubernetes signals
//! every container of a pod without a preStop hook at once. A call that reaches that pod is held
//! there, and at its holdfast's drain handed to the other pod (`[peers]`, the same list for both):
//! the official TypeScript SDK client loses no call, and each runs once. The control without
//! peers loses that call.

use crate::session_replicas::{round_robin, token_of, Files, KEY_A};
use crate::support::clients::PeerClient;
use crate::support::hold::HELD;
use crate::support::nginx::Nginx;

#[tokio::test]
async fn with_peers_pods_replaced_under_a_balancer_that_never_learns_lose_no_call() {
    const CALLS: u64 = 30;
    let files = Files::new(&[KEY_A]);
    let (port_a, port_b) = (
        crate::support::ports::quiet(),
        crate::support::ports::quiet(),
    );
    let peers = format!("http://127.0.0.1:{port_a},http://127.0.0.1:{port_b}");
    let env = vec![("HOLDFAST_PEERS__URLS".to_owned(), peers)];
    let mut a = files.pod_on(port_a, env.clone()).await;
    let b = files.pod_on(port_b, env).await;
    let nginx = Nginx::start(round_robin(&[a.addr(), b.addr()])).await;
    let mut client = PeerClient::start(&nginx.url("/mcp")).await;
    let session = token_of(&client);

    for n in 1..=8 {
        assert_eq!(client.count().await, Ok(n), "call {n}");
    }
    // Pod a is going: its server has already died (a pod's containers get their signals at
    // once, and the server is the quicker), its holdfast not yet. nginx goes on sending to a,
    // whose holdfast still accepts: the next call it gets is held there (never sent anywhere).
    a.server.stop().await;
    let mut n = 9;
    loop {
        client.send(serde_json::json!({ "op": "call", "tool": "count" }));
        let held_at_a = async {
            loop {
                if a.metric(HELD).await == 1.0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            result = client.result() => {
                // Answered by b: the next call goes to a, round-robin.
                assert_eq!(result, Ok(n.to_string()), "call {n}");
                n += 1;
                assert!(n < 13, "no call reached pod a");
            }
            () = held_at_a => break,
        }
    }
    // Now a's holdfast gets its SIGTERM: the call it holds never reached a server, and goes to b.
    a.stop_holdfast().await;
    let handed = client.result().await;
    assert_eq!(
        handed,
        Ok(n.to_string()),
        "the call held at the terminating pod; client trace:\n{}\nnginx:\n{}",
        client.trace(),
        nginx.log()
    );
    assert_eq!(client.session_id(), Some(session.as_str()));
    // The rollout's next pod takes a's place; the calls go on.
    a.server.start_again().await;
    a.start_holdfast().await;
    for m in n + 1..=CALLS {
        assert_eq!(client.count().await, Ok(m), "call {m}");
    }

    assert_eq!(
        files.ledger_lines(),
        CALLS as usize,
        "each call ran exactly once; nginx:\n{}",
        nginx.log()
    );
    let _ = client.close().await;
}
