//! A pod of the gateway and sidecar recipes: a stateful MCP server (the TypeScript SDK's, sessions
//! in memory) and the real holdfast binary in front of it, each stopped with SIGTERM and started
//! again on the same address as a rollout's next pod takes the old one's place.
//!
//! Every holdfast started here reads the same `sessions.key_file` when given one, as the
//! Kubernetes recipe mounts one Secret into every replica.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::node::TsServer;
use super::process::{holdfast, Running};
use super::proxy::metric_value;

/// A running pod (or one between [`Pod::stop`] and [`Pod::start_again`]).
pub struct Pod {
    /// The MCP server.
    pub server: TsServer,
    holdfast: Option<Running>,
    /// holdfast's listener, kept across restarts.
    listen: SocketAddr,
    /// holdfast's admin listener (a new port at each start).
    admin: SocketAddr,
    keys: Option<PathBuf>,
    /// More environment for holdfast (`HOLDFAST_*`), at every start.
    env: Vec<(String, String)>,
}

fn command(
    upstream: SocketAddr,
    listen: &str,
    keys: Option<&Path>,
    env: &[(String, String)],
) -> Command {
    let upstream = format!("http://{upstream}");
    let mut cmd = holdfast(&[
        "--upstream",
        &upstream,
        "--listen",
        listen,
        "--admin",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]);
    // An open GET stream keeps a drain going to its end: a short one keeps a pod's replacement
    // short (the stream is cut, and the client opens it again elsewhere, as it would anyway).
    cmd.env("HOLDFAST_SHUTDOWN__DRAIN_TIMEOUT_SECS", "2");
    if let Some(keys) = keys {
        cmd.env("HOLDFAST_SESSIONS__KEY_FILE", keys);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Waits (off the runtime's thread) for holdfast's start line: its two addresses.
async fn started(mut running: Running) -> (Running, (SocketAddr, SocketAddr)) {
    tokio::task::spawn_blocking(move || {
        let addresses = running.addresses();
        (running, addresses)
    })
    .await
    .expect("the wait for holdfast's start")
}

impl Pod {
    /// Starts a server recording into `ledger` and `levels` and a holdfast in front of it,
    /// sealing session tokens with `keys` (a random key of its own without), with more
    /// environment for holdfast (`HOLDFAST_*`).
    pub async fn start_with(
        ledger: &Path,
        levels: &Path,
        keys: Option<&Path>,
        env: Vec<(String, String)>,
    ) -> Pod {
        Pod::start_on(0, ledger, levels, keys, env).await
    }

    /// [`Pod::start_with`] with holdfast on `port` of 127.0.0.1 (0: any), for peers that must
    /// know each other's address before they start.
    pub async fn start_on(
        port: u16,
        ledger: &Path,
        levels: &Path,
        keys: Option<&Path>,
        env: Vec<(String, String)>,
    ) -> Pod {
        let server = TsServer::start(0, ledger, levels).await;
        let listen = format!("127.0.0.1:{port}");
        let running = Running::start(&mut command(server.addr(), &listen, keys, &env));
        let (running, (listen, admin)) = started(running).await;
        Pod {
            server,
            holdfast: Some(running),
            listen,
            admin,
            keys: keys.map(Path::to_owned),
            env,
        }
    }

    /// holdfast's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// `http://<holdfast>` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    /// SIGTERM to holdfast; waits for its drain and exit (status 0).
    pub async fn stop_holdfast(&mut self) {
        let running = self.holdfast.take().expect("holdfast is running");
        let (status, lines) = tokio::task::spawn_blocking(move || running.terminate())
            .await
            .expect("the wait for holdfast's exit");
        assert!(
            status.success(),
            "holdfast exited {status}:\n{}",
            lines.join("\n")
        );
    }

    /// Starts holdfast again on the same address, with the same keys.
    pub async fn start_holdfast(&mut self) {
        assert!(self.holdfast.is_none(), "holdfast is already running");
        let listen = self.listen.to_string();
        let running = Running::start(&mut command(
            self.server.addr(),
            &listen,
            self.keys.as_deref(),
            &self.env,
        ));
        let (running, (listen, admin)) = started(running).await;
        assert_eq!(listen, self.listen);
        self.admin = admin;
        self.holdfast = Some(running);
    }

    /// The pod replaced: holdfast drains and exits, then the server; both start again (the
    /// server without any session). holdfast goes first, as the gateway recipe's Service takes
    /// the pod out of its endpoints: the calls in flight finish, the test server has no
    /// graceful shutdown of its own (tests/it/graceful.rs is about one that has).
    pub async fn replace(&mut self) {
        self.stop_holdfast().await;
        self.server.stop().await;
        self.server.start_again().await;
        self.start_holdfast().await;
    }

    /// The pod leaves as the sidecar recipe orders it once it turns Terminating: the MCP
    /// container's preStop sleep (`pre_stop`; it keeps serving meanwhile), its SIGTERM and exit,
    /// then holdfast's SIGTERM (a native sidecar stops after the main containers), whose accept
    /// grace and drain it waits out. Nothing starts in its place: that is the rollout's next pod.
    pub async fn leave_in_the_recipes_order(&mut self, pre_stop: std::time::Duration) {
        // The modelled preStop hook's own duration, not a wait for something to happen.
        tokio::time::sleep(pre_stop).await;
        self.server.stop().await;
        self.stop_holdfast().await;
    }

    /// The first stderr line of the running holdfast containing `needle`, waiting (bounded).
    pub async fn wait_for_line(&mut self, needle: &str) -> String {
        let mut running = self.holdfast.take().expect("holdfast is running");
        let needle = needle.to_owned();
        let (running, line) = tokio::task::spawn_blocking(move || {
            let line = running.wait_for_line(&needle);
            (running, line)
        })
        .await
        .expect("the wait for a log line");
        self.holdfast = Some(running);
        line
    }

    /// The running holdfast's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.admin);
        super::http::get_metrics(&url).await.text().to_owned()
    }

    /// One series of the running holdfast's `/metrics` (pre-created: absent fails).
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    /// The running holdfast's stderr so far (JSON lines), for failure messages.
    pub fn log(&mut self) -> String {
        self.holdfast
            .as_mut()
            .map(|running| running.lines_so_far().join("\n"))
            .unwrap_or_default()
    }
}
