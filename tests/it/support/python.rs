//! The official MCP Python SDK's stateful server under uvicorn as a test peer:
//! `tests/python/ledger_server.py` in a child process, run by the `python3` on `PATH` (.ci/run
//! puts its virtual environment, with `mcp` installed, first on `PATH`).
//!
//! What it is for is uvicorn's graceful shutdown, which an in-process server cannot reproduce:
//! SIGTERM, a window in which open connections are still read while every event stream ends at
//! once, then the listener closes and the process exits. [`PyServer::stop`] sends SIGTERM and
//! waits for the exit; [`PyServer::start_again`] starts a fresh process, with no sessions, on the
//! same port.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use super::files::repo_path;
use super::process::{find_program, sigterm, Guard};
use super::script::Script;
use super::LIMIT;

/// One execution of a tool, as the server wrote it to its ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    /// The tool's name, or `read` for the resource.
    pub tool: String,
    /// The call's argument `n`.
    pub n: u64,
    /// The server process that ran it.
    pub pid: u32,
    /// When, in seconds since the Unix epoch.
    pub at: f64,
}

/// The `python3` that has the MCP Python SDK, or a failure that says how to get one: these
/// tests must not pass by not running.
pub fn require_python_sdk() -> PathBuf {
    require_python_module("mcp.server.mcpserver", "mcp==2.3.0")
}

/// The `python3` on `PATH` that can import `module` (from the pip requirement `requirement`),
/// or a failure that says how to get it.
pub fn require_python_module(module: &str, requirement: &str) -> PathBuf {
    let python = find_program("python3").unwrap_or_else(|| {
        panic!("`python3` is not installed, so this test cannot run; run .ci/run")
    });
    let has_it = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_it,
        "`{module}` is not importable by {}, so this test cannot run. Run .ci/run (it \
         installs it into target/ci-venv and puts that first on PATH), or \
         `pip install {requirement}` into a virtual environment on PATH.",
        python.display()
    );
    python
}

/// Starts `tests/python/<file>` with `args` under the `python3` that has `module`
/// (`requirement` says where it comes from).
pub fn python_script(name: String, file: &str, args: &[&str], module: (&str, &str)) -> Script {
    let python = require_python_module(module.0, module.1);
    let mut argv = vec![file];
    argv.extend_from_slice(args);
    Script::spawn(
        name,
        &python,
        &argv,
        (&repo_path("tests/python"), &[]),
        Stdio::piped(),
    )
}

/// A running (or stopped) Python SDK server.
pub struct PyServer {
    python: PathBuf,
    /// `tests/python/ledger_server.py`, or another server that writes the same ledger.
    script: &'static str,
    port: u16,
    ledger: PathBuf,
    child: Option<Guard>,
    /// Its stderr lines, from a thread per process.
    lines: Option<mpsc::Receiver<String>>,
    /// Every stderr line of every process so far, for failure messages.
    seen: Vec<String>,
}

impl PyServer {
    /// Starts the server on a free port, its ledger at `ledger`, and waits until it listens.
    pub async fn start(ledger: &Path) -> PyServer {
        PyServer::start_script("tests/python/ledger_server.py", ledger).await
    }

    /// [`PyServer::start`] with another script of the same arguments and ledger
    /// (`tests/python/modern_only_server.py`).
    pub async fn start_script(script: &'static str, ledger: &Path) -> PyServer {
        let mut server = PyServer {
            python: require_python_sdk(),
            script,
            port: super::ports::quiet(),
            ledger: ledger.to_owned(),
            child: None,
            lines: None,
            seen: Vec::new(),
        };
        server.start_again().await;
        server
    }

    /// Starts a new process on the same port and waits (bounded) until uvicorn says it listens.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let mut child = Guard(
            Command::new(&self.python)
                .arg(repo_path(self.script))
                .arg(self.port.to_string())
                .arg(&self.ledger)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the Python SDK server: {e}")),
        );
        let stderr = child.0.stderr.take().expect("piped stderr");
        self.child = Some(child);
        self.lines = Some(lines_of(stderr));
        self.wait_for_line("Uvicorn running on").await;
    }

    /// Waits (at most [`LIMIT`]) for a stderr line containing `needle`, after those already
    /// waited for.
    pub async fn wait_for_line(&mut self, needle: &str) {
        let rx = self.lines.take().expect("a running server");
        let wanted = needle.to_owned();
        let (rx, seen, found) = tokio::task::spawn_blocking(move || {
            let mut seen = Vec::new();
            let deadline = std::time::Instant::now() + LIMIT;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(line) => {
                        let found = line.contains(&wanted);
                        seen.push(line);
                        if found {
                            return (rx, seen, true);
                        }
                    }
                    Err(_) => return (rx, seen, false),
                }
            }
        })
        .await
        .expect("the reader task");
        self.seen.extend(seen);
        self.lines = Some(rx);
        assert!(
            found,
            "the Python SDK server never printed {needle:?}; stderr:\n{}",
            self.trace()
        );
    }

    /// Sends SIGTERM and returns at once: uvicorn's graceful shutdown begins.
    pub fn sigterm(&self) {
        sigterm(&self.child.as_ref().expect("a running server").0);
    }

    /// Kills the process (SIGKILL) and waits for its exit: a container stopped past its grace
    /// period, or a server whose graceful shutdown would wait for a stream that never ends.
    pub async fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.0.kill();
        }
        self.wait_exit().await;
    }

    /// Waits (at most [`LIMIT`]) for the process to exit (after [`PyServer::sigterm`], or a
    /// death [`PyServer::die_at_next`] asked for).
    pub async fn wait_exit(&mut self) {
        let mut child = self.child.take().expect("a running server");
        // A blocking wait on its own thread: the exit itself is awaited, nothing polled.
        let exited =
            tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(move || child.0.wait())).await;
        if let Some(rx) = self.lines.take() {
            self.seen.extend(rx.try_iter());
        }
        assert!(
            matches!(exited, Ok(Ok(Ok(_)))),
            "the Python SDK server did not exit within {LIMIT:?}: {exited:?}"
        );
    }

    /// The server kills itself (SIGKILL) the instant it gets the next call of `kind` (a tool's
    /// name, or `read` for a resource), before that call runs; [`PyServer::wait_exit`] then sees
    /// it go.
    pub fn die_at_next(&self, kind: &str) {
        let die_file = format!("{}.die", self.ledger.display());
        std::fs::write(&die_file, kind).unwrap_or_else(|e| panic!("write {die_file}: {e}"));
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The ledger once `ok` holds of it (the server writes it from its own process: read again
    /// until it does, for at most 10 s).
    pub async fn ledger_until(&self, ok: impl Fn(&[Ran]) -> bool) -> Vec<Ran> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let ledger = self.ledger();
            if ok(&ledger) || std::time::Instant::now() >= deadline {
                return ledger;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Every tool execution so far, across processes, in order.
    pub fn ledger(&self) -> Vec<Ran> {
        let text = match std::fs::read_to_string(&self.ledger) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => panic!("read {}: {e}", self.ledger.display()),
        };
        text.lines()
            .map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let bad = || panic!("not a ledger line: {line:?}");
                let [tool, n, pid, at] = fields[..] else {
                    bad()
                };
                Ran {
                    tool: tool.to_owned(),
                    n: n.parse().unwrap_or_else(|_| bad()),
                    pid: pid.parse().unwrap_or_else(|_| bad()),
                    at: at.parse().unwrap_or_else(|_| bad()),
                }
            })
            .collect()
    }

    /// Everything every process of this server wrote to stderr so far.
    pub fn trace(&self) -> String {
        self.seen.join("\n")
    }
}

/// The Python SDK's client in `mode="auto"` (`tests/python/auto_client.py`), started against
/// `url`; its output lines come as it prints them.
pub struct AutoClient {
    child: Guard,
    lines: mpsc::Receiver<String>,
}

impl AutoClient {
    /// Starts the client: it connects, then makes `calls` calls of `lookup`.
    pub fn start(url: &str, calls: usize) -> AutoClient {
        let mut child = Guard(
            Command::new(require_python_sdk())
                .arg(repo_path("tests/python/auto_client.py"))
                .arg(url)
                .arg(calls.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the Python SDK client: {e}")),
        );
        let stdout = child.0.stdout.take().expect("piped stdout");
        AutoClient {
            lines: lines_of(stdout),
            child,
        }
    }

    /// Every line it printed, once its output ended and it exited (at most [`LIMIT`]).
    pub async fn output(self) -> Vec<String> {
        let AutoClient { mut child, lines } = self;
        // The reader thread's channel closes at the output's end: every line is in by then.
        let done = tokio::task::spawn_blocking(move || {
            let printed: Vec<String> = lines.iter().collect();
            (printed, child.0.wait())
        });
        match tokio::time::timeout(LIMIT, done).await {
            Ok(Ok((printed, Ok(_)))) => printed,
            other => panic!("the Python SDK client did not finish within {LIMIT:?}: {other:?}"),
        }
    }
}

/// A child's output, line by line as it prints them, from a thread of its own; the channel
/// closes when the output ends.
fn lines_of(output: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
