//! Helpers of the configuration tests (`config_*.rs`): load through figment's layers or validate
//! a raw configuration without them, and find the problems reported.

use std::path::Path;

use holdfast::config::{self, Config, ConfigError, Problem, RawConfig, RawFlags};

/// Built-in presets on by default (mirrors `config::defaults::PRESETS`, checked in
/// `config_sample.rs`).
pub const DEFAULT_PRESETS: usize = 9;

/// `config::load` with a relative (in-jail) or absolute path.
pub fn load(file: Option<&str>, flags: &RawFlags) -> Result<Config, ConfigError> {
    config::load(file.map(Path::new), flags)
}

pub fn loaded(file: Option<&str>, flags: &RawFlags) -> Config {
    load(file, flags).unwrap_or_else(|e| panic!("expected a valid configuration, got {e}"))
}

pub fn load_err(file: Option<&str>, flags: &RawFlags) -> ConfigError {
    match load(file, flags) {
        Ok(c) => panic!("expected an invalid configuration, got {c:?}"),
        Err(e) => e,
    }
}

/// The problem reported for `key`, or a panic listing every problem.
pub fn problem<'e>(err: &'e ConfigError, key: &str) -> &'e Problem {
    err.problems
        .iter()
        .find(|p| p.key == key)
        .unwrap_or_else(|| panic!("no problem reported for `{key}`; got {err}"))
}

/// Asserts a problem for `key` whose origin and message contain the given fragments.
pub fn assert_problem(err: &ConfigError, key: &str, origin: &str, message: &str) {
    let p = problem(err, key);
    assert!(
        p.origin.contains(origin),
        "origin of `{key}` should mention {origin:?}: {p}"
    );
    assert!(
        p.message.contains(message),
        "message for `{key}` should mention {message:?}: {p}"
    );
    assert!(
        err.to_string().contains(&p.to_string()),
        "the error's Display lists the problem: {err}"
    );
}

pub fn upstream_flag(upstream: &str) -> RawFlags {
    RawFlags {
        upstream: Some(upstream.into()),
        ..RawFlags::default()
    }
}

/// Validates `raw` without figment: for rules that do not depend on layers.
pub fn validate(raw: &RawConfig) -> Result<Config, ConfigError> {
    Config::from_raw(raw, &|_| "test".into())
}

pub fn raw_with_upstream(upstream: &str) -> RawConfig {
    RawConfig {
        upstream: upstream.into(),
        ..RawConfig::default()
    }
}
