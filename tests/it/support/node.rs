//! The official MCP TypeScript SDK as a test server: a stateful server in a `node` child process
//! running a script in `tests/node/` (`server.mjs`, `legacy-server.mjs`; the SDK version is
//! pinned in `tests/node/package-lock.json`, installed by `.ci/run` with `npm ci`). The SDK's
//! client is in [`super::clients`]; other servers from npm in [`super::stacks`].
//!
//! Every script speaks one JSON object per line on stdout and traces on stderr
//! ([`super::script`]). Every child is killed when its handle drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::files::repo_path;
use super::process::find_program;
use super::script::Script;

/// The directory holding the scripts and their `node_modules`: `tests/node`.
pub fn node_dir() -> PathBuf {
    repo_path("tests/node")
}

/// The `node` binary, or a failure that says how to install what is missing: these tests must
/// not pass by not running.
pub fn require_node() -> PathBuf {
    // Not `require_program`: its message says .ci/run installs the program, and .ci/run only
    // installs the SDK, with the npm that comes with Node.js.
    let node = find_program("node").unwrap_or_else(|| {
        panic!(
            "`node` is not installed, so this test cannot run. Install Node.js 20 or later \
             with npm (the SDK's HTTP adapter, @hono/node-server 2, declares node >= 20; \
             Debian 12's nodejs is 18, NodeSource has 20), then run .ci/run, or \
             `cd tests/node && npm ci`."
        )
    });
    let sdk = node_dir().join("node_modules/@modelcontextprotocol/sdk/package.json");
    assert!(
        sdk.is_file(),
        "the MCP TypeScript SDK is not installed ({} is missing), so this test cannot run. \
         Run .ci/run, which installs it, or `cd tests/node && npm ci`.",
        sdk.display()
    );
    node
}

/// Starts `tests/node/<file>` with `args` under `node`.
pub fn node_script(name: String, file: &str, args: &[&str], stdin: Stdio) -> Script {
    let mut argv = vec![file];
    argv.extend_from_slice(args);
    Script::spawn(name, &require_node(), &argv, (&node_dir(), &[]), stdin)
}

/// A stateful TypeScript SDK MCP server (`McpServer` + `StreamableHTTPServerTransport`, sessions
/// in an in-memory map) in a `node` process, with tools `count` and `echo`. Stopping it loses
/// every session, as recreating a container does; the ledger and levels files survive.
pub struct TsServer {
    /// The running process; `None` between [`TsServer::stop`] and [`TsServer::start_again`].
    script: Option<Script>,
    /// A legacy (2024-11-05 HTTP+SSE) server, `legacy-server.mjs`, instead of `server.mjs`.
    legacy: bool,
    /// The port bound at the first start, kept for every later one.
    port: u16,
    /// One line per execution of `count`.
    ledger: PathBuf,
    /// One `setLevel <level>` line per `logging/setLevel` received.
    levels: PathBuf,
    /// The stderr of earlier runs, for failure messages.
    history: Vec<String>,
}

impl TsServer {
    /// Starts the server on `127.0.0.1:port` (0: any free port), recording `count` executions in
    /// `ledger` and log levels in `levels`, and waits until it is listening.
    pub async fn start(port: u16, ledger: &Path, levels: &Path) -> TsServer {
        let mut server = TsServer {
            script: None,
            legacy: false,
            port,
            ledger: ledger.to_owned(),
            levels: levels.to_owned(),
            history: Vec::new(),
        };
        server.start_again().await;
        server
    }

    /// A legacy (2024-11-05 HTTP+SSE) server on the SDK's `SSEServerTransport`, as the SDK's
    /// example writes one: `GET /sse` opens a session's stream, whose `endpoint` event names
    /// `/messages?sessionId=...`; a POST for a session it does not know gets its own
    /// `404 Session not found`. Tool `count` only (no levels file).
    pub async fn start_legacy(port: u16, ledger: &Path) -> TsServer {
        let mut server = TsServer {
            script: None,
            legacy: true,
            port,
            ledger: ledger.to_owned(),
            levels: PathBuf::new(),
            history: Vec::new(),
        };
        server.start_again().await;
        server
    }

    /// Starts again on the same port after [`TsServer::stop`], with no sessions, and waits until
    /// it is listening.
    pub async fn start_again(&mut self) {
        assert!(self.script.is_none(), "the server is already running");
        let port = self.port.to_string();
        let mut args = vec!["--port", &port, "--ledger", path_str(&self.ledger)];
        if !self.legacy {
            args.extend(["--levels", path_str(&self.levels)]);
        }
        let (what, file) = if self.legacy {
            ("legacy server", "legacy-server.mjs")
        } else {
            ("server", "server.mjs")
        };
        let mut script = node_script(
            format!("the TypeScript SDK {what} (port {port})"),
            file,
            &args,
            Stdio::null(),
        );
        let listening = script.next_event("the listening line").await;
        assert_eq!(
            listening["event"], "listening",
            "unexpected line {listening}"
        );
        self.port = listening["port"]
            .as_u64()
            .and_then(|port| u16::try_from(port).ok())
            .unwrap_or_else(|| panic!("no port in {listening}"));
        self.script = Some(script);
    }

    /// Sends SIGTERM and waits, bounded, for the process to exit: the port refuses connections
    /// until [`TsServer::start_again`]. Does nothing when already stopped.
    pub async fn stop(&mut self) {
        if let Some(script) = self.script.take() {
            self.history.extend(script.stderr.borrow().iter().cloned());
            script.terminate().await;
        }
    }

    /// [`TsServer::stop`], then [`TsServer::start_again`]: a recreated container.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr())
    }

    /// How many times `count` has executed, across restarts.
    pub fn ledger_lines(&self) -> usize {
        read_lines(&self.ledger).len()
    }

    /// Every `logging/setLevel` received, across restarts, in order (`setLevel <level>`).
    pub fn levels(&self) -> Vec<String> {
        read_lines(&self.levels)
    }

    /// Every line the server wrote to stderr, across restarts: one per request it answered.
    pub fn trace(&self) -> String {
        let mut lines = self.history.clone();
        if let Some(script) = &self.script {
            lines.extend(script.stderr.borrow().iter().cloned());
        }
        lines.join("\n")
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str()
        .unwrap_or_else(|| panic!("not UTF-8: {}", path.display()))
}

/// The lines of `path`; none if it does not exist yet (nothing was recorded).
fn read_lines(path: &Path) -> Vec<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}
