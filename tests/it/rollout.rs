//! Rollouts as a cluster does them, not an idealised one, with the official TypeScript SDK client
//! calling every 50 ms through nginx round-robin (no affinity), each pod a holdfast in front of
//! its own stateful server, all sealing with one key and naming each other as `[peers]`:
//!
//! - The sidecar recipe's order: a pod turns Terminating, the balancer learns it 0.5-2 s later
//!   (nginx reloaded then, as an endpoints update reaches kube-proxy or an ingress controller),
//!   meanwhile the MCP server keeps serving through its preStop sleep, then stops, then its
//!   holdfast stops. Two and three replicas rolled one at a time (maxSurge 1, maxUnavailable 0),
//!   and a scale-down from three to two: no call fails, each runs once.
//! - The harsh case: a balancer that never learns (nginx never reloaded; it skips a pod only when
//!   its connect is refused), and a pod whose server has died while its holdfast still accepts,
//!   as when Kubernetes signals every container of a pod without a preStop hook at once. A call
//!   that reaches that pod is held there, and at its holdfast's drain handed to the other pod:
//!   no call is lost. The control without peers loses that call.
//!
//! Test time is scaled down from the recipe's (a preStop sleep of 2.5 s for its 10 s, an accept
//! grace of 0.5 s for its 2 s); the balancer's delays are real-world ones, and every one of them
//! is shorter than the preStop sleep, as in the recipe.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::session_replicas::{round_robin, token_of, Files, KEY_A};
use crate::support::clients::PeerClient;
use crate::support::hold::HELD;
use crate::support::nginx::Nginx;
use crate::support::pod::Pod;

/// The MCP container's preStop sleep, scaled from the recipe's 10 s.
const PRE_STOP: Duration = Duration::from_millis(2500);
/// How long the balancer takes to stop sending to a Terminating pod, one per pod leaving, in
/// turn: kube-proxy, ingress controllers and meshes take 0.5-2 s.
const BALANCER_DELAYS: [Duration; 3] = [
    Duration::from_millis(500),
    Duration::from_millis(2000),
    Duration::from_millis(1200),
];

/// Replicas and the balancer in front of them, every holdfast naming every address a pod of
/// this cluster will have as its peers (the unused ones refuse, and are skipped).
struct Cluster {
    files: Files,
    env: Vec<(String, String)>,
    /// Addresses for the rollout's next pods.
    spare: Vec<u16>,
    pods: Vec<Pod>,
    nginx: Nginx,
}

impl Cluster {
    async fn start(replicas: usize, surge: usize) -> Cluster {
        let files = Files::new(&[KEY_A]);
        let ports: Vec<u16> = (0..replicas + surge)
            .map(|_| crate::support::ports::quiet())
            .collect();
        let peers: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect();
        let env = vec![
            ("HOLDFAST_PEERS__URLS".to_owned(), peers.join(",")),
            (
                "HOLDFAST_SHUTDOWN__ACCEPT_GRACE_SECS".to_owned(),
                "0.5".to_owned(),
            ),
        ];
        let mut pods = Vec::new();
        for &port in &ports[..replicas] {
            pods.push(files.pod_on(port, env.clone()).await);
        }
        let nginx = Nginx::start_reloadable(round_robin(&addrs(&pods))).await;
        Cluster {
            files,
            env,
            spare: ports[replicas..].to_vec(),
            pods,
            nginx,
        }
    }

    /// Pod `i` turns Terminating: it leaves in the recipe's order while the balancer learns it
    /// `delay` later.
    async fn terminate(&mut self, i: usize, delay: Duration) {
        let mut leaving = self.pods.remove(i);
        self.spare.push(leaving.addr().port());
        let staying = round_robin(&addrs(&self.pods));
        let balancer = async {
            tokio::time::sleep(delay).await;
            self.nginx.reload(staying).await;
        };
        tokio::join!(leaving.leave_in_the_recipes_order(PRE_STOP), balancer);
    }

    /// A Deployment's rolling update of every pod, one at a time: the next pod is started and
    /// joins the balancer once ready, then an old one is terminated.
    async fn roll(&mut self) {
        for turn in 0..self.pods.len() {
            let port = self.spare.remove(0);
            self.pods
                .push(self.files.pod_on(port, self.env.clone()).await);
            self.nginx.reload(round_robin(&addrs(&self.pods))).await;
            // The oldest pod goes; its address is free for the pod after next.
            self.terminate(0, BALANCER_DELAYS[turn % BALANCER_DELAYS.len()])
                .await;
        }
    }
}

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

fn addrs(pods: &[Pod]) -> Vec<std::net::SocketAddr> {
    pods.iter().map(Pod::addr).collect()
}

/// The TypeScript SDK client calling `count` every 50 ms until `stop`: every result, in order,
/// their number kept in `done` as they come.
async fn calling(
    mut client: PeerClient,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> (PeerClient, Vec<Result<u64, String>>) {
    let mut results = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        results.push(client.count().await);
        done.store(results.len(), Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (client, results)
}

/// Runs `change` on a cluster of `replicas` (and `surge` addresses more) while the client calls,
/// and checks that every call was answered with the next number (each ran exactly once, none
/// failed) and the session held.
async fn calls_through(replicas: usize, surge: usize, change: impl AsyncFnOnce(&mut Cluster)) {
    let mut cluster = Cluster::start(replicas, surge).await;
    let client = PeerClient::start(&cluster.nginx.url("/mcp")).await;
    let session = token_of(&client);
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let calls = tokio::spawn(calling(client, stop.clone(), done.clone()));
    let before = done.load(Ordering::Relaxed);
    change(&mut cluster).await;
    let during = done.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let (client, results) = calls.await.expect("the client's calls");

    let expected: Vec<Result<u64, String>> = (1..=results.len() as u64).map(Ok).collect();
    assert_eq!(
        results,
        expected,
        "every call answered, in order; client trace:\n{}\nnginx:\n{}",
        client.trace(),
        cluster.nginx.log()
    );
    // The calls went on while the pods changed, not only before and after.
    assert!(during >= 5, "{during} calls during the change");
    assert_eq!(
        cluster.files.ledger_lines(),
        results.len(),
        "each call ran exactly once"
    );
    assert_eq!(client.session_id(), Some(session.as_str()));
    let _ = client.close().await;
}

#[tokio::test]
async fn two_replicas_rolled_in_the_recipes_order_under_a_slow_balancer_lose_no_call() {
    calls_through(2, 1, async |cluster: &mut Cluster| cluster.roll().await).await;
}

#[tokio::test]
async fn three_replicas_rolled_in_the_recipes_order_under_a_slow_balancer_lose_no_call() {
    calls_through(3, 1, async |cluster: &mut Cluster| cluster.roll().await).await;
}

#[tokio::test]
async fn a_scale_down_from_three_to_two_under_a_slow_balancer_loses_no_call() {
    calls_through(3, 0, async |cluster: &mut Cluster| {
        // A scale-down picks a pod to remove; any of them, here the middle one.
        cluster.terminate(1, BALANCER_DELAYS[1]).await;
    })
    .await;
}
