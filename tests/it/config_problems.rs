//! Configuration problems, all at once: validation reports every problem together, each with its
//! key and origin (the file, the variable, the flag), in the file's words.
//!
//! Every test that reads the environment runs in figment's `Jail`: jails take one process-wide
//! lock, restore the variables they set, and switch the current directory to a fresh temporary
//! one, so files created there are named relatively and the sample file absolutely.

use holdfast::config::RawFlags;

use crate::support::config::{assert_problem, load_err, problem, upstream_flag};
use crate::support::jail::jailed;

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
