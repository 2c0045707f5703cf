//! Configuration: the layers (defaults < file < environment < flags), validation that reports
//! every problem at once with its key and origin, and the sample `config/holdfast.toml`, which
//! must stay equal to the built-in defaults.
//!
//! Every test that reads the environment runs in figment's `Jail`: jails take one process-wide
//! lock, restore the variables they set, and switch the current directory to a fresh temporary
//! one, so files created there are named relatively and the sample file absolutely.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::CommandFactory;
use holdfast::cli::Cli;
use holdfast::config::{
    self, Config, ConfigError, HostHeader, LogFormat, Problem, RawConfig, RawFlags, RawHeaderMatch,
    RawSignature, RawTlsFlags,
};
use http::header::{HeaderMap, HeaderValue};
use http::StatusCode;

use crate::support::files::repo_path;
use crate::support::jail::jailed;

/// The upstream the sample file sets (every other value in it is a default).
const SAMPLE_UPSTREAM: &str = "http://mcp-backend:8000";

/// Built-in presets on by default (mirrors `config::defaults::PRESETS`, checked below).
const DEFAULT_PRESETS: usize = 9;

fn sample_path() -> PathBuf {
    repo_path("config/holdfast.toml")
}

fn sample_text() -> String {
    std::fs::read_to_string(sample_path()).expect("config/holdfast.toml is readable")
}

/// `config::load` with a relative (in-jail) or absolute path.
fn load(file: Option<&str>, flags: &RawFlags) -> Result<Config, ConfigError> {
    config::load(file.map(Path::new), flags)
}

fn loaded(file: Option<&str>, flags: &RawFlags) -> Config {
    load(file, flags).unwrap_or_else(|e| panic!("expected a valid configuration, got {e}"))
}

fn load_err(file: Option<&str>, flags: &RawFlags) -> ConfigError {
    match load(file, flags) {
        Ok(c) => panic!("expected an invalid configuration, got {c:?}"),
        Err(e) => e,
    }
}

/// The problem reported for `key`, or a panic listing every problem.
fn problem<'e>(err: &'e ConfigError, key: &str) -> &'e Problem {
    err.problems
        .iter()
        .find(|p| p.key == key)
        .unwrap_or_else(|| panic!("no problem reported for `{key}`; got {err}"))
}

/// Asserts a problem for `key` whose origin and message contain the given fragments.
fn assert_problem(err: &ConfigError, key: &str, origin: &str, message: &str) {
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

fn upstream_flag(upstream: &str) -> RawFlags {
    RawFlags {
        upstream: Some(upstream.into()),
        ..RawFlags::default()
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Validates `raw` without figment: for rules that do not depend on layers.
fn validate(raw: &RawConfig) -> Result<Config, ConfigError> {
    Config::from_raw(raw, &|_| "test".into())
}

fn raw_with_upstream(upstream: &str) -> RawConfig {
    RawConfig {
        upstream: upstream.into(),
        ..RawConfig::default()
    }
}

/// Dotted paths of every leaf (non-table value) in `value`.
fn leaf_keys(value: &toml::Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_keys(v, &key, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

fn default_leaf_keys() -> Vec<String> {
    let value = toml::Value::try_from(RawConfig::default()).expect("RawConfig serializes");
    let mut keys = Vec::new();
    leaf_keys(&value, "", &mut keys);
    keys
}

fn lookup<'v>(value: &'v toml::Value, dotted: &str) -> Option<&'v toml::Value> {
    dotted.split('.').try_fold(value, |v, k| v.get(k))
}

/// The sample file with its commented-out examples switched on: a line whose `#` is followed
/// directly by text (`#name = ...`, `#[[routes.signatures]]`) loses the `#`; explanations
/// (`# ...`) stay comments, and `## ...` inside an example becomes one.
fn sample_with_examples() -> String {
    sample_text()
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if !rest.is_empty() && !rest.starts_with(' ') => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// --- The sample file -------------------------------------------------------------------------

#[test]
fn sample_file_loads_and_equals_the_defaults() {
    jailed(|jail| {
        let sample = sample_path();
        let sample = sample.to_str().expect("UTF-8 path");
        let from_sample = loaded(Some(sample), &RawFlags::default());

        jail.create_file(
            "only-upstream.toml",
            &format!("upstream = {SAMPLE_UPSTREAM:?}\n"),
        )?;
        let only_upstream = Some(Path::new("only-upstream.toml"));

        // Key by key first, so a drift names the key and both values.
        let raw_sample: RawConfig =
            config::figment(Some(Path::new(sample)), &RawFlags::default()).extract()?;
        let raw_defaults: RawConfig =
            config::figment(only_upstream, &RawFlags::default()).extract()?;
        let (raw_sample, raw_defaults) = (
            toml::Value::try_from(&raw_sample).unwrap(),
            toml::Value::try_from(&raw_defaults).unwrap(),
        );
        let drift: Vec<String> = default_leaf_keys()
            .into_iter()
            .filter_map(|key| {
                let (in_file, default) = (lookup(&raw_sample, &key), lookup(&raw_defaults, &key));
                (in_file != default)
                    .then(|| format!("{key}: file {in_file:?}, default {default:?}"))
            })
            .collect();
        assert!(
            drift.is_empty(),
            "config/holdfast.toml differs from the built-in defaults:\n{}",
            drift.join("\n")
        );

        // Then the validated result, which is what the proxy runs with. (But that the file says
        // `log_level`, which then decides over RUST_LOG, where the defaults do not.)
        let mut from_sample = from_sample;
        assert!(from_sample.log_level_said && from_sample.log_level == "info");
        from_sample.log_level_said = false;
        let from_defaults = loaded(Some("only-upstream.toml"), &RawFlags::default());
        assert_eq!(
            format!("{from_sample:#?}"),
            format!("{from_defaults:#?}"),
            "config/holdfast.toml must only restate the defaults"
        );
        Ok(())
    });
}

#[test]
fn sample_file_sets_every_key_itself() {
    // Equal to the defaults is only meaningful if the file states each value rather than leaving
    // it to the default layer.
    jailed(|_| {
        let fig = config::figment(Some(&sample_path()), &RawFlags::default());
        for key in default_leaf_keys() {
            if key == "routes.signatures" {
                continue; // None by default; the file shows commented-out examples.
            }
            let md = fig
                .find_metadata(&key)
                .unwrap_or_else(|| panic!("no value for `{key}`"));
            assert_eq!(
                md.source,
                Some(figment::Source::File(sample_path())),
                "`{key}` should be set by config/holdfast.toml, not by the {} layer",
                md.name
            );
        }
        Ok(())
    });
}

#[test]
fn sample_file_mentions_every_key_its_env_var_and_its_flag() {
    let text = sample_text();
    let with_examples: toml::Value =
        toml::from_str(&sample_with_examples()).expect("the sample with examples is TOML");

    for key in default_leaf_keys() {
        let leaf = key.rsplit('.').next().unwrap();
        assert!(
            text.contains(leaf),
            "config/holdfast.toml never mentions `{leaf}`"
        );
        assert!(
            lookup(&with_examples, &key).is_some(),
            "config/holdfast.toml has no `{leaf}` under the right section for `{key}`"
        );
        if key != "routes.signatures" {
            let env = format!("HOLDFAST_{}", key.replace('.', "__").to_ascii_uppercase());
            assert!(
                text.contains(&env),
                "config/holdfast.toml never names {env}"
            );
        }
    }

    // Every key of a signature and of its header conditions appears in the examples.
    let full = RawSignature {
        name: "n".into(),
        status: 404,
        content_type: Some("c".into()),
        body: Some("b".into()),
        body_contains: Some("c".into()),
        headers: vec![RawHeaderMatch {
            name: "h".into(),
            value: Some("v".into()),
        }],
        replay_safe: Some(true),
    };
    let full = toml::Value::try_from(&full).unwrap();
    let examples = lookup(&with_examples, "routes.signatures")
        .and_then(toml::Value::as_array)
        .expect("commented-out [[routes.signatures]] examples");
    for key in full.as_table().unwrap().keys() {
        assert!(
            examples.iter().any(|s| s.get(key).is_some()),
            "no signature example shows `{key}`"
        );
    }
    let header_examples: Vec<&toml::Value> = examples
        .iter()
        .filter_map(|s| s.get("headers")?.as_array())
        .flatten()
        .collect();
    for key in ["name", "value"] {
        assert!(
            header_examples.iter().any(|h| h.get(key).is_some()),
            "no header example shows `{key}`"
        );
    }

    // Every configuration flag is named (`--config` in the introduction).
    for arg in Cli::command().get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(
                text.contains(&format!("--{long}")),
                "config/holdfast.toml never mentions --{long}"
            );
        }
    }
}

#[test]
fn sample_signature_examples_are_valid_and_match_what_they_describe() {
    jailed(|jail| {
        jail.create_file("examples.toml", &sample_with_examples())?;
        let config = loaded(Some("examples.toml"), &RawFlags::default());
        let signatures = &config.routes.signatures;
        assert_eq!(signatures.len(), DEFAULT_PRESETS + 2);
        let (gateway, haproxy) = (
            &signatures[DEFAULT_PRESETS],
            &signatures[DEFAULT_PRESETS + 1],
        );
        assert_eq!(gateway.name, "gateway-no-route");
        assert_eq!(haproxy.name, "haproxy-503");

        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("Application/JSON"));
        headers.insert("x-gateway", HeaderValue::from_static("1"));
        headers.insert("server", HeaderValue::from_static("edge"));
        let body = br#"{"error":"no route"}"#;
        assert!(gateway.matches(StatusCode::NOT_FOUND, &headers, Some(body)));
        headers.remove("x-gateway");
        assert!(!gateway.matches(StatusCode::NOT_FOUND, &headers, Some(body)));

        let page = b"<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n";
        assert!(haproxy.matches(
            StatusCode::SERVICE_UNAVAILABLE,
            &HeaderMap::new(),
            Some(page)
        ));
        assert!(
            gateway.replay_safe && haproxy.replay_safe,
            "as the examples say"
        );
        Ok(())
    });
}

#[test]
fn with_no_router_in_between_no_signature_applies() {
    let mut raw = raw_with_upstream("http://b:1");
    assert!(validate(&raw).unwrap().routes.behind_router, "the default");
    raw.routes.behind_router = Some(false);
    let c = validate(&raw).unwrap();
    assert!(!c.routes.behind_router);
    assert!(c.routes.signatures.is_empty(), "presets do not apply");
    raw.routes.signatures = vec![RawSignature {
        status: 404,
        body_contains: Some("no route".into()),
        ..RawSignature::default()
    }];
    let err = validate(&raw).unwrap_err();
    assert_problem(
        &err,
        "routes.signatures",
        "test",
        "routes.behind_router = false",
    );
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn a_user_5xx_signature_is_held_only_when_it_says_so() {
    let sig = |status, replay_safe| RawSignature {
        status,
        body_contains: Some("no server".into()),
        replay_safe,
        ..RawSignature::default()
    };
    let mut raw = raw_with_upstream("http://b:1");
    raw.routes.signatures = vec![
        sig(503, None),
        sig(503, Some(true)),
        sig(404, None),
        sig(404, Some(false)),
        sig(502, None),
    ];
    let c = validate(&raw).unwrap();
    let safe: Vec<bool> = c.routes.signatures[DEFAULT_PRESETS..]
        .iter()
        .map(|s| s.replay_safe)
        .collect();
    assert_eq!(safe, [false, true, true, false, false]);
}

#[test]
fn default_presets_are_the_documented_list() {
    let names: Vec<String> = RawConfig::default().routes.presets;
    assert_eq!(names.len(), DEFAULT_PRESETS);
    assert_eq!(names, config::defaults::PRESETS);
}

// --- Layers ----------------------------------------------------------------------------------

#[test]
fn file_overrides_defaults_env_overrides_file_flags_override_env() {
    jailed(|jail| {
        jail.create_file(
            "holdfast.toml",
            r#"
            listen = "127.0.0.1:1001"
            upstream = "http://from-file:1"
            retry_after_secs = 5
            "#,
        )?;
        let file = Some("holdfast.toml");

        let c = loaded(file, &RawFlags::default());
        assert_eq!(c.listen, "127.0.0.1:1001".parse().unwrap());
        assert_eq!(c.upstream.original, "http://from-file:1");
        assert_eq!(c.retry_after, Duration::from_secs(5));
        assert_eq!(c.admin, config::defaults::ADMIN.parse().unwrap());

        jail.set_env("HOLDFAST_LISTEN", "127.0.0.1:1002");
        let c = loaded(file, &RawFlags::default());
        assert_eq!(c.listen, "127.0.0.1:1002".parse().unwrap());
        assert_eq!(c.retry_after, Duration::from_secs(5), "file shows through");

        let flags = RawFlags {
            listen: Some("127.0.0.1:1003".into()),
            ..RawFlags::default()
        };
        let c = loaded(file, &flags);
        assert_eq!(c.listen, "127.0.0.1:1003".parse().unwrap());
        assert_eq!(
            c.upstream.original, "http://from-file:1",
            "file shows through"
        );
        assert_eq!(c.admin, config::defaults::ADMIN.parse().unwrap());
        Ok(())
    });
}

#[test]
fn every_flag_reaches_the_config() {
    jailed(|_| {
        let flags = RawFlags {
            listen: Some("127.0.0.1:2001".into()),
            upstream: Some("http://from-flag:2".into()),
            admin: Some("127.0.0.1:2002".into()),
            retry_after_secs: Some(9),
            log_format: Some("json".into()),
            log_level: Some("warn,holdfast::access=info".into()),
            access_log: Some(true),
            // --tls-cert and --tls-key need certificate files: tests/it/tls_config.rs.
            tls: RawTlsFlags::default(),
        };
        let c = loaded(None, &flags);
        assert_eq!(c.listen, "127.0.0.1:2001".parse().unwrap());
        assert_eq!(c.upstream.original, "http://from-flag:2");
        assert_eq!(c.admin, "127.0.0.1:2002".parse().unwrap());
        assert_eq!(c.retry_after, Duration::from_secs(9));
        assert_eq!(c.log_level, "warn,holdfast::access=info");
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(c.access_log);
        Ok(())
    });
}

#[test]
fn nested_env_var_sets_a_section_key_and_keeps_its_siblings() {
    jailed(|jail| {
        jail.create_file(
            "holdfast.toml",
            r#"
            upstream = "http://b:1"
            [client]
            response_timeout_secs = 60
            host_header = "upstream"
            "#,
        )?;
        // An integer is accepted for a seconds key (serde's f64 takes integers).
        jail.set_env("HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS", "5");
        let c = loaded(Some("holdfast.toml"), &RawFlags::default());
        assert_eq!(c.connect_timeout, secs(5.0));
        assert_eq!(
            c.response_timeout,
            secs(60.0),
            "the file's sibling key stays"
        );
        assert_eq!(c.host_header, HostHeader::Upstream);
        assert_eq!(
            c.pool_idle_timeout,
            secs(config::defaults::POOL_IDLE_TIMEOUT_SECS)
        );

        jail.set_env("HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS", "0.25");
        jail.set_env("HOLDFAST_STREAMS__IDLE_TIMEOUT_SECS", "7");
        jail.set_env("HOLDFAST_ROUTES__LEARN", "false");
        jail.set_env("HOLDFAST_ACCESS_LOG", "true");
        let c = loaded(Some("holdfast.toml"), &RawFlags::default());
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.stream_idle_timeout, secs(7.0));
        assert!(!c.routes.learn);
        assert!(c.access_log);
        Ok(())
    });
}

#[test]
fn holdfast_config_names_the_file_and_config_flag_wins_over_it() {
    jailed(|jail| {
        jail.create_file(
            "from-env.toml",
            "upstream = \"http://b:1\"\nlisten = \"127.0.0.1:3001\"\n",
        )?;
        jail.create_file(
            "from-flag.toml",
            "upstream = \"http://b:1\"\nadmin = \"127.0.0.1:3002\"\n",
        )?;
        jail.set_env("HOLDFAST_CONFIG", "from-env.toml");

        // HOLDFAST_CONFIG names the file; it is not read as a key `config`.
        let c = loaded(None, &RawFlags::default());
        assert_eq!(c.listen, "127.0.0.1:3001".parse().unwrap());

        // `--config` replaces HOLDFAST_CONFIG: only one file is read.
        let c = loaded(Some("from-flag.toml"), &RawFlags::default());
        assert_eq!(c.admin, "127.0.0.1:3002".parse().unwrap());
        assert_eq!(c.listen, config::defaults::LISTEN.parse().unwrap());

        // An error in the HOLDFAST_CONFIG file names that file.
        jail.create_file(
            "bad.toml",
            "upstream = \"http://b:1\"\nlisten = \"nowhere\"\n",
        )?;
        jail.set_env("HOLDFAST_CONFIG", "bad.toml");
        let err = load_err(None, &RawFlags::default());
        assert_problem(&err, "listen", "bad.toml", "nowhere");
        Ok(())
    });
}

#[test]
fn missing_config_file_is_an_error_naming_it() {
    jailed(|jail| {
        let err = load_err(Some("does-not-exist.toml"), &upstream_flag("http://b:1"));
        assert!(
            err.to_string().contains("does-not-exist.toml"),
            "the error names the missing file: {err}"
        );

        jail.set_env("HOLDFAST_CONFIG", "also-missing.toml");
        let err = load_err(None, &upstream_flag("http://b:1"));
        assert!(
            err.to_string().contains("also-missing.toml"),
            "the error names the missing file: {err}"
        );
        Ok(())
    });
}

#[test]
fn presets_can_be_emptied_or_chosen_from_file_and_env() {
    jailed(|jail| {
        // An array in a higher layer replaces the default list; it does not merge with it.
        jail.create_file(
            "none.toml",
            "upstream = \"http://b:1\"\n[routes]\npresets = []\n",
        )?;
        let c = loaded(Some("none.toml"), &RawFlags::default());
        assert!(c.routes.signatures.is_empty(), "{:?}", c.routes.signatures);

        jail.create_file(
            "some.toml",
            "upstream = \"http://b:1\"\n[routes]\npresets = [\"envoy-404\", \"traefik-404\"]\n",
        )?;
        let c = loaded(Some("some.toml"), &RawFlags::default());
        let names: Vec<&str> = c
            .routes
            .signatures
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["envoy-404", "traefik-404"], "order is kept");

        // The environment form documented in config/holdfast.toml.
        jail.set_env("HOLDFAST_ROUTES__PRESETS", r#"["traefik-404","nginx-404"]"#);
        let c = loaded(Some("none.toml"), &RawFlags::default());
        let names: Vec<&str> = c
            .routes
            .signatures
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["traefik-404", "nginx-404"]);

        jail.set_env("HOLDFAST_ROUTES__PRESETS", "[]");
        let c = loaded(None, &upstream_flag("http://b:1"));
        assert!(c.routes.signatures.is_empty(), "{:?}", c.routes.signatures);
        Ok(())
    });
}

// --- Problems, all at once -------------------------------------------------------------------

#[test]
fn every_validation_problem_is_reported_at_once_with_key_and_origin() {
    jailed(|jail| {
        jail.create_file(
            "bad.toml",
            r#"
            listen = "mcp.example:8080"
            upstream = "ftp://mcp-backend:8443"
            [client]
            connect_timeout_secs = -1
            [routes]
            presets = ["traefik-404", "traefik-405"]
            [[routes.signatures]]
            status = 200
            body = "oops"
            "#,
        )?;
        jail.set_env("HOLDFAST_ADMIN", "not-an-address");
        let flags = RawFlags {
            retry_after_secs: Some(0),
            ..RawFlags::default()
        };
        let err = load_err(Some("bad.toml"), &flags);

        assert_problem(&err, "listen", "bad.toml", "mcp.example:8080");
        assert_problem(&err, "upstream", "bad.toml", "ftp://");
        assert_problem(&err, "client.connect_timeout_secs", "bad.toml", "-1");
        assert_problem(&err, "routes.presets[1]", "bad.toml", "traefik-405");
        assert_problem(&err, "routes.signatures[0]", "bad.toml", "200");
        assert_problem(&err, "admin", "environment", "not-an-address");
        assert_problem(&err, "retry_after_secs", "command-line flag", "at least 1");
        assert_eq!(err.problems.len(), 7, "exactly these problems: {err}");
        Ok(())
    });
}

#[test]
fn missing_upstream_is_reported_with_other_problems() {
    jailed(|jail| {
        jail.set_env("HOLDFAST_LOG_FORMAT", "yaml");
        let flags = RawFlags {
            listen: Some("*:8080".into()),
            ..RawFlags::default()
        };
        let err = load_err(None, &flags);
        assert_problem(&err, "upstream", "not set", "required");
        assert_problem(&err, "log_format", "environment", "yaml");
        assert_problem(&err, "listen", "command-line flag", "*:8080");
        assert_eq!(err.problems.len(), 3, "exactly these problems: {err}");
        Ok(())
    });
}

#[test]
fn a_higher_layer_is_named_as_the_origin_of_a_value_it_overrides() {
    jailed(|jail| {
        jail.create_file(
            "f.toml",
            "upstream = \"http://b:1\"\nlisten = \"bad-in-file\"\n",
        )?;
        jail.set_env("HOLDFAST_LISTEN", "bad-in-env");
        let err = load_err(Some("f.toml"), &RawFlags::default());
        assert_problem(&err, "listen", "environment", "bad-in-env");
        Ok(())
    });
}

#[test]
fn env_value_of_the_wrong_type_names_the_key_and_the_environment() {
    jailed(|jail| {
        jail.set_env("HOLDFAST_RETRY_AFTER_SECS", "abc");
        let err = load_err(None, &upstream_flag("http://b:1"));
        assert_problem(&err, "retry_after_secs", "environment", "abc");

        jail.set_env("HOLDFAST_RETRY_AFTER_SECS", "2");
        jail.set_env("HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS", "soon");
        let err = load_err(None, &upstream_flag("http://b:1"));
        assert_problem(&err, "client.connect_timeout_secs", "environment", "soon");
        Ok(())
    });
}

#[test]
fn unknown_key_names_the_key_and_its_file() {
    jailed(|jail| {
        jail.create_file(
            "typo.toml",
            "upstream = \"http://b:1\"\nlissten = \"127.0.0.1:1\"\n",
        )?;
        let err = load_err(Some("typo.toml"), &RawFlags::default());
        assert_problem(&err, "lissten", "typo.toml", "unknown");

        jail.create_file(
            "nested-typo.toml",
            "upstream = \"http://b:1\"\n[client]\nconect_timeout_secs = 1\n",
        )?;
        let err = load_err(Some("nested-typo.toml"), &RawFlags::default());
        assert_problem(
            &err,
            "client.conect_timeout_secs",
            "nested-typo.toml",
            "unknown",
        );
        Ok(())
    });
}

#[test]
fn problems_are_said_in_the_files_words_with_the_nearest_key() {
    jailed(|jail| {
        jail.create_file(
            "words.toml",
            "upstream = \"http://b:1\"\n[hold]\ntimeout = 5\nmax_requests = \"many\"\n\
             enabled = \"yes\"\n[client]\nconect_timeout_secs = 1\n",
        )?;
        jail.set_env("HOLDFAST_RETRY_AFTER_SECS", "-1");
        let err = load_err(Some("words.toml"), &RawFlags::default());
        let said = |key: &str| problem(&err, key).message.clone();
        assert_eq!(
            said("hold.timeout"),
            "unknown key `timeout`; did you mean `timeout_secs`?"
        );
        assert_eq!(
            said("client.conect_timeout_secs"),
            "unknown key `conect_timeout_secs`; did you mean `connect_timeout_secs`?"
        );
        assert_eq!(
            said("hold.max_requests"),
            "expected a whole number (0 or more), got \"many\""
        );
        assert_eq!(said("hold.enabled"), "expected true or false, got \"yes\"");
        // A duration key says it takes units too.
        assert_eq!(
            said("retry_after_secs"),
            "expected a whole number of seconds or a duration such as \"20s\", \"1m30s\", got -1"
        );
        // No Rust type names, no nested backticks, anywhere.
        let all = err.to_string();
        for rust in ["usize", "u64", "f64", "``", "invalid type"] {
            assert!(!all.contains(rust), "{rust} in:\n{all}");
        }
        Ok(())
    });
    // A required key nobody set has no origin to name.
    jailed(|_| {
        let err = load_err(None, &RawFlags::default());
        let all = err.to_string();
        assert!(all.contains("  - upstream: required"), "{all}");
        assert!(!all.contains("from not set"), "{all}");
        Ok(())
    });
}

#[test]
fn unknown_keys_and_type_errors_are_reported_with_every_other_problem() {
    // A typo or a wrongly typed value must not hide the rest: the user fixes everything in one
    // round.
    jailed(|jail| {
        jail.create_file(
            "mixed.toml",
            r#"
            lissten = "127.0.0.1:1"
            upstream = "http://b:1"
            [client]
            connect_timeout_secs = -1
            [routes]
            presets = ["no-such-preset"]
            "#,
        )?;
        jail.set_env("HOLDFAST_RETRY_AFTER_SECS", "abc");
        let err = load_err(Some("mixed.toml"), &RawFlags::default());
        assert_problem(&err, "lissten", "mixed.toml", "unknown");
        assert_problem(&err, "retry_after_secs", "environment", "abc");
        assert_problem(&err, "client.connect_timeout_secs", "mixed.toml", "-1");
        assert_problem(&err, "routes.presets[0]", "mixed.toml", "no-such-preset");
        Ok(())
    });
}

// --- Validation rules ------------------------------------------------------------------------

#[test]
fn upstream_path_prefix_is_kept_without_its_trailing_slash() {
    for (url, authority, prefix) in [
        ("http://b:8000/api/", "b:8000", "/api"),
        ("http://b:8000/api", "b:8000", "/api"),
        ("http://b:8000/a/b//", "b:8000", "/a/b"),
        ("http://b:8000/", "b:8000", ""),
        ("http://b:8000", "b:8000", ""),
        ("http://mcp-backend", "mcp-backend", ""),
        ("http://10.0.0.7:80/mcp-root/", "10.0.0.7:80", "/mcp-root"),
    ] {
        let c = validate(&raw_with_upstream(url)).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(c.upstream.original, url);
        assert_eq!(c.upstream.authority.as_str(), authority, "{url}");
        assert_eq!(c.upstream.path_prefix, prefix, "{url}");
    }
}

#[test]
fn bad_upstreams_are_rejected_with_a_reason() {
    for (url, reason) in [
        ("", "required"),
        ("ftp://b:21", "http://"),
        ("b:8000", "http://"),
        ("/just/a/path", "http://"),
        ("http://user:secret@b:8000", "credentials"),
        ("http://b:8000/?debug=1", "query"),
        ("http://b :8000", "not a URL"),
    ] {
        let err = validate(&raw_with_upstream(url))
            .err()
            .unwrap_or_else(|| panic!("`{url}` should be rejected"));
        assert_eq!(err.problems.len(), 1, "{url}: {err}");
        let origin = if url.is_empty() { "not set" } else { "test" };
        assert_problem(&err, "upstream", origin, reason);
    }
}

#[test]
fn endpoints_lose_their_trailing_slash_and_must_be_absolute() {
    let mut raw = raw_with_upstream("http://b:1");
    raw.routes.endpoints = vec!["/mcp/".into(), "/".into(), "/a/b//".into(), "/sse".into()];
    let c = validate(&raw).unwrap();
    assert_eq!(c.routes.endpoints, ["/mcp", "/", "/a/b", "/sse"]);

    raw.routes.endpoints = vec!["/mcp".into(), "mcp".into()];
    let err = validate(&raw).unwrap_err();
    assert_problem(&err, "routes.endpoints[1]", "test", "must start with `/`");
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn retry_tool_names_are_checked_and_said_once() {
    let mut raw = raw_with_upstream("http://b:1");
    raw.retry.idempotent_tools = vec!["lookup".into()];
    raw.retry.never_tools = vec!["charge".into()];
    let c = validate(&raw).unwrap();
    assert_eq!(c.retry.idempotent_tools, ["lookup"]);
    assert_eq!(c.retry.never_tools, ["charge"]);
    assert!(c.retry.enabled && c.retry.learn_annotations);

    raw.retry.idempotent_tools = vec!["lookup".into(), String::new()];
    raw.retry.never_tools = vec!["lookup".into(), "x".repeat(129)];
    let err = validate(&raw).unwrap_err();
    assert_problem(
        &err,
        "retry.idempotent_tools[1]",
        "test",
        "1 to 128 characters",
    );
    assert_problem(&err, "retry.never_tools[1]", "test", "1 to 128 characters");
    assert_problem(
        &err,
        "retry.never_tools",
        "test",
        "\"lookup\" is also in retry.idempotent_tools",
    );
    assert_eq!(err.problems.len(), 3, "{err}");
}

#[test]
fn user_signatures_follow_the_presets_and_are_validated() {
    let sig = |status, body_contains: Option<&str>| RawSignature {
        status,
        body_contains: body_contains.map(Into::into),
        ..RawSignature::default()
    };
    let mut raw = raw_with_upstream("http://b:1");
    raw.routes.signatures = vec![sig(404, Some("no route"))];
    let c = validate(&raw).unwrap();
    assert_eq!(c.routes.signatures.len(), DEFAULT_PRESETS + 1);
    assert_eq!(c.routes.signatures[DEFAULT_PRESETS].name, "custom-404");

    raw.routes.signatures = vec![
        sig(404, None),                 // a bare status would catch every application 404
        sig(200, Some("x")),            // not a router status
        sig(99, Some("x")),             // not an HTTP status
        sig(503, Some(&"x".repeat(5))), // longer than max_peek_bytes below
    ];
    raw.routes.max_peek_bytes = 4;
    let err = validate(&raw).unwrap_err();
    assert_problem(&err, "routes.signatures[0]", "test", "at least one of");
    assert_problem(&err, "routes.signatures[1]", "test", "200");
    assert_problem(&err, "routes.signatures[2]", "test", "not an HTTP status");
    assert_problem(&err, "routes.signatures[3]", "test", "max_peek_bytes");
    assert_eq!(err.problems.len(), 4, "{err}");
}

#[test]
fn numeric_limits_are_checked() {
    let mut raw = raw_with_upstream("http://b:1");
    raw.retry_after_secs = 0;
    raw.routes.max_peek_bytes = 0;
    raw.limits.max_header_bytes = 8191;
    raw.limits.max_connections = 0;
    raw.client.response_timeout_secs = 0.0;
    raw.client.pool_idle_timeout_secs = f64::NAN;
    raw.streams.idle_timeout_secs = f64::INFINITY;
    raw.routes.learn_ttl_secs = -0.5;
    raw.routes.horizon_secs = 1e12;
    raw.limits.header_read_timeout_secs = -3.0;
    raw.shutdown.drain_timeout_secs = 0.0;
    let err = validate(&raw).unwrap_err();
    for key in [
        "retry_after_secs",
        "routes.max_peek_bytes",
        "limits.max_header_bytes",
        "limits.max_connections",
        "client.response_timeout_secs",
        "client.pool_idle_timeout_secs",
        "streams.idle_timeout_secs",
        "routes.learn_ttl_secs",
        "routes.horizon_secs",
        "limits.header_read_timeout_secs",
        "shutdown.drain_timeout_secs",
    ] {
        problem(&err, key);
    }
    assert_eq!(err.problems.len(), 11, "{err}");

    // The edges that are allowed.
    let mut raw = raw_with_upstream("http://b:1");
    raw.routes.max_peek_bytes = 1 << 20;
    raw.limits.max_header_bytes = 8192;
    raw.client.connect_timeout_secs = 0.001;
    let c = validate(&raw).unwrap();
    assert_eq!(c.connect_timeout, Duration::from_millis(1));
}

#[test]
fn enumerated_strings_are_checked() {
    let mut raw = raw_with_upstream("http://b:1");
    raw.log_format = "JSON".into();
    raw.client.host_header = "client".into();
    let err = validate(&raw).unwrap_err();
    assert_problem(&err, "log_format", "test", "`text` or `json`");
    assert_problem(
        &err,
        "client.host_header",
        "test",
        "`preserve` or `upstream`",
    );
    assert_eq!(err.problems.len(), 2, "{err}");
}

#[test]
fn kubernetes_service_links_are_not_settings() {
    // What Kubernetes injects into every pod for a Service named `holdfast`.
    jailed(|jail| {
        jail.set_env("HOLDFAST_PORT", "tcp://10.0.0.1:8080");
        jail.set_env("HOLDFAST_PORT_8080_TCP", "tcp://10.0.0.1:8080");
        jail.set_env("HOLDFAST_PORT_8080_TCP_ADDR", "10.0.0.1");
        jail.set_env("HOLDFAST_SERVICE_HOST", "10.0.0.1");
        jail.set_env("HOLDFAST_SERVICE_PORT", "8080");
        jail.set_env("HOLDFAST_UPSTREAM", "http://b:8000");
        let c = loaded(None, &RawFlags::default());
        assert_eq!(c.upstream.original, "http://b:8000");
        Ok(())
    });
}

#[test]
fn an_environment_problem_names_the_variable() {
    jailed(|jail| {
        jail.set_env("HOLDFAST_UPSTREAM", "http://b:8000");
        jail.set_env("HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS", "-1");
        let err = load_err(None, &RawFlags::default());
        assert_problem(
            &err,
            "client.connect_timeout_secs",
            "environment variable HOLDFAST_CLIENT__CONNECT_TIMEOUT_SECS",
            "positive",
        );
        Ok(())
    });
}

#[test]
fn a_pause_must_end_and_an_admin_token_must_be_worth_the_name() {
    let mut raw = raw_with_upstream("http://b:1");
    raw.pause.max_secs = 0.0;
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "pause.max_secs").message.contains("positive"));

    let dir = crate::support::files::TempDir::new("admin-token");
    let mut raw = raw_with_upstream("http://b:1");
    let missing = dir.path().join("absent");
    raw.admin_token_file = Some(missing.to_str().unwrap().into());
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "admin_token_file")
            .message
            .contains("cannot read"),
        "{err}"
    );

    let short = dir.write("short", "abc\n");
    raw.admin_token_file = Some(short.to_str().unwrap().into());
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "admin_token_file")
            .message
            .contains("at least 16"),
        "{err}"
    );

    let spaced = dir.write("spaced", "0123456789 abcdef\n");
    raw.admin_token_file = Some(spaced.to_str().unwrap().into());
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "admin_token_file")
            .message
            .contains("one line"),
        "{err}"
    );

    let good = dir.write("good", "  0123456789abcdef\n");
    raw.admin_token_file = Some(good.to_str().unwrap().into());
    let config = validate(&raw).expect("a good token");
    let token = config.admin_token.expect("read");
    assert_eq!(token.as_str(), "0123456789abcdef");
    assert!(!format!("{token:?}").contains("0123"), "Debug hides it");
}

#[test]
fn a_mistyped_value_is_an_error_even_where_a_higher_layer_overrides_it() {
    jailed(|jail| {
        jail.create_file("bad.toml", "upstream = \"http://b:1\"\nlisten = 8080\n")?;
        let flags = RawFlags {
            listen: Some("127.0.0.1:1003".into()),
            ..RawFlags::default()
        };
        let err = load_err(Some("bad.toml"), &flags);
        let p = problem(&err, "listen");
        assert!(p.origin.starts_with("file "), "{p}");
        assert!(p.origin.ends_with("bad.toml"), "{p}");
        assert!(p.message.contains("string"), "{p}");
        assert_eq!(err.problems.len(), 1, "reported once: {err}");

        // The environment is a layer too, under the flag.
        jail.create_file("good.toml", "upstream = \"http://b:1\"\n")?;
        jail.set_env("HOLDFAST_LIMITS__MAX_CONNECTIONS", "many");
        let flags = RawFlags::default();
        let err = load_err(Some("good.toml"), &flags);
        let p = problem(&err, "limits.max_connections");
        assert_eq!(
            p.origin,
            "environment variable HOLDFAST_LIMITS__MAX_CONNECTIONS"
        );
        assert_eq!(err.problems.len(), 1, "reported once: {err}");
        Ok(())
    });
}

#[test]
fn the_admin_default_is_no_common_tools_port() {
    // Prometheus, Pushgateway, Alertmanager, node_exporter, Grafana, the proxy's own port and the
    // usual MCP server ports: a sidecar shares its pod's network namespace with them.
    let port: std::net::SocketAddr = config::defaults::ADMIN.parse().unwrap();
    for taken in [9090, 9091, 9093, 9094, 9100, 3000, 8080, 8000, 8888] {
        assert_ne!(port.port(), taken, "{}", config::defaults::ADMIN);
    }
    assert!(
        port.ip().is_loopback(),
        "metrics are not exposed by accident"
    );
}

#[test]
fn listen_addresses_as_go_tools_take_them() {
    jailed(|_| {
        let flags = RawFlags {
            listen: Some(":8081".into()),
            admin: Some("localhost:9363".into()),
            ..upstream_flag("http://b:1")
        };
        let c = loaded(None, &flags);
        assert_eq!(c.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(c.admin, "127.0.0.1:9363".parse().unwrap());

        let flags = RawFlags {
            listen: Some("mcp.example:80".into()),
            ..upstream_flag("http://b:1")
        };
        let err = load_err(None, &flags);
        assert!(problem(&err, "listen").message.contains("`:8080`"), "{err}");
        Ok(())
    });
}

#[test]
fn every_missing_tls_file_is_named_in_one_round() {
    let dir = crate::support::files::TempDir::new("missing-tls");
    let at = |name: &str| Some(dir.path().join(name).to_str().unwrap().to_string());
    let mut raw = raw_with_upstream("https://b:1");
    raw.tls.cert = at("server.pem");
    raw.tls.key = at("server.key");
    raw.client.ca = at("ca.pem");
    raw.client.cert = at("client.pem");
    raw.client.key = at("client.key");
    let err = validate(&raw).unwrap_err();
    for key in [
        "tls.cert",
        "tls.key",
        "client.ca",
        "client.cert",
        "client.key",
    ] {
        let p = problem(&err, key);
        assert!(p.message.contains("cannot read"), "{key}: {err}");
    }
}

#[test]
fn session_keys_and_the_shared_store_are_checked() {
    let dir = crate::support::files::TempDir::new("session-keys");
    let mut raw = raw_with_upstream("http://b:1");
    raw.sessions.key_file = Some(dir.path().join("absent"));
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "sessions.key_file")
            .message
            .contains("cannot read"),
        "{err}"
    );
    raw.sessions.key_file = Some(dir.write("keys", "not a key\n"));
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "sessions.key_file")
            .message
            .contains("line 1: expected 64 hexadecimal"),
        "{err}"
    );
    let keys = dir.write("good", &format!("{}\n", "0123456789abcdef".repeat(4)));
    raw.sessions.key_file = Some(keys.clone());
    let config = validate(&raw).expect("a real key");
    assert_eq!(config.sessions.keys.keys.len(), 1);
    assert!(
        !format!("{config:?}").contains("0123456789abcdef"),
        "no key in Debug output"
    );

    // The store: a redis:// or valkey:// URL with a host, and only with a shared key.
    for (url, says) in [
        ("http://cache:6379", "redis:// or valkey://"),
        ("rediss://cache:6379", "redis:// or valkey://"),
        ("redis://", "no host"),
        ("redis:///0", "no host"),
    ] {
        raw.sessions.store = Some(url.into());
        let err = validate(&raw).unwrap_err();
        assert!(
            problem(&err, "sessions.store").message.contains(says),
            "{url}: {err}"
        );
    }
    raw.sessions.store = Some("valkey://cache:6379/2".into());
    assert!(validate(&raw).is_ok());
    raw.sessions.key_file = None;
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "sessions.store")
            .message
            .contains("needs sessions.key_file"),
        "{err}"
    );
}
