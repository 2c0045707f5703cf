//! Sessions that outlive holdfast: its own restart, a pod's replacement in a rollout, and
//! replicas behind a balancer without session affinity.
//!
//! Each "pod" ([`Pod`]) is the real holdfast binary in front of the TypeScript SDK's stateful
//! server (sessions in memory); every holdfast reads the same `sessions.key_file`, as the
//! Kubernetes recipe mounts one Secret into every replica. The client is the official TypeScript
//! SDK client, which never starts a new session by itself. The servers of all pods append to one
//! ledger, and `count` returns its length: a call returning `n` is the `n`-th execution
//! anywhere, so "every call returned the next number" is "every call ran exactly once".

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::nginx::Nginx;
use crate::support::pod::Pod;

/// Two keys as `openssl rand -hex 32` prints them.
pub(crate) const KEY_A: &str = "5f0e9c1d7b3a4e2f8c6d0b1a9e7f3c5d2b4a6e8f0c1d3b5a7e9f2c4d6b8a0e1f";
const KEY_B: &str = "a3c5e7f9b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5";

/// `holdfast_session_reestablished_total{cause}`.
fn reestablished(cause: &str) -> String {
    format!("holdfast_session_reestablished_total{{cause=\"{cause}\"}}")
}

/// A shared ledger and levels file, and a key file with `keys` (one per line).
pub(crate) struct Files {
    dir: TempDir,
    keys: PathBuf,
}

impl Files {
    pub(crate) fn new(keys: &[&str]) -> Files {
        let dir = TempDir::new("session-replicas");
        let keys = dir.write("session-keys", &format!("{}\n", keys.join("\n")));
        Files { dir, keys }
    }

    async fn pod(&self, shared_key: bool) -> Pod {
        let keys = shared_key.then_some(self.keys.as_path());
        self.pod_with(keys, Vec::new()).await
    }

    /// A pod listening on `port`, sealing with the shared key, with more environment.
    pub(crate) async fn pod_on(&self, port: u16, env: Vec<(String, String)>) -> Pod {
        let (ledger, levels) = (
            self.dir.path().join("ledger"),
            self.dir.path().join("levels"),
        );
        Pod::start_on(port, &ledger, &levels, Some(&self.keys), env).await
    }

    /// A pod sealing with `keys`, with more environment for holdfast.
    pub(crate) async fn pod_with(&self, keys: Option<&Path>, env: Vec<(String, String)>) -> Pod {
        let (ledger, levels) = (
            self.dir.path().join("ledger"),
            self.dir.path().join("levels"),
        );
        Pod::start_with(&ledger, &levels, keys, env).await
    }

    /// The key file every pod of [`Files::pod`] shares.
    pub(crate) fn keys(&self) -> &Path {
        &self.keys
    }

    /// Every `logging/setLevel` any pod's server received, in order.
    pub(crate) fn levels(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("levels"))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    pub(crate) fn ledger_lines(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("ledger"))
            .map_or(0, |text| text.lines().count())
    }
}

/// An nginx site balancing round-robin over `pods`, no affinity, a new upstream connection per
/// request; a pod that refuses is skipped (`proxy_next_upstream error`, nginx's default). No
/// keep-alive towards the client either: a reload closes the old worker's idle client
/// connections, and a client sending on one as it closes fails in a way that is nginx's, not
/// what these tests look at.
pub(crate) fn round_robin(pods: &[SocketAddr]) -> impl Fn(SocketAddr) -> String {
    let servers: String = pods.iter().map(|p| format!("server {p}; ")).collect();
    move |listen| {
        format!(
            "upstream pods {{ {servers}}}\n\
             server {{\n\
             \x20   listen {listen};\n\
             \x20   keepalive_timeout 0;\n\
             \x20   location / {{\n\
             \x20       proxy_pass http://pods;\n\
             \x20       proxy_http_version 1.1;\n\
             \x20       proxy_set_header Connection \"\";\n\
             \x20       proxy_buffering off;\n\
             \x20       proxy_request_buffering off;\n\
             \x20       proxy_read_timeout 1h;\n\
             \x20       gzip off;\n\
             \x20   }}\n\
             }}\n"
        )
    }
}

/// The session id the client was given, which must be holdfast's token.
pub(crate) fn token_of(client: &PeerClient) -> String {
    let id = client
        .session_id()
        .expect("a stateful server gives a session id");
    assert!(
        id.starts_with("hf1."),
        "the client holds holdfast's token: {id}"
    );
    id.to_owned()
}

/// The sum of `series` over `pods`.
async fn total(pods: &[&Pod], series: &str) -> f64 {
    let mut sum = 0.0;
    for pod in pods {
        sum += pod.metric(series).await;
    }
    sum
}

#[tokio::test]
async fn round_robin_over_two_pods_thirty_calls_each_run_once() {
    let files = Files::new(&[KEY_A]);
    let (a, b) = (files.pod(true).await, files.pod(true).await);
    let nginx = Nginx::start(round_robin(&[a.addr(), b.addr()])).await;
    let mut client = PeerClient::start(&nginx.url("/mcp")).await;
    let session = token_of(&client);

    client.count_from(&session, 0, 30).await;
    assert_eq!(files.ledger_lines(), 30, "each call ran exactly once");
    // The pod that did not see the initialize opened the session from its token and
    // re-established it with its own server; the other never needed to.
    assert_eq!(
        total(&[&a, &b], &reestablished("unknown_to_this_replica")).await,
        1.0,
        "nginx:\n{}",
        nginx.log()
    );
    assert_eq!(
        total(&[&a, &b], &reestablished("backend_restart")).await,
        0.0
    );
    client.close().await.expect("DELETE the session");
}

/// The control: without a shared key, the pod that did not see the initialize cannot open the
/// token, the client's very next request gets its server's 404, and the TypeScript SDK client
/// fails to connect (as it does with no holdfast at all). This proves the test above can fail.
#[tokio::test]
async fn without_a_shared_key_the_client_cannot_even_connect() {
    let files = Files::new(&[KEY_A]);
    let (a, b) = (files.pod(false).await, files.pod(false).await);
    let nginx = Nginx::start(round_robin(&[a.addr(), b.addr()])).await;
    let failed = PeerClient::try_start(&nginx.url("/mcp"))
        .await
        .err()
        .expect("the client cannot connect");
    assert!(
        failed.contains("404") || failed.contains("Session not found"),
        "{failed}"
    );
    assert_eq!(
        total(
            &[&a, &b],
            "holdfast_session_tokens_refused_total{reason=\"unopened\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn each_pod_replaced_in_turn_during_the_calls_loses_no_call() {
    const CALLS: u64 = 30;
    let files = Files::new(&[KEY_A]);
    let (mut a, mut b) = (files.pod(true).await, files.pod(true).await);
    let nginx = Nginx::start_reloadable(round_robin(&[a.addr(), b.addr()])).await;
    let mut client = PeerClient::start(&nginx.url("/mcp")).await;
    let session = token_of(&client);

    // The calls go on, one after another, while the pods are replaced: the test's two halves
    // run concurrently, the replacements starting after the 5th and the 15th call.
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
    let calls = async {
        for n in 1..=CALLS {
            let value = client.count().await;
            assert_eq!(
                value,
                Ok(n),
                "call {n}; client trace:\n{}\nnginx:\n{}",
                client.trace(),
                nginx.log()
            );
            assert_eq!(client.session_id(), Some(session.as_str()));
            progress_tx.send_replace(n);
        }
    };
    // As in a rollout: the pod leaves the balancer (a Service's endpoints; here nginx reloads
    // without it), then both its processes get SIGTERM, then the new pod joins. (A balancer that
    // still sends to a pod whose listener closes can meet a reset on a connection the kernel
    // completed a moment before: Kubernetes' preStop sleep is there for that.)
    let (a_addr, b_addr) = (a.addr(), b.addr());
    let replacements = async {
        progress.wait_for(|n| *n >= 5).await.unwrap();
        nginx.reload(round_robin(&[b_addr])).await;
        a.replace().await;
        nginx.reload(round_robin(&[a_addr, b_addr])).await;
        progress.wait_for(|n| *n >= 15).await.unwrap();
        nginx.reload(round_robin(&[a_addr])).await;
        b.replace().await;
        nginx.reload(round_robin(&[a_addr, b_addr])).await;
    };
    tokio::join!(calls, replacements);

    assert_eq!(
        files.ledger_lines(),
        CALLS as usize,
        "each call ran exactly once; nginx:\n{}",
        nginx.log()
    );
    if let Err(e) = client.close().await {
        panic!(
            "DELETE the session: {e}\nnginx:\n{}\npod a:\n{}\npod b:\n{}",
            nginx.log(),
            a.log(),
            b.log()
        );
    }
}

/// Five calls, a restart of holdfast (and of its server with `with_server`), five more calls on
/// the same session; how many times the new holdfast re-established the session it opened from
/// the client's token.
async fn restart_mid_session(with_server: bool) -> f64 {
    let files = Files::new(&[KEY_A]);
    let mut pod = files.pod(true).await;
    let mut client = PeerClient::start(&pod.url("/mcp")).await;
    let session = token_of(&client);

    client.count_from(&session, 0, 5).await;
    if with_server {
        pod.replace().await;
    } else {
        pod.stop_holdfast().await;
        pod.start_holdfast().await;
    }
    client.count_from(&session, 5, 5).await;
    assert_eq!(files.ledger_lines(), 10);
    assert_eq!(pod.metric(&reestablished("backend_restart")).await, 0.0);
    let opened = pod.metric(&reestablished("unknown_to_this_replica")).await;
    client.close().await.expect("DELETE the session");
    opened
}

#[tokio::test]
async fn holdfast_restarted_alone_mid_session_loses_no_call() {
    // The server still knows the session: the new holdfast opened the token and sent the
    // server's own id, nothing re-established.
    assert_eq!(restart_mid_session(false).await, 0.0);
}

#[tokio::test]
async fn holdfast_and_its_server_restarted_together_lose_no_call() {
    assert_eq!(restart_mid_session(true).await, 1.0);
}

/// The control for the two above: with no key file, holdfast's key dies with it, the new one
/// cannot open the token, and the client's calls fail: the server is asked about a session id it
/// never gave.
#[tokio::test]
async fn without_a_key_file_a_restart_of_holdfast_loses_the_session() {
    let files = Files::new(&[KEY_A]);
    let mut pod = files.pod(false).await;
    let mut client = PeerClient::start(&pod.url("/mcp")).await;
    let session = token_of(&client);
    client.count_from(&session, 0, 1).await;

    pod.stop_holdfast().await;
    pod.start_holdfast().await;
    let error = client.count().await.expect_err("the session is lost");
    assert!(error.contains("Session not found"), "{error}");
    assert_eq!(files.ledger_lines(), 1, "the failed call did not run");
}

#[tokio::test]
async fn after_a_key_rotation_old_sessions_keep_working_until_their_key_is_removed() {
    let files = Files::new(&[KEY_A]);
    let mut pod = files.pod(true).await;
    let mut old = PeerClient::start(&pod.url("/mcp")).await;
    let old_session = token_of(&old);
    old.count_from(&old_session, 0, 1).await;

    // A new first line: new sessions are sealed with B, A still opens. The running holdfast
    // picks the file up by itself.
    write(&files.keys, &[KEY_B, KEY_A]);
    pod.wait_for_line("session keys reloaded").await;
    let mut new = PeerClient::start(&pod.url("/mcp")).await;
    let new_session = token_of(&new);
    new.count_from(&new_session, 1, 1).await;

    // Both sessions survive holdfast's restart with the rotated file.
    pod.replace().await;
    old.count_from(&old_session, 2, 1).await;
    new.count_from(&new_session, 3, 1).await;

    // A removed: its sessions no longer open (their ids pass as opaque ones, which the new
    // server does not know); B's still do.
    write(&files.keys, &[KEY_B]);
    pod.wait_for_line("session keys reloaded").await;
    pod.replace().await;
    new.count_from(&new_session, 4, 1).await;
    let error = old.count().await.expect_err("sealed with a removed key");
    assert!(error.contains("Session not found"), "{error}");
    // The call, and the old client's GET stream if it reconnected meanwhile.
    let unopened = pod
        .metric("holdfast_session_tokens_refused_total{reason=\"unopened\"}")
        .await;
    assert!(unopened >= 1.0, "{unopened}");
    assert_eq!(files.ledger_lines(), 5);
}

/// A key file others may write is refused by the running holdfast's poller too, as at start and
/// at a reload: whoever writes it would choose the key that seals every session. Once its mode is
/// fixed, the same file loads.
#[tokio::test]
async fn a_changed_key_file_others_may_write_is_not_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let files = Files::new(&[KEY_A]);
    let mut pod = files.pod(true).await;
    let mode = |m: u32| std::fs::set_permissions(&files.keys, std::fs::Permissions::from_mode(m));
    // Writable by all first, so no read of the new text can find the file safe.
    mode(0o666).expect("chmod");
    write(&files.keys, &[KEY_B, KEY_A]);
    pod.wait_for_line("the changed sessions.key_file is not loaded")
        .await;
    mode(0o600).expect("chmod");
    pod.wait_for_line("session keys reloaded").await;
}

fn write(path: &Path, keys: &[&str]) {
    std::fs::write(path, format!("{}\n", keys.join("\n"))).expect("write the key file");
}
