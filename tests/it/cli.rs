//! The real binary: help and version, `check-config`, exit codes, startup and SIGTERM.
//!
//! Every child runs with an empty environment plus what the test sets (a `HOLDFAST_*` variable
//! from the shell, or one that a concurrently running `Jail` test has set, would otherwise become
//! configuration) and in the crate directory (a jail may have moved this process's current
//! directory into a temporary one). Every wait is bounded; a child still running when its test
//! ends is killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// Generous: each step takes milliseconds; only a hang should reach this.
const PATIENCE: Duration = Duration::from_secs(20);

/// `holdfast ARGS` with an empty environment, run from the crate directory.
fn holdfast(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.args(args)
        .env_clear()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    cmd
}

/// What a finished run printed.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
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

/// Runs `cmd` to completion, killing it if it has not closed its output within [`PATIENCE`].
fn finish(mut cmd: Command) -> Finished {
    let mut child = Guard(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn holdfast"),
    );
    let stdout = read_all(child.0.stdout.take().unwrap());
    let stderr = read_all(child.0.stderr.take().unwrap());
    let deadline = Instant::now() + PATIENCE;
    let stdout = stdout
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("holdfast did not finish in time");
    let stderr = stderr
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("holdfast did not finish in time");
    // Both pipes are closed, so the process has exited (holdfast starts no children).
    let status = child.0.wait().expect("wait for holdfast");
    Finished {
        status,
        stdout,
        stderr,
    }
}

/// Kills the child when dropped, so a failing test leaves nothing running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A holdfast proxy running in the background, its stderr delivered line by line.
struct Running {
    child: Guard,
    lines: mpsc::Receiver<String>,
    /// Every stderr line so far, for failure messages.
    seen: Vec<String>,
}

impl Running {
    fn start(cmd: &mut Command) -> Running {
        let mut child = Guard(
            cmd.stdout(Stdio::null())
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

    /// The first stderr line containing `needle`, waiting at most [`PATIENCE`].
    fn wait_for_line(&mut self, needle: &str) -> String {
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
                    "holdfast exited ({:?}) before logging {needle:?}; stderr:\n{}",
                    self.child.0.wait(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Sends SIGTERM and waits (bounded) for the process to close stderr and exit.
    fn terminate(mut self) -> (ExitStatus, Vec<String>) {
        let pid = self.child.0.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "holdfast still running after SIGTERM; stderr:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
        let status = self.child.0.wait().expect("wait for holdfast");
        (status, std::mem::take(&mut self.seen))
    }
}

/// A file under Cargo's per-target temporary directory, unique to this test process.
fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

#[test]
fn help_lists_every_flag_and_the_subcommand() {
    let out = finish(holdfast(&["--help"]));
    assert!(out.status.success(), "{out:?}");
    for flag in [
        "--listen",
        "--upstream",
        "--admin",
        "--retry-after",
        "--log-format",
        "--access-log",
        "--config",
        "--version",
        "check-config",
    ] {
        assert!(
            out.stdout.contains(flag),
            "--help does not list {flag}: {out:?}"
        );
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = finish(holdfast(&["--version"]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        out.stdout.trim(),
        format!("holdfast {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_config_prints_the_effective_configuration() {
    let out = finish(holdfast(&["check-config", "--upstream", "http://x:1"]));
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains(r#"upstream = "http://x:1""#), "{out:?}");
    let printed: toml::Value = toml::from_str(&out.stdout).expect("check-config prints TOML");
    assert_eq!(printed["listen"].as_str(), Some("0.0.0.0:8080"));
    assert_eq!(
        printed["client"]["connect_timeout_secs"].as_float(),
        Some(2.0)
    );
    assert!(out.stderr.is_empty(), "nothing on stderr: {out:?}");
}

#[test]
fn check_config_output_loads_back_to_the_same_configuration() {
    let mut cmd = holdfast(&["check-config", "--listen", "127.0.0.1:7001"]);
    cmd.env("HOLDFAST_UPSTREAM", "http://b:8000/api/")
        .env("HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS", "0.5")
        .env("HOLDFAST_ROUTES__PRESETS", r#"["envoy-404"]"#);
    let first = finish(cmd);
    assert!(first.status.success(), "{first:?}");

    let path = temp_file("roundtrip.toml", &first.stdout);
    let again = finish(holdfast(&[
        "check-config",
        "--config",
        path.to_str().unwrap(),
    ]));
    assert!(again.status.success(), "{again:?}");
    assert_eq!(again.stdout, first.stdout);
}

#[test]
fn check_config_layers_flags_over_env_over_file() {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/config/holdfast.toml");
    let mut cmd = holdfast(&["check-config", "--admin", "127.0.0.1:7003"]);
    cmd.env("HOLDFAST_CONFIG", sample)
        .env("HOLDFAST_ADMIN", "127.0.0.1:7002")
        .env("HOLDFAST_LISTEN", "127.0.0.1:7001");
    let out = finish(cmd);
    assert!(out.status.success(), "{out:?}");
    let printed: toml::Value = toml::from_str(&out.stdout).unwrap();
    assert_eq!(
        printed["upstream"].as_str(),
        Some("http://mcp-backend:8000")
    );
    assert_eq!(printed["listen"].as_str(), Some("127.0.0.1:7001"));
    assert_eq!(printed["admin"].as_str(), Some("127.0.0.1:7003"));
}

#[test]
fn check_config_without_upstream_fails_naming_it() {
    let out = finish(holdfast(&["check-config"]));
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stderr.contains("upstream"), "{out:?}");
    assert!(out.stdout.is_empty(), "no configuration printed: {out:?}");
}

#[test]
fn check_config_names_a_bad_env_var_key_and_the_environment() {
    let mut cmd = holdfast(&["check-config", "--upstream", "http://x:1"]);
    cmd.env("HOLDFAST_RETRY_AFTER_SECS", "abc");
    let out = finish(cmd);
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stderr.contains("retry_after_secs"), "{out:?}");
    assert!(out.stderr.contains("environment"), "{out:?}");
}

#[test]
fn check_config_names_a_missing_config_file() {
    let out = finish(holdfast(&[
        "check-config",
        "--upstream",
        "http://x:1",
        "--config",
        "/nonexistent/holdfast.toml",
    ]));
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stderr.contains("/nonexistent/holdfast.toml"), "{out:?}");
}

#[test]
fn invalid_configuration_exits_2_listing_every_problem() {
    let mut cmd = holdfast(&["--listen", "nowhere", "--retry-after", "0"]);
    cmd.env("HOLDFAST_UPSTREAM", "ftp://b:8443");
    let out = finish(cmd);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.starts_with("invalid configuration:"), "{out:?}");
    for fragment in [
        "listen (from command-line flag)",
        "retry_after_secs (from command-line flag)",
        "upstream (from environment",
        "ftp://",
    ] {
        assert!(out.stderr.contains(fragment), "no {fragment:?}: {out:?}");
    }
}

#[test]
fn a_port_already_in_use_fails_with_a_message_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = finish(holdfast(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--listen",
        &addr,
        "--admin",
        "127.0.0.1:0",
    ]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.contains(&format!("cannot listen on {addr}")),
        "{out:?}"
    );
}

#[test]
fn proxy_starts_and_exits_0_on_sigterm() {
    let mut proxy = Running::start(&mut holdfast(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]));
    proxy.wait_for_line("holdfast proxying");
    let (status, stderr) = proxy.terminate();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", stderr.join("\n"));
    assert!(
        stderr.iter().any(|l| l.contains("holdfast stopped")),
        "stderr:\n{}",
        stderr.join("\n")
    );
}

#[test]
fn proxy_answers_503_while_the_upstream_refuses_then_drains_on_sigterm() {
    // Holding off (through a nested environment key), so the 503 comes at once.
    let mut proxy = Running::start(
        holdfast(&[
            "--upstream",
            "http://127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--retry-after",
            "3",
        ])
        .env("HOLDFAST_HOLD__ENABLED", "false"),
    );
    let line = proxy.wait_for_line("holdfast proxying");
    let event: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let listen: SocketAddr = event["listen"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no listen address in {line}"));
    assert_eq!(event["upstream"], "http://127.0.0.1:1");

    // Nothing listens on port 1: connection refused, so the backend is "missing".
    let mut conn = TcpStream::connect(listen).expect("connect to holdfast");
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    conn.write_all(b"GET /mcp HTTP/1.1\r\nHost: holdfast\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response)
        .expect("read the response");
    let head = response.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 503"), "{response}");
    assert!(head.contains("\r\nretry-after: 3\r\n"), "{response}");

    let (status, stderr) = proxy.terminate();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", stderr.join("\n"));
}
