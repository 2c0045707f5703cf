//! A child process that speaks one JSON object per line on stdout and traces on stderr: the
//! shape of every MCP peer script in `tests/node` and `tests/python`.
//!
//! A thread per pipe collects the lines into a `watch` channel, so an async test awaits a line
//! (with a bound) instead of blocking the runtime or sleeping. The child is killed when its
//! handle drops.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;

use serde_json::Value;
use tokio::sync::watch;

use super::process::Guard;
use super::LIMIT;

/// Lines one pipe of a child printed so far; the sender is dropped when the pipe closes.
pub type Lines = watch::Receiver<Vec<String>>;

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

/// A running script: the child, its stdout as events and its stderr as a trace.
pub struct Script {
    /// The child; its stdin is the caller's to take.
    pub child: Guard,
    stdout: Lines,
    /// Its stderr, line by line.
    pub stderr: Lines,
    /// How many stdout lines the test has consumed.
    read: usize,
    /// Names the script in failure messages.
    name: String,
}

impl Script {
    /// Starts `program` with `args` in `cwd`, `env` added to the environment; `name` names it
    /// in failure messages.
    pub fn spawn(
        name: String,
        program: &Path,
        args: &[&str],
        (cwd, env): (&Path, &[(&str, &str)]),
        stdin: Stdio,
    ) -> Script {
        let mut child = Guard(
            Command::new(program)
                .args(args)
                .current_dir(cwd)
                .envs(env.iter().copied())
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
    pub async fn next_event(&mut self, what: &str) -> Value {
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
    pub async fn terminate(mut self) {
        super::process::sigterm(&self.child.0);
        self.wait_exit().await;
    }

    /// Waits, bounded, for the process to exit by itself.
    pub async fn wait_exit(&mut self) {
        closed(&mut self.stdout, &self.name).await;
        // stdout is closed, so the process has exited or is exiting: this wait is short.
        self.child.0.wait().expect("wait for the script");
    }

    /// Whether the process has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.0.try_wait().ok().flatten()
    }

    /// Everything the script wrote to stderr so far.
    pub fn trace(&self) -> String {
        self.stderr.borrow().join("\n")
    }
}
