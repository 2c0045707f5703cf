//! Stateful MCP servers people deploy, from npm and PyPI, as test peers that can be recreated:
//! each a child process on a port of its own that [`StackServer::restart`] stops with SIGTERM
//! and starts again, with every session forgotten, as a recreated container is.
//!
//! They differ in what they answer for a session they forgot (docs/compatibility.md has the
//! measured matrix): that is what the tests run them for. Versions are pinned where `.ci/run`
//! installs them (`tests/node/package-lock.json`, the pip line).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};

use super::files::{repo_path, TempDir};
use super::node::{node_dir, require_node};
use super::python::require_python_module;
use super::script::Script;
use super::LIMIT;

/// One server stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    /// The reference everything server (`@modelcontextprotocol/server-everything`,
    /// `streamableHttp`): a forgotten session gets 400 "No valid session ID provided".
    Everything,
    /// The TypeScript SDK's own example `simpleStreamableHttp` (express, a map of transports):
    /// 404 "Session not found".
    SdkExample,
    /// A TypeScript SDK server with one transport for every request
    /// (`tests/node/one-transport-server.mjs`): after a restart, 400 "Server not initialized".
    SdkOneTransport,
    /// The Python SDK's `MCPServer` under uvicorn (`tests/python/ledger_server.py`): 404.
    PySdk,
    /// FastMCP (PyPI `fastmcp`, `tests/python/fastmcp_server.py`): 404.
    Fastmcp,
    /// FastMCP for TypeScript (npm `fastmcp`, `tests/node/fastmcp-server.mjs`): 404.
    FastmcpTs,
}

impl Stack {
    /// The name failure messages use.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Everything => "the everything server",
            Stack::SdkExample => "the TypeScript SDK example simpleStreamableHttp",
            Stack::SdkOneTransport => "a one-transport TypeScript SDK server",
            Stack::PySdk => "the Python SDK server",
            Stack::Fastmcp => "FastMCP",
            Stack::FastmcpTs => "FastMCP for TypeScript",
        }
    }

    /// Call number `n` as this stack's tool takes it: the tool, its arguments, and the text of
    /// its result. Each `n` gives arguments of its own, so the router's log shows how often each
    /// call reached the server.
    pub fn call(self, n: u64) -> (&'static str, Value, String) {
        let word = format!("call-{n}");
        match self {
            Stack::Everything => ("echo", json!({ "message": word }), format!("Echo: {word}")),
            Stack::SdkExample => ("greet", json!({ "name": word }), format!("Hello, {word}!")),
            Stack::SdkOneTransport | Stack::Fastmcp | Stack::FastmcpTs => {
                ("echo", json!({ "message": word }), word)
            }
            // `record`: announced with no annotations, so never sent twice by holdfast.
            Stack::PySdk => ("record", json!({ "n": n }), format!("record {n}")),
        }
    }

    /// Starts one process of the stack on `port`; `release`: the changes of the version it is
    /// (`HOLDFAST_TEST_RELEASE`, read by the servers of this suite: `extra`, one tool more).
    fn spawn(self, port: u16, scratch: &TempDir, release: &str) -> Script {
        let name = format!("{} (port {port})", self.name());
        let port = port.to_string();
        let released = ("HOLDFAST_TEST_RELEASE", release);
        let node = |args: &[&str], env: &[(&str, &str)]| {
            let mut env = env.to_vec();
            env.push(released);
            Script::spawn(
                name.clone(),
                &require_node(),
                args,
                (&node_dir(), &env),
                Stdio::null(),
            )
        };
        let python = |module: (&str, &str), args: &[&str]| {
            let python = require_python_module(module.0, module.1);
            let dir = repo_path("tests/python");
            Script::spawn(
                name.clone(),
                &python,
                args,
                (&dir, &[released]),
                Stdio::null(),
            )
        };
        match self {
            Stack::Everything => node(
                &[
                    "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                    "streamableHttp",
                ],
                &[("PORT", &port)],
            ),
            Stack::SdkExample => node(
                &["node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js"],
                &[("MCP_PORT", &port)],
            ),
            Stack::SdkOneTransport => node(&["one-transport-server.mjs", &port], &[]),
            Stack::FastmcpTs => node(&["fastmcp-server.mjs", &port], &[]),
            Stack::PySdk => {
                let ledger = scratch.path().join("ledger");
                let ledger = ledger.to_str().expect("a UTF-8 temporary path");
                python(("mcp.server.mcpserver", "mcp==2.3.0"), &["ledger_server.py", &port, ledger])
            }
            Stack::Fastmcp => python(("fastmcp", "fastmcp==4.1.6"), &["fastmcp_server.py", &port]),
        }
    }
}

/// A stack's server process, stopped and started again on the same port.
pub struct StackServer {
    stack: Stack,
    port: u16,
    script: Option<Script>,
    /// Where a stack keeps files (the Python SDK server's ledger).
    scratch: TempDir,
    /// The stderr of earlier runs, for failure messages.
    history: Vec<String>,
    /// The changes of the version the next start runs ([`StackServer::release`]).
    release: String,
}

impl StackServer {
    /// Starts `stack` on a port of its own and waits until it accepts connections.
    pub async fn start(stack: Stack) -> StackServer {
        let mut server = StackServer {
            stack,
            port: super::ports::quiet(),
            script: None,
            scratch: TempDir::new("stack"),
            history: Vec::new(),
            release: String::new(),
        };
        server.start_again().await;
        server
    }

    /// Starts the stack again after [`StackServer::stop`], with no sessions, and waits until it
    /// accepts connections.
    pub async fn start_again(&mut self) {
        assert!(self.script.is_none(), "the server is already running");
        let mut script = self.stack.spawn(self.port, &self.scratch, &self.release);
        self.listening(&mut script).await;
        self.script = Some(script);
    }

    /// Waits until the port accepts a connection. Third-party servers print no line a test can
    /// rely on across versions, so readiness is what a TCP readiness probe sees; a process that
    /// exits meanwhile fails at once, with what it said.
    async fn listening(&self, script: &mut Script) {
        let addr = self.addr();
        let ready = async {
            loop {
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    return;
                }
                if let Some(status) = script.exited() {
                    panic!(
                        "{} exited ({status}) before listening; stderr:\n{}",
                        self.stack.name(),
                        script.trace()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(LIMIT, ready).await.is_err() {
            panic!(
                "{} did not listen on {addr} within {LIMIT:?}; stderr:\n{}",
                self.stack.name(),
                script.trace()
            );
        }
    }

    /// Sends SIGTERM and waits, bounded, for the process to exit: the port refuses connections
    /// until [`StackServer::start_again`].
    pub async fn stop(&mut self) {
        if let Some(script) = self.script.take() {
            self.history.extend(script.stderr.borrow().iter().cloned());
            script.terminate().await;
        }
    }

    /// The next start runs the next version of the server: `changes` (`extra`: one tool more;
    /// the servers of this suite only, not the third-party ones).
    pub fn release(&mut self, changes: &str) {
        changes.clone_into(&mut self.release);
    }

    /// [`StackServer::stop`], then [`StackServer::start_again`]: a recreated container.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Every line the server wrote to stderr, across restarts.
    pub fn trace(&self) -> String {
        let mut lines = self.history.clone();
        if let Some(script) = &self.script {
            lines.extend(script.stderr.borrow().iter().cloned());
        }
        lines.join("\n")
    }
}
