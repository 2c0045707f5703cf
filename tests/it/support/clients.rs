//! MCP clients as test peers, each a child process driven one command at a time by the test
//! (which decides when each call happens), all speaking the lines of `tests/node/client.mjs`:
//! - [`Peer::TsSdk`]: the official TypeScript SDK client (`Client` +
//!   `StreamableHTTPClientTransport`), the one most desktop tools embed; [`Peer::TsSdkLegacySse`]
//!   its deprecated 2024-11-05 HTTP+SSE transport;
//! - [`Peer::McpRemote`]: `mcp-remote` (npm), the stdio bridge desktop clients run to reach a
//!   remote server, driven over stdio by the SDK client;
//! - [`Peer::PySdk`]: the official Python SDK's `mcp.Client` in its default mode, and
//!   [`Peer::PySdkHandshake`] pinned to the 2025 handshake;
//! - [`Peer::Fastmcp`]: `fastmcp.Client` (PyPI `fastmcp`).
//!
//! Versions are pinned where `.ci/run` installs them (`tests/node/package-lock.json`, the pip line).

use std::io::Write;
use std::process::{ChildStdin, Stdio};

use serde_json::{json, Value};

use super::files::TempDir;
use super::node::node_script;
use super::python::python_script;
use super::script::Script;

/// The Python module each Python client needs, and the pip requirement `.ci/run` installs it by.
const PY_SDK: (&str, &str) = ("mcp", "mcp==2.3.0");
const FASTMCP: (&str, &str) = ("fastmcp", "fastmcp==4.1.6");

/// Which client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The official TypeScript SDK client over Streamable HTTP.
    TsSdk,
    /// The official TypeScript SDK client over the 2024-11-05 HTTP+SSE transport.
    TsSdkLegacySse,
    /// The official TypeScript SDK client over Streamable HTTP, taking elicitations (it
    /// accepts each with `{"ok": true}`).
    TsSdkEliciting,
    /// The TypeScript SDK client through `mcp-remote`.
    McpRemote,
    /// The official Python SDK client (`mcp.Client`, default mode: 2026-07-28 where the server
    /// speaks it).
    PySdk,
    /// The official Python SDK client pinned to the 2025 handshake (`mode="legacy"`).
    PySdkHandshake,
    /// `fastmcp.Client`.
    Fastmcp,
    /// `fastmcp.Client` pinned to the 2025 handshake (`mode="legacy"`): in front of a server of
    /// both eras its default speaks 2026-07-28, with no session.
    FastmcpHandshake,
}

impl Peer {
    /// The name failure messages use.
    pub fn name(self) -> &'static str {
        match self {
            Peer::TsSdk => "the TypeScript SDK client",
            Peer::TsSdkLegacySse => "the TypeScript SDK's legacy SSE client",
            Peer::TsSdkEliciting => "the TypeScript SDK client (taking elicitations)",
            Peer::McpRemote => "mcp-remote",
            Peer::PySdk => "the Python SDK client",
            Peer::PySdkHandshake => "the Python SDK client (2025 handshake)",
            Peer::Fastmcp => "fastmcp's client",
            Peer::FastmcpHandshake => "fastmcp's client (2025 handshake)",
        }
    }
}

/// One MCP client in a child process, performing one command at a time when the test says so.
pub struct PeerClient {
    script: Script,
    /// mcp-remote's configuration directory, removed with the client.
    _config: Option<TempDir>,
    /// The protocol revision the client settled on, where it says (the Python clients do).
    era: Option<String>,
    stdin: ChildStdin,
    /// The `Mcp-Session-Id` the client's transport reported with its latest event.
    session_id: Option<String>,
}

impl PeerClient {
    /// Starts the TypeScript SDK client on `url` (the MCP endpoint, e.g. holdfast's `/mcp`) and
    /// waits until it has initialized its session.
    pub async fn start(url: &str) -> PeerClient {
        PeerClient::start_peer(Peer::TsSdk, url).await
    }

    /// Starts a client of the deprecated 2024-11-05 HTTP+SSE transport (`SSEClientTransport`) on
    /// `url` (the server's event stream, e.g. holdfast's `/sse`) and waits until it has
    /// initialized its session.
    pub async fn start_legacy(url: &str) -> PeerClient {
        PeerClient::start_peer(Peer::TsSdkLegacySse, url).await
    }

    /// Starts `peer` on `url` and waits until it has connected; fails the test if it cannot.
    pub async fn start_peer(peer: Peer, url: &str) -> PeerClient {
        PeerClient::try_start_peer(peer, url)
            .await
            .unwrap_or_else(|e| panic!("{} did not connect to {url}: {e}", peer.name()))
    }

    /// [`PeerClient::start`], or the SDK's message when the client could not connect.
    pub async fn try_start(url: &str) -> Result<PeerClient, String> {
        PeerClient::try_start_peer(Peer::TsSdk, url).await
    }

    /// Starts `peer` on `url`: the client once connected, or its message when it could not.
    pub async fn try_start_peer(peer: Peer, url: &str) -> Result<PeerClient, String> {
        let name = format!("{} ({url})", peer.name());
        let config = (peer == Peer::McpRemote).then(|| TempDir::new("mcp-remote"));
        let mut script = match peer {
            Peer::TsSdk => node_script(name, "client.mjs", &[url], Stdio::piped()),
            Peer::TsSdkLegacySse => {
                node_script(name, "client.mjs", &["--legacy", url], Stdio::piped())
            }
            Peer::TsSdkEliciting => {
                node_script(name, "client.mjs", &["--elicit", url], Stdio::piped())
            }
            Peer::McpRemote => {
                let dir = config.as_ref().expect("made above").path();
                let dir = dir.to_str().expect("a UTF-8 temporary path");
                node_script(
                    name,
                    "client.mjs",
                    &["--mcp-remote", dir, url],
                    Stdio::piped(),
                )
            }
            Peer::PySdk => python_script(name, "session_client.py", &[url], PY_SDK),
            Peer::PySdkHandshake => {
                python_script(name, "session_client.py", &["--handshake", url], PY_SDK)
            }
            Peer::Fastmcp => python_script(name, "session_client.py", &["--fastmcp", url], FASTMCP),
            Peer::FastmcpHandshake => {
                let args = ["--fastmcp-handshake", url];
                python_script(name, "session_client.py", &args, FASTMCP)
            }
        };
        let stdin = script.child.0.stdin.take().expect("piped stdin");
        let ready = script.next_event("the ready line").await;
        match ready["event"].as_str() {
            Some("ready") => Ok(PeerClient {
                session_id: ready["sessionId"].as_str().map(str::to_owned),
                era: ready["era"].as_str().map(str::to_owned),
                script,
                _config: config,
                stdin,
            }),
            Some("failed") => Err(format!("{}; trace:\n{}", ready["error"], script.trace())),
            _ => panic!("unexpected line {ready}"),
        }
    }

    /// Hands the client one command without waiting for its result (read it with
    /// [`PeerClient::result`]): for a call that has to be in flight while the test does something.
    pub fn send(&mut self, command: Value) {
        // One short line into a pipe the client reads all the time: this write does not block.
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("write to the client: {e}; stderr:\n{}", self.trace()));
    }

    /// The result of the oldest command not yet answered: the first text content of a tool's
    /// result (empty for other commands), or the SDK's error message.
    pub async fn result(&mut self) -> Result<String, String> {
        let event = self.script.next_event("a command's result").await;
        assert_eq!(event["event"], "result", "unexpected line {event}");
        self.session_id = event["sessionId"].as_str().map(str::to_owned);
        if event["ok"] == true {
            Ok(event["text"].as_str().unwrap_or_default().to_owned())
        } else {
            Err(event["error"].as_str().unwrap_or_default().to_owned())
        }
    }

    /// Calls `tool` with `args` (a JSON object, or `Value::Null` for none) and waits for the
    /// outcome.
    pub async fn call(&mut self, tool: &str, args: Value) -> Result<String, String> {
        let mut command = json!({ "op": "call", "tool": tool });
        if !args.is_null() {
            command["args"] = args;
        }
        self.send(command);
        self.result().await
    }

    /// Calls `count` and parses the number it returns.
    pub async fn count(&mut self) -> Result<u64, String> {
        let text = self.call("count", Value::Null).await?;
        Ok(text
            .parse()
            .unwrap_or_else(|_| panic!("count returned {text:?}")))
    }

    /// Calls `count` `n` times, asserting each returns the next value after `from` (each call
    /// ran once, in order) on the session the client started with (`session`).
    pub async fn count_from(&mut self, session: &str, from: u64, n: u64) {
        for expected in from + 1..=from + n {
            let value = self.count().await;
            assert_eq!(
                value,
                Ok(expected),
                "call {expected}; client trace:\n{}",
                self.trace()
            );
            assert_eq!(
                self.session_id(),
                Some(session),
                "the client's session id changed; trace:\n{}",
                self.trace()
            );
        }
    }

    /// Lists the tools (`tools/list`): their names, comma-separated, or the SDK's error (which
    /// fails the test, with the client's trace).
    pub async fn list(&mut self) -> String {
        self.send(json!({ "op": "list" }));
        let listed = self.result().await;
        listed.unwrap_or_else(|e| panic!("tools/list failed: {e}; trace:\n{}", self.trace()))
    }

    /// Waits (bounded) until a `notifications/tools/list_changed` arrived: how many did so far.
    pub async fn tools_changed(&mut self) -> String {
        self.send(json!({ "op": "toolsChanged" }));
        let changed = self.result().await;
        changed.unwrap_or_else(|e| panic!("toolsChanged failed: {e}; trace:\n{}", self.trace()))
    }

    /// Sends `logging/setLevel` with `level`.
    pub async fn set_level(&mut self, level: &str) -> Result<(), String> {
        self.send(json!({ "op": "setLevel", "level": level }));
        self.result().await.map(drop)
    }

    /// Ends the session as the SDK does (`terminateSession`: a DELETE) and waits, bounded, for
    /// the process to exit.
    pub async fn close(mut self) -> Result<(), String> {
        self.send(json!({ "op": "close" }));
        let outcome = self.result().await.map(drop);
        self.script.wait_exit().await;
        outcome
    }

    /// The session id the client's transport holds, as of its latest result (at first, the one
    /// `initialize` gave it).
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// The protocol revision the client settled on, where it says (the Python clients do).
    pub fn era(&self) -> Option<&str> {
        self.era.as_deref()
    }

    /// The client's stderr so far: a line per HTTP request the SDK made (method, JSON-RPC method,
    /// session, protocol version, status) and every error it reported out of band.
    pub fn trace(&self) -> String {
        self.script.trace()
    }
}
