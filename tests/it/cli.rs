//! The real binary: help and version, exit codes, startup and SIGTERM (`check-config` and the
//! configuration's problems: `cli_config.rs`).
//!
//! Every child runs with an empty environment plus what the test sets (a `HOLDFAST_*` variable
//! from the shell, or one that a concurrently running `Jail` test has set, would otherwise become
//! configuration) and in the crate directory (a jail may have moved this process's current
//! directory into a temporary one). Every wait is bounded; a child still running when its test
//! ends is killed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use crate::support::http::Reserved;
use crate::support::process::{self, holdfast, serving, Finished, Running, PATIENCE};

/// Runs `cmd` to completion, killing it if it has not closed its output within [`PATIENCE`].
pub(crate) fn finish(cmd: std::process::Command) -> Finished {
    process::finish(cmd, "holdfast")
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
fn log_level_decides_when_said_and_rust_log_only_over_the_default() {
    // Refuses connections, and stays ours while the test runs.
    let port = Reserved::new();
    let refusing = port.url();
    // Only what --log-level lets through: the start-up warning, not the info line before it.
    let lines = logged_until(
        serving(&refusing, &["--log-level", "warn"]),
        "the upstream cannot be reached now",
    );
    assert!(
        !lines.iter().any(|l| l.contains("holdfast proxying")),
        "{lines:?}"
    );

    // RUST_LOG only where log_level is said nowhere.
    let mut cmd = serving(&refusing, &[]);
    cmd.env("RUST_LOG", "warn");
    let lines = logged_until(cmd, "the upstream cannot be reached now");
    assert!(
        !lines.iter().any(|l| l.contains("holdfast proxying")),
        "{lines:?}"
    );
    // Said (issue 30: a unit that sets RUST_LOG made the file's log_level do nothing), it
    // decides, and says so.
    for (flag, env) in [(Some("info"), None), (None, Some("info"))] {
        let mut cmd = serving(&refusing, &flag.map_or(vec![], |f| vec!["--log-level", f]));
        cmd.env("RUST_LOG", "warn");
        if let Some(level) = env {
            cmd.env("HOLDFAST_LOG_LEVEL", level);
        }
        let lines = logged_until(cmd, "holdfast proxying");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("log_level, which is configured, decides")),
            "{lines:?}"
        );
    }

    // A RUST_LOG that does not parse is said, and the default filter applies.
    let mut cmd = serving(&refusing, &[]);
    cmd.env("RUST_LOG", "holdfast=[");
    let lines = logged_until(cmd, "holdfast proxying");
    let warning = lines
        .iter()
        .find(|l| l.contains("RUST_LOG does not parse"))
        .unwrap_or_else(|| panic!("no warning: {lines:?}"));
    assert!(warning.contains("holdfast=["), "{warning}");

    // A bad --log-level is a configuration error, named.
    let out = finish(holdfast(&[
        "check-config",
        "--upstream",
        "http://x:1",
        "--log-level",
        "holdfast=[",
    ]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("log_level (from command-line flag)"),
        "{out:?}"
    );
}

/// Every stderr line of `cmd` until one contains `needle`; then it is stopped.
fn logged_until(mut cmd: std::process::Command, needle: &str) -> Vec<String> {
    let mut proxy = Running::start(&mut cmd);
    proxy.wait_for_line(needle);
    let (_, lines) = proxy.terminate();
    lines
}

#[test]
fn completions_and_the_man_page_come_from_the_cli_definition() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef holdfast"),
        ("fish", "complete -c holdfast"),
    ] {
        let out = finish(holdfast(&["completions", shell]));
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        assert!(out.stdout.contains(marker), "{shell}: {}", out.stdout);
        // fish names long options without their dashes (`-l upstream`).
        for word in ["upstream", "check-config", "pause"] {
            assert!(out.stdout.contains(word), "{shell} lacks {word}");
        }
    }
    let out = finish(holdfast(&["man"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        out.stdout.starts_with(".ie") || out.stdout.contains(".TH holdfast"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("check\\-config"), "{}", out.stdout);
    let out = finish(holdfast(&["completions", "tcsh"]));
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error: {out:?}"
    );
}

#[test]
fn flags_belong_to_the_commands_that_use_them() {
    // Before a subcommand the proxy's flags would configure nothing: an error, not ignored.
    let out = finish(holdfast(&["--upstream", "http://x:1", "demo"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr
            .contains("'demo' cannot be used with '--upstream"),
        "{out:?}"
    );
    let out = finish(holdfast(&["demo", "--access-log"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("'--access-log'"), "{out:?}");
    // Each subcommand's help shows the flags it takes, and only those.
    let help = |command: &str| {
        let out = finish(holdfast(&[command, "--help"]));
        assert!(out.status.success(), "{command}: {out:?}");
        out.stdout
    };
    for command in ["demo", "completions", "man"] {
        let text = help(command);
        for flag in ["--upstream", "--listen", "--config", "--tls-cert"] {
            assert!(
                !text.contains(flag),
                "{command} --help lists {flag}:\n{text}"
            );
        }
    }
    for command in ["healthcheck", "pause", "resume"] {
        let text = help(command);
        assert!(
            text.contains("--admin") && text.contains("--config"),
            "{command}:\n{text}"
        );
        for flag in ["--upstream", "--listen", "--tls-cert", "--access-log"] {
            assert!(
                !text.contains(flag),
                "{command} --help lists {flag}:\n{text}"
            );
        }
    }
    let text = help("check-config");
    for flag in [
        "--upstream",
        "--listen",
        "--admin",
        "--tls-cert",
        "--log-level",
    ] {
        assert!(
            text.contains(flag),
            "check-config --help lacks {flag}:\n{text}"
        );
    }
}

#[test]
fn help_names_each_flags_environment_variable() {
    let out = finish(holdfast(&["--help"]));
    for var in [
        "HOLDFAST_CONFIG",
        "HOLDFAST_LISTEN",
        "HOLDFAST_UPSTREAM",
        "HOLDFAST_ADMIN",
        "HOLDFAST_RETRY_AFTER_SECS",
        "HOLDFAST_LOG_FORMAT",
        "HOLDFAST_LOG_LEVEL",
        "HOLDFAST_ACCESS_LOG",
        "HOLDFAST_TLS__CERT",
        "HOLDFAST_TLS__KEY",
    ] {
        assert!(
            out.stdout.contains(&format!("[env: {var}]")),
            "{var}:\n{}",
            out.stdout
        );
    }
}

#[test]
fn a_port_already_in_use_fails_with_a_message_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // Refuses connections, and stays ours while the test runs.
    let port = Reserved::new();
    let refusing = port.url();
    let out = finish(holdfast(&[
        "--upstream",
        &refusing,
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
    // The operating system's reason is kept as the cause.
    assert!(out.stderr.contains("in use"), "{out:?}");
}

#[test]
fn proxy_starts_and_exits_0_on_sigterm() {
    // Refuses connections, and stays ours while the test runs.
    let port = Reserved::new();
    let refusing = port.url();
    let mut proxy = Running::start(&mut holdfast(&[
        "--upstream",
        &refusing,
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
    let refusing = Reserved::new();
    let mut proxy = Running::start(
        serving(&refusing.url(), &["--retry-after", "3"]).env("HOLDFAST_HOLD__ENABLED", "false"),
    );
    let line = proxy.wait_for_line("holdfast proxying");
    let event: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let listen: SocketAddr = event["listen"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no listen address in {line}"));
    assert_eq!(event["upstream"], refusing.url());

    // Nothing listens on the reserved port: connection refused, so the backend is "missing".
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

/// holdfast under `prlimit --nofile=SOFT:HARD` with `limits.max_connections`, logging JSON,
/// until it is up; its stderr lines as JSON.
fn start_with_open_file_limit(
    soft: u64,
    hard: u64,
    max_connections: u64,
) -> Vec<serde_json::Value> {
    let prlimit = process::require_program("prlimit", "util-linux");
    // The serving command, run under prlimit.
    // Refuses connections, and stays ours while the test runs.
    let port = Reserved::new();
    let refusing = port.url();
    let inner = serving(&refusing, &[]);
    let mut cmd = std::process::Command::new(prlimit);
    cmd.arg(format!("--nofile={soft}:{hard}"))
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .env(
            "HOLDFAST_LIMITS__MAX_CONNECTIONS",
            max_connections.to_string(),
        )
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let mut running = Running::start(&mut cmd);
    running.wait_for_line("holdfast proxying");
    let (status, lines) = running.terminate();
    assert!(status.success(), "{status:?}: {lines:?}");
    lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn line_with<'a>(lines: &'a [serde_json::Value], message: &str) -> Option<&'a serde_json::Value> {
    lines
        .iter()
        .find(|l| l["message"].as_str().is_some_and(|m| m.contains(message)))
}

#[test]
fn the_open_file_limit_is_raised_to_the_hard_limit_and_a_low_one_is_named() {
    // Soft below hard: raised to the hard limit, which covers 1000 connections (2 x 1000 + 64).
    let lines = start_with_open_file_limit(256, 4096, 1000);
    let raised = line_with(&lines, "raised the open-file limit")
        .unwrap_or_else(|| panic!("no line about the limit: {lines:?}"));
    assert_eq!(raised["from"], 256);
    assert_eq!(raised["to"], 4096);
    assert!(
        line_with(&lines, "below what limits.max_connections").is_none(),
        "{lines:?}"
    );

    // A hard limit too low for 10 000 connections: nothing to raise, and a warning naming both.
    let lines = start_with_open_file_limit(1024, 1024, 10_000);
    assert!(
        line_with(&lines, "raised the open-file limit").is_none(),
        "{lines:?}"
    );
    let low = line_with(&lines, "below what limits.max_connections")
        .unwrap_or_else(|| panic!("no warning: {lines:?}"));
    assert_eq!(low["level"], "WARN");
    assert_eq!(low["limit"], 1024);
    assert_eq!(low["needed"], 20_064);
}

/// One exit-status table for every command: docs/operations.md's is the manual page's, and the codes
/// in it are the ones the commands use.
#[test]
fn the_exit_status_table_is_the_manual_pages_and_the_codes_are_real() {
    use holdfast::admin::client::{EXIT_CALLS_IN_FLIGHT, EXIT_STREAMS_ONLY};
    use holdfast::cli::EXIT_STATUSES;
    use holdfast::probe::verdict::Kind;

    let readme = crate::support::files::read_repo("docs/operations.md");
    for (command, status, meaning) in EXIT_STATUSES {
        let command = if *command == "any command" {
            (*command).to_owned()
        } else {
            format!("`{command}`")
        };
        let row = format!("| {command} | {status} | {meaning} |");
        assert!(
            readme.contains(&row),
            "docs/operations.md lacks the row {row}"
        );
    }
    let has = |command: &str, status: u8| {
        EXIT_STATUSES
            .iter()
            .any(|(c, s, _)| *c == command && *s == status.to_string())
    };
    assert!(has("pause", EXIT_STREAMS_ONLY) && has("pause", EXIT_CALLS_IN_FLIGHT));
    for kind in [
        Kind::McpServer,
        Kind::LegacyServer,
        Kind::NotMcp,
        Kind::Outage,
    ] {
        assert!(has("probe", kind.exit_code()), "{kind:?}");
    }

    let out = finish(holdfast(&["man"]));
    for section in [".SH \"EXIT STATUS\"", ".SH ENVIRONMENT", ".SH FILES"] {
        assert!(
            out.stdout.contains(section),
            "the manual page lacks {section}"
        );
    }
    assert!(out.stdout.contains("\\fBpause\\fR 4"), "{}", out.stdout);
}
