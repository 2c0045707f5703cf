//! Child processes, every wait bounded: the real holdfast binary and the tools the deployment
//! tests run. A child still running when its test ends is killed.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// Generous: every command here takes well under a second; only a hang should reach this.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `holdfast ARGS` with an empty environment, run from the crate directory, stdin closed.
///
/// Only what the test sets reaches the child, as in a container: a `HOLDFAST_*` variable from
/// the shell, or one that a concurrently running `Jail` test has set, would otherwise become
/// configuration. The directory is explicit because a jail may have moved this process's
/// current directory into a temporary one.
pub fn holdfast(args: &[&str]) -> Command {
    holdfast_at(env!("CARGO_BIN_EXE_holdfast").as_ref(), args)
}

/// [`holdfast`] with another build of the binary (the release one: [`release_binary`]).
pub fn holdfast_at(binary: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .env_clear()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    cmd
}

/// `holdfast` proxying to `upstream` on free ports with JSON logs (what the tests that read its
/// log lines start), then `extra` arguments.
pub fn serving(upstream: &str, extra: &[&str]) -> Command {
    serving_at(env!("CARGO_BIN_EXE_holdfast").as_ref(), upstream, extra)
}

/// [`serving`] with another build of the binary.
pub fn serving_at(binary: &std::path::Path, upstream: &str, extra: &[&str]) -> Command {
    let mut cmd = holdfast_at(
        binary,
        &[
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
    );
    cmd.args(extra);
    cmd
}

/// The release binary as `.ci/run` builds it (`target/TRIPLE/release/holdfast`, or
/// `target/release/holdfast`), for the tests that measure what ships: the newest of them, and
/// never one older than the sources (a stale build would measure old code).
pub fn release_binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let binary = [
        root.join("target").join(&triple).join("release/holdfast"),
        root.join("target/release/holdfast"),
    ]
    .into_iter()
    .filter_map(|p| Some((modified(&p)?, p)))
    .max()
    .map(|(_, p)| p)
    .unwrap_or_else(|| {
        panic!("no release binary: build it first (`cargo build --release`; .ci/run does)")
    });
    let built = modified(&binary).unwrap();
    let newest_source = std::fs::read_dir(root.join("src"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|e| {
            let path = e.path();
            if path.is_dir() {
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .collect()
            } else {
                vec![path]
            }
        })
        .filter_map(|p| modified(&p))
        .max()
        .unwrap();
    assert!(
        built >= newest_source,
        "{} is older than the sources: rebuild it (`cargo build --release`)",
        binary.display()
    );
    binary
}

/// Sends SIGTERM (what `docker stop` and systemd send) to `child`.
pub fn sigterm(child: &Child) {
    signal(child.id(), "TERM");
}

/// Sends signal `name` (`TERM`, `INT`) to process `pid`.
pub fn signal(pid: u32, name: &str) {
    let pid = pid.to_string();
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{name} {pid} failed");
}

/// What a finished command printed.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Debug for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Reads a whole pipe on a thread, delivering it when the pipe closes.
fn read_all(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    rx
}

/// Runs `cmd` to completion (killed if it has not closed its output within [`PATIENCE`]).
/// `what` names the program in the panic when it cannot be started at all or does not finish.
pub fn finish(mut cmd: Command, what: &str) -> Finished {
    let mut child = Guard(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what} ({e}); .ci/run installs it")),
    );
    let stdout = read_all(child.0.stdout.take().unwrap());
    let stderr = read_all(child.0.stderr.take().unwrap());
    let deadline = Instant::now() + PATIENCE;
    let stdout = stdout
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .unwrap_or_else(|_| panic!("{what} did not finish in time"));
    let stderr = stderr
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .unwrap_or_else(|_| panic!("{what} did not finish in time"));
    // Both pipes are closed, so the process has exited or is exiting (holdfast starts no
    // children): this wait is short.
    let status = child.0.wait().expect("wait for the child");
    Finished {
        status,
        stdout,
        stderr,
    }
}

/// Kills the child when dropped, so a failing test leaves nothing running.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A process running in the background (holdfast, as a container or systemd runs it), its
/// stderr delivered line by line.
pub struct Running {
    child: Guard,
    lines: mpsc::Receiver<String>,
    /// Every stderr line so far, for failure messages.
    seen: Vec<String>,
}

impl Running {
    /// Spawns `cmd` with stdin and stdout closed and stderr read on a thread.
    pub fn start(cmd: &mut Command) -> Running {
        let mut child = Guard(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn holdfast"),
        );
        let stderr = child.0.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for the start line (`holdfast proxying`, JSON logs as [`serving`] asks) and returns
    /// the proxy's and the admin listener's addresses from it.
    pub fn addresses(&mut self) -> (std::net::SocketAddr, std::net::SocketAddr) {
        let line = self.wait_for_line("holdfast proxying");
        let started: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the start line is not JSON ({e}): {line}"));
        let addr = |key: &str| {
            started[key]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {key} address in {line}"))
        };
        (addr("listen"), addr("admin"))
    }

    /// Every stderr line so far, without waiting.
    pub fn lines_so_far(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// The first stderr line containing `needle`, waiting at most [`PATIENCE`].
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {needle:?} on stderr in time; got:\n{}",
                        self.seen.join("\n")
                    )
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "the process exited ({:?}) before logging {needle:?}; stderr:\n{}",
                    self.child.0.wait(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Sends SIGTERM (what `docker stop` and systemd send) and waits (bounded) for the process
    /// to close stderr and exit; returns its status and every stderr line.
    pub fn terminate(self) -> (ExitStatus, Vec<String>) {
        sigterm(&self.child.0);
        self.wait_for_exit()
    }

    /// Waits (bounded) for the process, already told to stop, to close stderr and exit; returns
    /// its status and every stderr line.
    pub fn wait_for_exit(mut self) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "still running after it was told to stop; stderr:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
        let status = self.child.0.wait().expect("wait for the child");
        (status, std::mem::take(&mut self.seen))
    }
}

/// `name` on `PATH`, or in the standard and sbin directories (nginx lives in /usr/sbin, which a non-root
/// user's `PATH` often lacks).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    // The standard directories too, whatever PATH says: a config test's jail may have cleared
    // this process's environment for a moment while another test looks a program up.
    std::env::split_paths(&path)
        .chain(
            [
                "/usr/local/bin",
                "/usr/bin",
                "/bin",
                "/usr/sbin",
                "/sbin",
                "/usr/local/sbin",
            ]
            .map(PathBuf::from),
        )
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `name`, or a failure that says how to install it: these tests must not pass by not running.
pub fn require_program(name: &str, install: &str) -> PathBuf {
    find_program(name).unwrap_or_else(|| {
        panic!(
            "`{name}` is not installed, so this test cannot run. Install it with `{install}` \
             (.ci/run does this before `cargo test`)."
        )
    })
}
