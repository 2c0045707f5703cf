//! The official MCP Python SDK's client pinned to the 2026-07-28 revision
//! (`tests/python/modern_client.py`), a child process that runs a list of operations and prints
//! one line for each: the 2026 client of the era bridge's tests.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;

use super::files::repo_path;
use super::process::Guard;
use super::python::require_python_sdk;
use super::LIMIT;

/// A running pinned client.
pub struct ModernClient {
    child: Guard,
    stdin: Option<ChildStdin>,
    lines: Option<mpsc::Receiver<String>>,
    /// Every line read so far.
    seen: Vec<String>,
}

impl ModernClient {
    /// Starts the client on `url` with `ops` (`list`, `call:NAME:JSON`, `wait`).
    pub fn start(url: &str, ops: &[&str]) -> ModernClient {
        let mut child = Guard(
            Command::new(require_python_sdk())
                .arg(repo_path("tests/python/modern_client.py"))
                .arg(url)
                .args(ops)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the Python SDK client: {e}")),
        );
        let stdout = child.0.stdout.take().expect("piped stdout");
        let stdin = child.0.stdin.take();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ModernClient {
            child,
            stdin,
            lines: Some(rx),
            seen: Vec::new(),
        }
    }

    /// Reads lines until one equals `line` (at most [`LIMIT`]); fails with what it printed if
    /// its output ends first.
    pub async fn until(&mut self, line: &str) {
        loop {
            let rx = self.lines.take().expect("the output is open");
            let read = tokio::task::spawn_blocking(move || (rx.recv_timeout(LIMIT), rx));
            let (got, rx) = read.await.expect("the reader");
            self.lines = Some(rx);
            match got {
                Ok(got) if got == line => {
                    self.seen.push(got);
                    return;
                }
                Ok(got) => self.seen.push(got),
                Err(e) => panic!(
                    "no {line:?} from the client ({e}); it printed {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Lets a client stopped at `wait` go on.
    pub fn go_on(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin
            .write_all(b"go\n")
            .expect("the client reads its stdin");
        stdin.flush().expect("flushed");
    }

    /// Runs it to its `wait`, lets `meanwhile` happen there (a server's restart), then to its
    /// end: every line it printed.
    pub async fn across(mut self, meanwhile: impl std::future::Future<Output = ()>) -> Vec<String> {
        self.until("waiting").await;
        meanwhile.await;
        self.go_on();
        self.output().await
    }

    /// Every line it printed, once it exited (at most [`LIMIT`]).
    pub async fn output(mut self) -> Vec<String> {
        drop(self.stdin.take());
        let rx = self.lines.take().expect("the output is open");
        let mut child = self.child;
        let done = tokio::task::spawn_blocking(move || {
            let printed: Vec<String> = rx.iter().collect();
            (printed, child.0.wait())
        });
        match tokio::time::timeout(LIMIT, done).await {
            Ok(Ok((printed, Ok(_)))) => self.seen.into_iter().chain(printed).collect(),
            other => panic!("the Python SDK client did not finish within {LIMIT:?}: {other:?}"),
        }
    }
}
