//! The sample `config/holdfast.toml`: it must stay equal to the built-in defaults, set every key
//! itself, mention every key's environment variable and flag, and its examples must be valid.
//!
//! Every test that reads the environment runs in figment's `Jail`: jails take one process-wide
//! lock, restore the variables they set, and switch the current directory to a fresh temporary
//! one, so files created there are named relatively and the sample file absolutely.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use holdfast::cli::Cli;
use holdfast::config::{self, RawConfig, RawFlags, RawHeaderMatch, RawSignature};
use http::header::{HeaderMap, HeaderValue};
use http::StatusCode;

use crate::support::config::{
    assert_problem, loaded, raw_with_upstream, validate, DEFAULT_PRESETS,
};
use crate::support::files::repo_path;
use crate::support::jail::jailed;

/// The upstream the sample file sets (every other value in it is a default).
const SAMPLE_UPSTREAM: &str = "http://mcp-backend:8000";

fn sample_path() -> PathBuf {
    repo_path("config/holdfast.toml")
}

fn sample_text() -> String {
    std::fs::read_to_string(sample_path()).expect("config/holdfast.toml is readable")
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
