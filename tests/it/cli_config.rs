//! The real binary and its configuration: `check-config`'s output (it loads back, it names each
//! value's origin), the layers, and the problems it names before exiting 2. (Help, exit codes,
//! startup and SIGTERM: `cli.rs`, whose note on the children's environment holds here too.)

use crate::cli::finish;
use crate::support::files::{repo_path, TempDir};
use crate::support::process::holdfast;

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

    let dir = TempDir::new("cli");
    let path = dir.write("roundtrip.toml", &first.stdout);
    let again = finish(holdfast(&[
        "check-config",
        "--config",
        path.to_str().unwrap(),
    ]));
    assert!(again.status.success(), "{again:?}");
    // The same configuration; the origins below it differ (now every value is the file's).
    let config = |out: &str| out.split("\n# Where each value").next().unwrap().to_owned();
    assert_eq!(config(&again.stdout), config(&first.stdout));
    assert!(
        again
            .stdout
            .contains(&format!("#   upstream: file {}", path.display())),
        "{}",
        again.stdout
    );
}

#[test]
fn check_config_layers_flags_over_env_over_file() {
    let sample = repo_path("config/holdfast.toml");
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

/// Issue 30: a `HOLDFAST_*` variable that names no key (a Kubernetes service link of a Service
/// named `holdfast-gateway`, a compose file's `HOLDFAST_IMAGE`, a typo) is not read and not
/// fatal: one warning names it. Before, `check-config` and the proxy exited 2 on it, and every
/// pod of such a namespace crash-looped.
#[test]
fn environment_variables_that_name_no_key_are_named_in_a_warning_not_fatal() {
    let mut cmd = holdfast(&["check-config", "--upstream", "http://x:1"]);
    cmd.env("HOLDFAST_GATEWAY_SERVICE_HOST", "10.0.0.1")
        .env("HOLDFAST_GATEWAY_PORT_8080_TCP_ADDR", "10.0.0.1")
        .env("HOLDFAST_IMAGE", "holdfast:latest")
        .env("HOLDFAST_HOLD__TIMEOUT", "5")
        // A Service named `holdfast` itself: its links are never settings, never warned of.
        .env("HOLDFAST_SERVICE_HOST", "10.0.0.2")
        .env("HOLDFAST_HOLD__TIMEOUT_SECS", "7");
    let out = finish(cmd);
    assert!(out.status.success(), "{out:?}");
    let warning = out
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: not read"))
        .unwrap_or_else(|| panic!("one warning: {out:?}"));
    for name in [
        "HOLDFAST_GATEWAY_PORT_8080_TCP_ADDR",
        "HOLDFAST_GATEWAY_SERVICE_HOST",
        "HOLDFAST_HOLD__TIMEOUT",
        "HOLDFAST_IMAGE",
    ] {
        assert!(warning.contains(name), "{name} in {warning:?}");
    }
    assert!(!warning.contains("HOLDFAST_SERVICE_HOST,"), "{warning:?}");
    assert!(!warning.contains("TIMEOUT_SECS"), "{warning:?}");
    // The known key beside them is read.
    let printed: toml::Value = toml::from_str(&out.stdout).expect("TOML");
    assert_eq!(printed["hold"]["timeout_secs"].as_float(), Some(7.0));
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
fn an_upstream_url_with_an_impossible_port_or_no_host_is_refused_at_once() {
    for (url, says) in [
        ("http://a:99999", "port must be a number from 1 to 65535"),
        (
            "http://127.0.0.1:0",
            "port must be a number from 1 to 65535",
        ),
        ("http://a:", "port is empty"),
        ("http://:8000", "no host"),
    ] {
        let out = finish(holdfast(&["check-config", "--upstream", url]));
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert!(
            out.stderr.contains(says) && out.stderr.contains(url),
            "{url}: {out:?}"
        );
    }
    for url in [
        "http://[::1]:8000",
        "https://mcp.example",
        "http://mcp:65535/api",
    ] {
        let out = finish(holdfast(&["check-config", "--upstream", url]));
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
    }
}

/// `check-config` says where each value not at its default came from, under the configuration
/// (as TOML comments, so the output still parses): a value an environment variable set is not
/// taken for the file's.
#[test]
fn check_config_names_the_origin_of_every_value_set() {
    let dir = TempDir::new("check-config-origins");
    let file = dir.write(
        "holdfast.toml",
        "upstream = \"http://from-file:1\"\n[hold]\ntimeout_secs = 9.0\n",
    );
    let mut cmd = holdfast(&[
        "check-config",
        "--config",
        file.to_str().unwrap(),
        "--listen",
        "127.0.0.1:7001",
    ]);
    cmd.env("HOLDFAST_UPSTREAM", "http://from-env:2");
    let out = finish(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed: toml::Value = toml::from_str(&out.stdout).expect("still TOML");
    assert_eq!(printed["upstream"].as_str(), Some("http://from-env:2"));
    let origins: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("# Where each value"))
        .skip(1)
        .collect();
    assert_eq!(
        origins,
        [
            format!("#   hold.timeout_secs: file {}", file.display()),
            "#   listen: command-line flag".to_owned(),
            "#   upstream: environment variable HOLDFAST_UPSTREAM".to_owned(),
        ],
        "{}",
        out.stdout
    );
}
