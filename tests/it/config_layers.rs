//! Configuration layers: defaults < file < environment < flags.
//!
//! Every test that reads the environment runs in figment's `Jail`: jails take one process-wide
//! lock, restore the variables they set, and switch the current directory to a fresh temporary
//! one, so files created there are named relatively and the sample file absolutely.

use std::time::Duration;

use holdfast::config::{self, HostHeader, LogFormat, RawFlags, RawTlsFlags};

use crate::support::config::{assert_problem, load_err, loaded, upstream_flag};
use crate::support::jail::jailed;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

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
            request_id: config::RawRequestIdFlags {
                header: Some("X-Flag-Id".into()),
            },
        };
        let c = loaded(None, &flags);
        assert_eq!(c.listen, "127.0.0.1:2001".parse().unwrap());
        assert_eq!(c.upstream.original, "http://from-flag:2");
        assert_eq!(c.admin, "127.0.0.1:2002".parse().unwrap());
        assert_eq!(c.retry_after, Duration::from_secs(9));
        assert_eq!(c.log_level, "warn,holdfast::access=info");
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(c.access_log);
        assert_eq!(c.request_id.header, "x-flag-id");
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

#[test]
fn the_request_id_header_comes_from_file_env_or_flag_and_must_be_a_usable_name() {
    jailed(|jail| {
        jail.set_env("HOLDFAST_UPSTREAM", "http://mcp:8000");
        let c = loaded(None, &RawFlags::default());
        assert_eq!(c.request_id.header, "x-request-id", "the default");
        jail.create_file("holdfast.toml", "[request_id]\nheader = \"X-Trace-Id\"\n")?;
        let file = Some("holdfast.toml");
        assert_eq!(
            loaded(file, &RawFlags::default()).request_id.header,
            "x-trace-id"
        );
        jail.set_env("HOLDFAST_REQUEST_ID__HEADER", "x-env-id");
        assert_eq!(
            loaded(file, &RawFlags::default()).request_id.header,
            "x-env-id"
        );
        let flags = RawFlags {
            request_id: config::RawRequestIdFlags {
                header: Some("x-flag-id".into()),
            },
            ..RawFlags::default()
        };
        assert_eq!(loaded(file, &flags).request_id.header, "x-flag-id");

        jail.set_env("HOLDFAST_REQUEST_ID__HEADER", "not a header");
        let err = load_err(file, &RawFlags::default());
        let env = "HOLDFAST_REQUEST_ID__HEADER";
        assert_problem(
            &err,
            "request_id.header",
            env,
            "expected an HTTP header name",
        );
        jail.set_env("HOLDFAST_REQUEST_ID__HEADER", "Mcp-Session-Id");
        let err = load_err(file, &RawFlags::default());
        assert_problem(&err, "request_id.header", env, "cannot carry request ids");
        Ok(())
    });
}
