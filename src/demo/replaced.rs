//! The demo's pod replacement, as a Kubernetes rollout replaces a pod of two replicas that name
//! each other as peers and seal session ids with one key (the pods' Secret):
//! - a call reaches the leaving pod after its MCP server stopped: held there (it never reached a
//!   server), and at that holdfast's shutdown handed to the other replica, which answers it;
//! - the next pod takes the old one's place, a new holdfast that has never seen the client's
//!   session in front of a new backend that never saw it either: with the key, the new holdfast
//!   opens the client's session id and re-establishes the session from it alone.

use ring::rand::{SecureRandom, SystemRandom};

use super::*;
use crate::config::{SessionKey, SessionKeys};

/// Calls before the replacement, and after it; one more is handed to the peer.
pub const CALLS: u64 = 3;

/// What the pod replacement saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// Calls that succeeded, before and after.
    pub ok: u64,
    /// Calls that failed.
    pub failed: u64,
    /// The call held at the leaving pod was answered by its peer.
    pub handed_off: bool,
    /// The new holdfast re-established the session it had never seen.
    pub reestablished: bool,
    /// Tool calls the peer's backend executed.
    pub peer_executed: u64,
    /// Times the backend was recreated in this phase.
    pub restarts: u64,
}

/// holdfast in front of the backend, listening on `listen`, sealing with `key`, handing what it
/// holds at its shutdown to `peers`.
fn pod_config(
    backend: SocketAddr,
    listen: &str,
    key: [u8; 32],
    peers: &[SocketAddr],
) -> std::io::Result<Config> {
    let mut raw = RawConfig {
        upstream: format!("http://{backend}"),
        listen: listen.into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    raw.routes.behind_router = Some(false);
    raw.peers.urls = peers.iter().map(|p| format!("http://{p}")).collect();
    let mut config = Config::from_raw(&raw, &|_| "demo".into()).map_err(std::io::Error::other)?;
    // What `sessions.key_file` would give, without a file.
    config.sessions.keys = SessionKeys {
        file: None,
        keys: vec![SessionKey(key)],
        deployment: String::new(),
    };
    Ok(config)
}

/// One `count` call, as JSON-RPC.
fn count(id: u64) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "count", "arguments": {}}})
    .to_string()
}

/// `count` `CALLS` times on `session`; how many succeeded.
async fn calls(client: &DemoClient, url: &str, session: &str, first_id: u64) -> u64 {
    let mut ok = 0;
    for id in first_id..first_id + CALLS {
        if let Posted::Ok(_) = post(client, url, Some(session), count(id)).await {
            ok += 1;
        }
    }
    ok
}

/// Waits (bounded) until the holdfast at `admin` holds a request.
async fn until_held(admin: SocketAddr) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if scrape(admin).await.held >= 1.0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(std::io::Error::other(
        "the leaving pod's holdfast never held the call",
    ))
}

/// Runs the phase with holdfasts of its own and a second backend (the peer pod's); the main
/// backend is up before and after.
pub(super) async fn run(
    backend: &Arc<Backend>,
    serving: &mut Option<tokio::task::JoinHandle<()>>,
    backend_addr: SocketAddr,
) -> std::io::Result<Replaced> {
    println!(
        "\npod replacement: two replicas with one key, naming each other as peers; one pod is \
         replaced, holdfast and its backend together, as in a rollout:"
    );
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| std::io::Error::other("no random source"))?;
    // The other replica: its own backend, which never sees the client's initialize.
    let (peer_backend, peer_backend_addr, peer_serving) = Backend::start().await?;
    let peer =
        crate::server::spawn(pod_config(peer_backend_addr, "127.0.0.1:0", key, &[])?).await?;
    let old =
        crate::server::spawn(pod_config(backend_addr, "127.0.0.1:0", key, &[peer.addr])?).await?;
    let addr = old.addr;
    let url = format!("http://{addr}/mcp");
    let client: DemoClient = HyperClient::builder(TokioExecutor::new()).build_http();
    let session = initialize(&client, &url)
        .await
        .ok_or_else(|| std::io::Error::other("no session through the pod's holdfast"))?;
    let before = calls(&client, &url, &session, 2000).await;
    println!("  a client opens a session through the pod's holdfast: {before} of {CALLS} calls ok");

    // The pod goes: its backend first (every container is signalled at once, and the server is
    // the quicker), while the balancer still sends here: the next call is held.
    backend
        .switch(Phase::Refused, serving, backend_addr)
        .await?;
    let held = {
        let (client, url, session) = (client.clone(), url.clone(), session.clone());
        tokio::spawn(async move { post(&client, &url, Some(&session), count(2500)).await })
    };
    until_held(old.admin).await?;
    // Then its holdfast: the call it holds never reached a server, and goes to the peer.
    old.shutdown().await?;
    let handed_off = matches!(held.await, Ok(Posted::Ok(_)));
    let peer_executed = peer_backend.calls.load(Ordering::Relaxed);
    println!(
        "  a call reaches the leaving pod after its backend stopped: held, and at holdfast's \
         shutdown handed to the other replica: {}",
        if handed_off {
            "answered there"
        } else {
            "FAILED"
        }
    );
    peer.shutdown().await?;
    peer_serving.abort();

    // The next pod: a new backend (no sessions) and a new holdfast on the same address, with
    // the same key.
    let restarts = u64::from(backend.switch(Phase::Up, serving, backend_addr).await?);
    let new = crate::server::spawn(pod_config(backend_addr, &addr.to_string(), key, &[])?).await?;
    println!(
        "  the next pod takes its place: a new backend (its sessions gone) and a new holdfast \
         that has never seen the session, with the same key"
    );
    let after = calls(&client, &url, &session, 3000).await;
    let reestablished = scrape(new.admin).await.reestablished_elsewhere >= 1.0;
    new.shutdown().await?;
    println!(
        "  the same client, same session id: {after} of {CALLS} calls ok{}",
        if reestablished {
            "; the new holdfast re-established the session from the client's id alone"
        } else {
            ""
        }
    );
    let ok = before + after + u64::from(handed_off);
    Ok(Replaced {
        ok,
        failed: 2 * CALLS + 1 - ok,
        handed_off,
        reestablished,
        peer_executed,
        restarts,
    })
}
