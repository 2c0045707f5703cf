//! Configuration values that passed validation and then did something else than the operator
//! meant (issue 43, "operators' traps"): each is refused or warned of at `check-config`, naming
//! the key.

use holdfast::config::{self, Config, ConfigError, RawConfig};

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
