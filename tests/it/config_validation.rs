//! Configuration validation rules, one value at a time: upstreams, endpoints, tool names,
//! signatures, numeric limits, enumerated strings, pauses, admin tokens, listen addresses, TLS
//! files and session keys.
//!
//! Every test that reads the environment runs in figment's `Jail`: jails take one process-wide
//! lock, restore the variables they set, and switch the current directory to a fresh temporary
//! one, so files created there are named relatively and the sample file absolutely.

use std::time::Duration;

use holdfast::config::{self, RawFlags, RawSignature};

use crate::support::config::{
    assert_problem, load_err, loaded, problem, raw_with_upstream, upstream_flag, validate,
    DEFAULT_PRESETS,
};
use crate::support::jail::jailed;

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

    // The store: a redis:// or valkey:// URL (rediss:// and valkeys:// over TLS) with a host,
    // and only with a shared key.
    for (url, says) in [
        ("http://cache:6379", "redis:// or valkey://"),
        ("https://cache:6379", "rediss:// or valkeys:// for TLS"),
        ("rediss://", "no host"),
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
    raw.sessions.store = Some("rediss://cache:6380/0".into());
    assert!(validate(&raw).is_ok());
    raw.sessions.store = Some("valkey://cache:6379/2".into());
    raw.sessions.key_file = None;
    let err = validate(&raw).unwrap_err();
    assert!(
        problem(&err, "sessions.store")
            .message
            .contains("needs sessions.key_file"),
        "{err}"
    );
}
