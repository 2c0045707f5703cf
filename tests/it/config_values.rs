//! Configuration values that passed validation and then did something else than the operator
//! meant (issue 43, "operators' traps"): each is refused or warned of at `check-config`, naming
//! the key.

use std::time::Duration;

use holdfast::config::{self, Config, ConfigError, RawConfig, RawFlags};

use crate::support::jail::jailed;
use crate::support::process::{self, holdfast, Finished};

fn finish(cmd: std::process::Command) -> Finished {
    process::finish(cmd, "holdfast")
}

fn raw_with_upstream(upstream: &str) -> RawConfig {
    RawConfig {
        upstream: upstream.into(),
        ..RawConfig::default()
    }
}

/// Validates `raw` without figment, every origin "test".
fn validate(raw: &RawConfig) -> Result<Config, ConfigError> {
    Config::from_raw(raw, &|_| "test".into())
}

/// The one problem reported, for `key`.
fn only_problem(err: &ConfigError, key: &str) -> config::Problem {
    assert_eq!(err.problems.len(), 1, "one problem: {err}");
    let p = err.problems[0].clone();
    assert_eq!(p.key, key, "{err}");
    p
}

// --- log_level -------------------------------------------------------------------------------

/// `log_level = "verbose"` passed (tracing's filter reads a bare word as a target, so every log
/// line was silenced, a bind failure's included); now `check-config` exits 2 naming the key and
/// the level meant.
#[test]
fn a_mistyped_log_level_is_refused_with_the_level_meant() {
    let out = finish(holdfast(&[
        "check-config",
        "--upstream",
        "http://x:1",
        "--log-level",
        "verbose",
    ]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    for says in [
        "log_level (from command-line flag)",
        "`verbose` is not a level; did you mean `debug`?",
        "trace, debug, info, warn, error, off",
    ] {
        assert!(out.stderr.contains(says), "no {says:?}: {out:?}");
    }

    for (level, says) in [
        ("warning", "did you mean `warn`?"),
        ("holdfast=verbose,info", "`verbose` in `holdfast=verbose`"),
        ("info,holdfast", "`holdfast=trace`"),
    ] {
        let mut raw = raw_with_upstream("http://b:1");
        raw.log_level = level.into();
        let p = only_problem(&validate(&raw).unwrap_err(), "log_level");
        assert!(p.message.contains(says), "{level}: {p}");
    }
    // What users write, filters included, still passes.
    for level in [
        "debug",
        "WARN",
        "off",
        "holdfast=debug,info",
        "warn,holdfast::access=info",
    ] {
        let mut raw = raw_with_upstream("http://b:1");
        raw.log_level = level.into();
        let c = validate(&raw).unwrap_or_else(|e| panic!("{level}: {e}"));
        assert_eq!(c.log_level, level);
    }
}

// --- upstream's path -------------------------------------------------------------------------

/// `upstream = "http://host:8000/mcp"` (the endpoint's full URL, as `holdfast probe` takes it)
/// passed, and the server received `/mcp/mcp`. An upstream path that ends in an endpoint is
/// refused, naming the base URL to give instead; a genuine prefix is kept.
#[test]
fn an_upstream_url_ending_in_the_endpoint_is_refused_naming_the_base() {
    for (url, base) in [
        ("http://b:8000/mcp", "`http://b:8000`"),
        ("http://b:8000/mcp/", "`http://b:8000`"),
        ("https://b/api/mcp", "`https://b/api`"),
    ] {
        let p = only_problem(&validate(&raw_with_upstream(url)).unwrap_err(), "upstream");
        for says in [
            base,
            "`/mcp` would reach the server as",
            "holdfast probe` takes the endpoint's full URL",
        ] {
            assert!(p.message.contains(says), "{url}: no {says:?} in {p}");
        }
    }
    let p = only_problem(
        &validate(&raw_with_upstream("http://b:8000/mcp")).unwrap_err(),
        "upstream",
    );
    assert!(p.message.contains("as `/mcp/mcp`"), "{p}");

    // The endpoints are the configured ones; a path that is none of them is a prefix.
    let mut raw = raw_with_upstream("http://b:8000/rpc");
    raw.routes.endpoints = vec!["/mcp".into(), "/rpc/".into()];
    only_problem(&validate(&raw).unwrap_err(), "upstream");
    for url in [
        "http://b:8000/api",
        "http://b:8000/mcp-root",
        "http://b:8000/mcp/api",
    ] {
        let c = validate(&raw_with_upstream(url)).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(c.upstream.original, url);
    }

    let out = finish(holdfast(&[
        "check-config",
        "--upstream",
        "http://b:8000/mcp",
    ]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("upstream (from command-line flag)"),
        "{out:?}"
    );
}

// --- durations -------------------------------------------------------------------------------

/// `hold.timeout_secs = "20s"` was refused ("expected a number"): every `*_secs` and `*_ms` key
/// now takes a number in its unit or a duration with units, in the file, the environment and
/// the flags alike.
#[test]
fn durations_are_numbers_or_strings_with_units_in_every_layer() {
    jailed(|jail| {
        jail.create_file(
            "d.toml",
            r#"
            upstream = "http://b:1"
            [hold]
            timeout_secs = "20s"
            backoff_initial_ms = "50ms"
            backoff_max_ms = "1s"
            retry_after_max_secs = "1m"
            [client]
            response_timeout_secs = "1m30s"
            connect_timeout_secs = 0.5
            [sessions]
            idle_timeout_secs = "2h"
            [routes]
            learn_ttl_secs = "1d"
            "#,
        )?;
        jail.set_env("HOLDFAST_SHUTDOWN__DRAIN_TIMEOUT_SECS", "500ms");
        jail.set_env("HOLDFAST_STREAMS__IDLE_TIMEOUT_SECS", "45");
        let flags = RawFlags {
            retry_after_secs: Some(60),
            ..RawFlags::default()
        };
        let c = config::load(Some(std::path::Path::new("d.toml")), &flags)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.hold.timeout, Duration::from_secs(20));
        assert_eq!(c.hold.backoff_initial, Duration::from_millis(50));
        assert_eq!(c.hold.backoff_max, Duration::from_secs(1));
        assert_eq!(c.hold.retry_after_max, Duration::from_secs(60));
        assert_eq!(c.response_timeout, Duration::from_secs(90));
        assert_eq!(c.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.sessions.idle_timeout, Duration::from_secs(7200));
        assert_eq!(c.routes.learn_ttl, Duration::from_secs(86_400));
        assert_eq!(c.drain_timeout, Duration::from_millis(500));
        assert_eq!(c.stream_idle_timeout, Duration::from_secs(45));
        assert_eq!(c.retry_after, Duration::from_secs(60));

        // What is no duration, or not whole where the key takes whole units, names the key,
        // its origin and what it takes.
        jail.create_file(
            "bad.toml",
            r#"
            upstream = "http://b:1"
            retry_after_secs = "1500ms"
            [hold]
            timeout_secs = "20 seconds"
            backoff_max_ms = "0.5ms"
            "#,
        )?;
        let err =
            config::load(Some(std::path::Path::new("bad.toml")), &RawFlags::default()).unwrap_err();
        for (key, says) in [
            (
                "retry_after_secs",
                "a whole number of seconds or a duration",
            ),
            (
                "hold.timeout_secs",
                "a number of seconds or a duration such as \"20s\"",
            ),
            ("hold.backoff_max_ms", "a whole number of milliseconds"),
        ] {
            let p = err
                .problems
                .iter()
                .find(|p| p.key == key)
                .unwrap_or_else(|| panic!("no problem for {key}: {err}"));
            assert!(p.origin.contains("bad.toml"), "{p}");
            assert!(p.message.contains(says), "{p}");
        }
        assert_eq!(err.problems.len(), 3, "{err}");
        Ok(())
    });

    // The real binary: a flag and a variable, and the TOML it prints loads back (as numbers).
    let mut cmd = holdfast(&[
        "check-config",
        "--upstream",
        "http://b:1",
        "--retry-after",
        "5s",
    ]);
    cmd.env("HOLDFAST_HOLD__TIMEOUT_SECS", "1m30s");
    let out = finish(cmd);
    assert!(out.status.success(), "{out:?}");
    let printed: toml::Value = toml::from_str(&out.stdout).expect("TOML");
    assert_eq!(printed["retry_after_secs"].as_integer(), Some(5));
    assert_eq!(printed["hold"]["timeout_secs"].as_float(), Some(90.0));
    let out = finish(holdfast(&[
        "check-config",
        "--upstream",
        "http://b:1",
        "--retry-after",
        "5 s",
    ]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

// --- sessions.key_file's mode ----------------------------------------------------------------

/// A key file of mode 0666 was accepted although SECURITY.md asks for 0400: whoever may write
/// it chooses the key that seals session tokens. Group- or world-writable is refused; group- or
/// world-readable passes with a warning; readable by its owner alone, silently.
#[test]
fn a_key_file_others_may_write_is_refused_and_one_they_may_read_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::support::files::TempDir::new("key-mode");
    let key = dir.write(
        "session-keys",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
    );
    let check = |mode: u32| {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cmd = holdfast(&["check-config", "--upstream", "http://b:1"]);
        cmd.env("HOLDFAST_SESSIONS__KEY_FILE", &key);
        finish(cmd)
    };
    for mode in [0o666, 0o620, 0o602] {
        let out = check(mode);
        assert_eq!(out.status.code(), Some(2), "{mode:o}: {out:?}");
        for says in [
            "sessions.key_file (from environment variable HOLDFAST_SESSIONS__KEY_FILE)",
            &format!("has mode {mode:04o}"),
            "may write it",
            "chmod 0400",
        ] {
            assert!(out.stderr.contains(says), "{mode:o}: no {says:?}: {out:?}");
        }
    }
    for mode in [0o644, 0o440, 0o604] {
        let out = check(mode);
        assert!(out.status.success(), "{mode:o}: {out:?}");
        assert!(
            out.stderr.contains("warning: sessions.key_file:")
                && out.stderr.contains("may read the key"),
            "{mode:o}: {out:?}"
        );
    }
    for mode in [0o400, 0o600] {
        let out = check(mode);
        assert!(out.status.success(), "{mode:o}: {out:?}");
        assert!(out.stderr.is_empty(), "{mode:o}: {out:?}");
    }
}

// --- a mistyped variable ---------------------------------------------------------------------

/// `HOLDFAST_UPSTRAEM=...` is warned of as naming no key, and then "upstream: required" said
/// nothing of it. Now the error names the variable that was likely meant.
#[test]
fn a_missing_upstream_names_the_mistyped_variable_that_was_ignored() {
    let mut cmd = holdfast(&["check-config"]);
    cmd.env("HOLDFAST_UPSTRAEM", "http://b:8000")
        .env("HOLDFAST_IMAGE", "holdfast:latest");
    let out = finish(cmd);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("upstream: required"))
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        line.contains(
            "did you mean HOLDFAST_UPSTREAM (HOLDFAST_UPSTRAEM is set, and names no key)?"
        ),
        "{line}"
    );
    assert!(!line.contains("HOLDFAST_IMAGE"), "{line}");

    // Without a near miss, the message is as before.
    let mut cmd = holdfast(&["check-config"]);
    cmd.env("HOLDFAST_IMAGE", "holdfast:latest");
    let out = finish(cmd);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!out.stderr.contains("did you mean"), "{out:?}");
}
