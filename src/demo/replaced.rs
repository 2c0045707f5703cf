//! The demo's pod replacement: holdfast and its backend replaced together, as a Kubernetes
//! rollout replaces a pod. The new holdfast has never seen the client's session and its backend
//! has forgotten it; with the old holdfast's key (the pod's Secret) the new one opens the
//! client's session id and re-establishes the session from it alone.

use ring::rand::{SecureRandom, SystemRandom};

use super::*;
use crate::config::{SessionKey, SessionKeys};

/// Calls before the replacement, and after it.
pub const CALLS: u64 = 3;

/// What the pod replacement saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// Calls that succeeded, before and after.
    pub ok: u64,
    /// Calls that failed.
    pub failed: u64,
    /// The new holdfast re-established the session it had never seen.
    pub reestablished: bool,
    /// Times the backend was recreated in this phase.
    pub restarts: u64,
}

/// holdfast in front of the backend, listening on `listen`, sealing with `key`.
fn pod_config(backend: SocketAddr, listen: &str, key: [u8; 32]) -> std::io::Result<Config> {
    let mut raw = RawConfig {
        upstream: format!("http://{backend}"),
        listen: listen.into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    raw.routes.behind_router = Some(false);
    let mut config = Config::from_raw(&raw, &|_| "demo".into()).map_err(std::io::Error::other)?;
    // What `sessions.key_file` would give, without a file.
    config.sessions.keys = SessionKeys {
        file: None,
        keys: vec![SessionKey(key)],
        deployment: String::new(),
    };
    Ok(config)
}

/// `count` `CALLS` times on `session`; how many succeeded.
async fn calls(client: &DemoClient, url: &str, session: &str, first_id: u64) -> u64 {
    let mut ok = 0;
    for id in first_id..first_id + CALLS {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "count", "arguments": {}}});
        if let Posted::Ok(_) = post(client, url, Some(session), call.to_string()).await {
            ok += 1;
        }
    }
    ok
}

/// Runs the phase with a holdfast of its own; the backend is up before and after.
pub(super) async fn run(
    backend: &Arc<Backend>,
    serving: &mut Option<tokio::task::JoinHandle<()>>,
    backend_addr: SocketAddr,
) -> std::io::Result<Replaced> {
    println!("\npod replacement: holdfast and its backend replaced together, as in a rollout:");
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| std::io::Error::other("no random source"))?;
    let old = crate::server::spawn(pod_config(backend_addr, "127.0.0.1:0", key)?).await?;
    let addr = old.addr;
    let url = format!("http://{addr}/mcp");
    let client: DemoClient = HyperClient::builder(TokioExecutor::new()).build_http();
    let session = initialize(&client, &url)
        .await
        .ok_or_else(|| std::io::Error::other("no session through the pod's holdfast"))?;
    let before = calls(&client, &url, &session, 2000).await;
    println!("  a client opens a session through the pod's holdfast: {before} of {CALLS} calls ok");

    // The pod goes: holdfast drains and exits, the backend with it; the next pod starts with a
    // new backend (no sessions) and a new holdfast on the same address, with the same key.
    old.shutdown().await?;
    backend
        .switch(Phase::Refused, serving, backend_addr)
        .await?;
    let restarts = u64::from(backend.switch(Phase::Up, serving, backend_addr).await?);
    let new = crate::server::spawn(pod_config(backend_addr, &addr.to_string(), key)?).await?;
    println!(
        "  the pod is replaced: a new backend (its sessions gone) and a new holdfast that has never \
         seen the session, with the same key"
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
    Ok(Replaced {
        ok: before + after,
        failed: 2 * CALLS - before - after,
        reestablished,
        restarts,
    })
}
