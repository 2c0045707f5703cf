//! The demo's last phase: a planned recreation with `holdfast pause`. A slow tool call is in
//! flight; the pause holds new calls and returns once the slow call is done; the backend is
//! then stopped and started (its sessions gone), and the calls made meanwhile go to the new
//! instance, each run once. holdfast resumes by itself: it saw the old instance go and the new
//! one answer.

use super::*;

/// How long the demo's `slow` tool takes.
pub(super) const SLOW: Duration = Duration::from_millis(800);

/// Calls made while paused.
pub const DURING: u64 = 3;

/// How long the recreated backend is away: long enough for holdfast to see it gone.
const AWAY: Duration = Duration::from_millis(600);

/// What the planned recreation saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// The slow call in flight when the pause began completed.
    pub slow_ok: bool,
    /// Calls made while paused that succeeded.
    pub held_ok: u64,
    /// Calls made while paused that failed.
    pub held_failed: u64,
    /// `holdfast pause`'s exit status (0: drained).
    pub pause_exit: u8,
    /// Times the backend was recreated in this phase.
    pub restarts: u64,
}

impl Planned {
    /// Successful calls in this phase.
    pub fn ok(&self) -> u64 {
        u64::from(self.slow_ok) + self.held_ok
    }
}

/// A `tools/call` of `name`.
fn call(id: u64, name: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": {}}})
    .to_string()
}

/// Runs the phase; the backend is up before and after.
pub(super) async fn run(
    backend: &Arc<Backend>,
    serving: &mut Option<tokio::task::JoinHandle<()>>,
    backend_addr: SocketAddr,
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
) -> std::io::Result<Planned> {
    println!("\nplanned recreation with `holdfast pause`:");
    let url = format!("http://{proxy_addr}/mcp");
    let client: DemoClient = HyperClient::builder(TokioExecutor::new()).build_http();
    let session = initialize(&client, &url)
        .await
        .ok_or_else(|| std::io::Error::other("no session through holdfast"))?;
    let send = |id: u64, name: &'static str| {
        let (client, url, session) = (client.clone(), url.clone(), session.clone());
        tokio::spawn(async move { post(&client, &url, Some(&session), call(id, name)).await })
    };

    let slow = send(1000, "slow");
    until_status(admin_addr, |s| s["in_flight"].as_u64() >= Some(1)).await?;
    println!(
        "  a slow tool call ({:.1} s) is in flight; `holdfast pause` holds new calls and waits for it",
        SLOW.as_secs_f64()
    );
    let begun = Instant::now();
    let pause = tokio::spawn(crate::admin::client::pause(
        admin_addr,
        None,
        Duration::from_secs(10),
    ));
    until_status(admin_addr, |s| s["paused"] == true).await?;
    let during: Vec<_> = (0..DURING).map(|i| send(1001 + i, "count")).collect();
    let outcome = pause.await.map_err(std::io::Error::other)?;
    println!(
        "  `holdfast pause` returned after {:.1} s: {}",
        begun.elapsed().as_secs_f64(),
        outcome.message
    );

    backend
        .switch(Phase::Refused, serving, backend_addr)
        .await?;
    println!("  the backend is stopped, {DURING} calls made meanwhile wait in holdfast ...");
    tokio::time::sleep(AWAY).await;
    let restarts = u64::from(backend.switch(Phase::Up, serving, backend_addr).await?);
    println!("  ... and a new instance starts, its sessions gone");

    let slow_ok = matches!(slow.await, Ok(Posted::Ok(_)));
    let (mut held_ok, mut held_failed) = (0, 0);
    for call in during {
        match call.await {
            Ok(Posted::Ok(_)) => held_ok += 1,
            _ => held_failed += 1,
        }
    }
    println!(
        "  the slow call {}; the calls made during the recreation: {held_ok} ok, {held_failed} failed",
        if slow_ok { "completed" } else { "FAILED" }
    );
    Ok(Planned {
        slow_ok,
        held_ok,
        held_failed,
        pause_exit: outcome.code,
        restarts,
    })
}

/// Waits until holdfast's `/status` satisfies `ok` (bounded: a demo must end).
async fn until_status(
    admin: SocketAddr,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let asked = crate::admin::client::ask(
            admin,
            http::Method::GET,
            "/status",
            None,
            Duration::from_secs(1),
        )
        .await;
        if let Ok((StatusCode::OK, body)) = asked {
            if serde_json::from_slice(&body).is_ok_and(|s| ok(&s)) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(std::io::Error::other("holdfast's status never got there"))
}
