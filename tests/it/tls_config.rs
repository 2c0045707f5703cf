//! TLS settings: flags and environment reach the configuration, problems are reported all at
//! once, and the sample file documents every TLS key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use holdfast::config::{self, Config, RawConfig, RawFlags, RawTlsFlags, UpstreamVerify};
use rcgen::KeyPair;

use crate::support::jail::jailed;
use crate::support::proxy::raw_config;
use crate::support::tls::{ca_file, listener_files, Ca, Dir};

// --- Configuration ---------------------------------------------------------------------------

fn validate(raw: &RawConfig) -> Result<Config, config::ConfigError> {
    Config::from_raw(raw, &|_| "test".into())
}

/// The message of the problem reported for `key`.
fn problem(err: &config::ConfigError, key: &str) -> String {
    err.problems
        .iter()
        .find(|p| p.key == key)
        .unwrap_or_else(|| panic!("no problem for `{key}`: {err}"))
        .to_string()
}

#[test]
fn tls_flags_and_environment_reach_the_config() {
    let (dir, ca) = (Dir::new(), Ca::new("listener CA"));
    let (cert, key) = listener_files(&dir, &ca);
    jailed(|jail| {
        let flags = RawFlags {
            upstream: Some("http://b:1".into()),
            tls: RawTlsFlags {
                cert: Some(cert.clone()),
                key: Some(key.clone()),
            },
            ..RawFlags::default()
        };
        let c = config::load(None, &flags).unwrap();
        let tls = c.tls.expect("TLS on");
        assert_eq!(tls.cert, Path::new(&cert));
        assert_eq!(tls.key, Path::new(&key));
        assert_eq!(tls.reload_interval, Duration::from_secs(5));
        assert!(tls.client_ca.is_none());

        jail.set_env("HOLDFAST_UPSTREAM", "https://b:8443");
        jail.set_env("HOLDFAST_TLS__CERT", &cert);
        jail.set_env("HOLDFAST_TLS__KEY", &key);
        jail.set_env("HOLDFAST_TLS__RELOAD_INTERVAL_SECS", "0.5");
        jail.set_env("HOLDFAST_CLIENT__CA", &cert);
        let c = config::load(None, &RawFlags::default()).unwrap();
        assert_eq!(c.tls.unwrap().reload_interval, Duration::from_millis(500));
        let up = c.upstream_tls.expect("https upstream");
        assert_eq!(up.verify, UpstreamVerify::Ca(PathBuf::from(&cert)));
        assert!(!up.offers_h2, "Host is preserved by default");

        // An empty value clears a path set below it.
        jail.set_env("HOLDFAST_TLS__CERT", "");
        jail.set_env("HOLDFAST_TLS__KEY", "");
        assert!(config::load(None, &RawFlags::default())
            .unwrap()
            .tls
            .is_none());

        // A bad file given as a flag names the flag.
        let flags = RawFlags {
            tls: RawTlsFlags {
                cert: Some(key.clone()),
                key: Some(key.clone()),
            },
            ..RawFlags::default()
        };
        let err = config::load(None, &flags).unwrap_err();
        let p = problem(&err, "tls.cert");
        assert!(
            p.contains("command-line flag") && p.contains("no certificate"),
            "{p}"
        );
        Ok(())
    });
}

#[test]
fn tls_settings_are_validated_all_at_once() {
    let (dir, ca) = (Dir::new(), Ca::new("CA"));
    let (cert, key) = listener_files(&dir, &ca);
    let other_key = dir.write("other.key", &KeyPair::generate().unwrap().serialize_pem());

    // Half a pair, and client.* keys on an http:// upstream.
    let mut raw = raw_config("http://b:1");
    raw.tls.cert = Some(cert.clone());
    raw.tls.reload_interval_secs = 0.0;
    raw.client.ca = Some(cert.clone());
    raw.client.insecure_skip_verify = true;
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.key").contains("needed"));
    assert!(problem(&err, "tls.reload_interval_secs").contains("positive"));
    assert!(problem(&err, "client.ca").contains("https://"));
    assert!(problem(&err, "client.insecure_skip_verify").contains("https://"));
    assert_eq!(err.problems.len(), 4, "{err}");

    // Files that do not load, each named under its key.
    let mut raw = raw_config("https://b:8443");
    raw.tls.cert = Some(cert.clone());
    raw.tls.key = Some(other_key.clone());
    raw.tls.client_ca = Some(dir.0.path().join("missing.crt").to_str().unwrap().into());
    raw.client.cert = Some(cert.clone());
    raw.client.ca = Some(key.clone());
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.key").contains("cannot be used"), "{err}");
    assert!(
        problem(&err, "tls.client_ca").contains("missing.crt"),
        "{err}"
    );
    assert!(
        problem(&err, "client.ca").contains("no certificate"),
        "{err}"
    );
    assert!(problem(&err, "client.key").contains("needed"), "{err}");
    assert_eq!(err.problems.len(), 4, "{err}");

    // Verifying against a CA and not verifying at all contradict each other.
    let mut raw = raw_config("https://b:8443");
    raw.client.ca = Some(ca_file(&dir, &ca));
    raw.client.insecure_skip_verify = true;
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "client.insecure_skip_verify").contains("contradicts"));

    // A client CA without a listener certificate.
    let mut raw = raw_config("http://b:1");
    raw.tls.client_ca = Some(ca_file(&dir, &ca));
    let err = validate(&raw).unwrap_err();
    assert!(problem(&err, "tls.client_ca").contains("tls.cert"));

    // A host that cannot be a TLS server name.
    let err = validate(&raw_config("https://mcp-.example:8443")).unwrap_err();
    assert!(problem(&err, "upstream").contains("server name"), "{err}");

    // And all is well with the right files.
    let mut raw = raw_config("https://b:8443");
    raw.tls.cert = Some(cert);
    raw.tls.key = Some(key);
    raw.tls.client_ca = Some(ca_file(&dir, &ca));
    raw.client.ca = Some(ca_file(&dir, &ca));
    raw.client.host_header = "upstream".into();
    let c = validate(&raw).unwrap();
    assert!(c.tls.unwrap().client_verifier.is_some());
    assert!(c.upstream_tls.unwrap().offers_h2);
}

#[test]
fn the_sample_file_documents_every_tls_key() {
    let text = crate::support::files::read_repo("config/holdfast.toml");
    // Optional paths are shown as `# key = "..."`: switch those on to see their sections.
    let switched: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest)
                if rest.split_once(" = ").is_some_and(|(k, _)| {
                    k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                }) =>
            {
                rest
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let value: toml::Value = toml::from_str(&switched).expect("TOML");
    for key in [
        "tls.cert",
        "tls.key",
        "tls.client_ca",
        "tls.reload_interval_secs",
        "client.ca",
        "client.cert",
        "client.key",
        "client.insecure_skip_verify",
    ] {
        let found = key.split('.').try_fold(&value, |v, k| v.get(k));
        assert!(
            found.is_some(),
            "config/holdfast.toml does not show `{key}`"
        );
        let env = format!("HOLDFAST_{}", key.replace('.', "__").to_ascii_uppercase());
        assert!(
            text.contains(&env),
            "config/holdfast.toml never names {env}"
        );
    }
    // The optional paths are examples, not settings: the sample leaves TLS off.
    let raw: RawConfig = toml::from_str(&text).unwrap();
    assert!(raw.tls.cert.is_none() && raw.client.ca.is_none());
}
