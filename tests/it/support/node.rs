//! The official MCP TypeScript SDK as test peers: a client and a stateful server, each a `node`
//! child process running a script in `tests/node/` (`client.mjs`, `server.mjs`; the SDK version is
//! pinned in `tests/node/package-lock.json`, installed by `.ci/run` with `npm ci`).
//!
//! Both scripts speak one JSON object per line on stdout and trace on stderr. A thread per pipe
//! collects the lines into a `watch` channel, so an async test awaits a line (with a bound)
//! instead of blocking the runtime or sleeping. Every child is killed when its handle drops.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::thread;

use serde_json::{json, Value};
use tokio::sync::watch;

use super::files::repo_path;
use super::process::{find_program, Guard};
use super::LIMIT;

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

/// Lines one pipe of a child printed so far; the sender is dropped when the pipe closes.
type Lines = watch::Receiver<Vec<String>>;

/// Reads `pipe` line by line on a thread, publishing every line as it arrives.
fn collect_lines(pipe: impl Read + Send + 'static) -> Lines {
    let (tx, rx) = watch::channel(Vec::new());
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            tx.send_modify(|lines| lines.push(line));
        }
    });
    rx
}

/// Waits (at most [`LIMIT`]) for line number `index` (from 0); `None` if the pipe closed first.
/// `what` and `trace` name what was awaited and explain a timeout.
async fn line_at(lines: &mut Lines, index: usize, what: &str, trace: &Lines) -> Option<String> {
    match tokio::time::timeout(LIMIT, lines.wait_for(|lines| lines.len() > index)).await {
        Ok(Ok(lines)) => Some(lines[index].clone()),
        Ok(Err(_closed)) => None,
        Err(_) => panic!(
            "no {what} within {LIMIT:?}; stderr so far:\n{}",
            trace.borrow().join("\n")
        ),
    }
}

/// Waits (at most [`LIMIT`]) until the child has closed `lines`, i.e. has exited.
async fn closed(lines: &mut Lines, what: &str) {
    let wait = async { while lines.changed().await.is_ok() {} };
    tokio::time::timeout(LIMIT, wait)
        .await
        .unwrap_or_else(|_| panic!("{what} did not exit within {LIMIT:?}"));
}

/// Parses one JSON line a script printed.
fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"))
}

/// A running node script: the child, its stdout as events and its stderr as a trace.
struct Script {
    child: Guard,
    stdout: Lines,
    stderr: Lines,
    /// How many stdout lines the test has consumed.
    read: usize,
    /// Names the script in failure messages.
    name: String,
}

impl Script {
    fn spawn(name: String, script: &str, args: &[&str], stdin: Stdio) -> Script {
        let node = require_node();
        let mut child = Guard(
            Command::new(node)
                .arg(script)
                .args(args)
                .current_dir(node_dir())
                .stdin(stdin)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {name}: {e}")),
        );
        let stdout = collect_lines(child.0.stdout.take().expect("piped stdout"));
        let stderr = collect_lines(child.0.stderr.take().expect("piped stderr"));
        Script {
            child,
            stdout,
            stderr,
            read: 0,
            name,
        }
    }

    /// The next stdout line as JSON; a panic naming `what` if the script exits or times out.
    async fn next_event(&mut self, what: &str) -> Value {
        let what = format!("{what} from {}", self.name);
        let Some(line) = line_at(&mut self.stdout, self.read, &what, &self.stderr).await else {
            panic!(
                "{} exited ({:?}) before printing {what}; stderr:\n{}",
                self.name,
                self.child.0.try_wait(),
                self.trace()
            )
        };
        self.read += 1;
        parse(&line)
    }

    /// Sends SIGTERM (what `docker stop` sends) and waits, bounded, for the process to exit.
    async fn terminate(mut self) {
        super::process::sigterm(&self.child.0);
        self.wait_exit().await;
    }

    /// Waits, bounded, for the process to exit by itself.
    async fn wait_exit(&mut self) {
        closed(&mut self.stdout, &self.name).await;
        // stdout is closed, so the process has exited or is exiting (node starts no children):
        // this wait is short.
        self.child.0.wait().expect("wait for node");
    }

    /// Everything the script wrote to stderr so far.
    fn trace(&self) -> String {
        self.stderr.borrow().join("\n")
    }
}

/// The official TypeScript SDK client (`Client` + `StreamableHTTPClientTransport`) in a `node`
/// process, performing one command at a time when the test says so.
pub struct TsClient {
    script: Script,
    stdin: ChildStdin,
    /// The `Mcp-Session-Id` the client's transport reported with its latest event.
    session_id: Option<String>,
}

impl TsClient {
    /// Starts the client on `url` (the MCP endpoint, e.g. holdfast's `/mcp`) and waits until it
    /// has initialized its session.
    pub async fn start(url: &str) -> TsClient {
        TsClient::spawn(&[url]).await
    }

    /// Starts a client of the deprecated 2024-11-05 HTTP+SSE transport (`SSEClientTransport`) on
    /// `url` (the server's event stream, e.g. holdfast's `/sse`) and waits until it has
    /// initialized its session.
    pub async fn start_legacy(url: &str) -> TsClient {
        TsClient::spawn(&["--legacy", url]).await
    }

    /// [`TsClient::start`], or the SDK's message when the client could not connect.
    pub async fn try_start(url: &str) -> Result<TsClient, String> {
        let mut script = Script::spawn(
            format!("the TypeScript SDK client ({url})"),
            "client.mjs",
            &[url],
            Stdio::piped(),
        );
        let stdin = script.child.0.stdin.take().expect("piped stdin");
        let ready = script.next_event("the ready line").await;
        match ready["event"].as_str() {
            Some("ready") => Ok(TsClient {
                session_id: ready["sessionId"].as_str().map(str::to_owned),
                script,
                stdin,
            }),
            Some("failed") => Err(format!("{}; trace:\n{}", ready["error"], script.trace())),
            _ => panic!("unexpected line {ready}"),
        }
    }

    async fn spawn(args: &[&str]) -> TsClient {
        let url = args.last().expect("a URL");
        let mut script = Script::spawn(
            format!("the TypeScript SDK client ({url})"),
            "client.mjs",
            args,
            Stdio::piped(),
        );
        let stdin = script.child.0.stdin.take().expect("piped stdin");
        let ready = script.next_event("the ready line").await;
        assert_eq!(
            ready["event"],
            "ready",
            "the client did not connect: {ready}; stderr:\n{}",
            script.trace()
        );
        TsClient {
            session_id: ready["sessionId"].as_str().map(str::to_owned),
            script,
            stdin,
        }
    }

    /// Hands the client one command without waiting for its result (read it with
    /// [`TsClient::result`]): for a call that has to be in flight while the test does something.
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

    /// The client's stderr so far: a line per HTTP request the SDK made (method, JSON-RPC method,
    /// session, protocol version, status) and every error it reported out of band.
    pub fn trace(&self) -> String {
        self.script.trace()
    }
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
        let mut script = Script::spawn(
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
