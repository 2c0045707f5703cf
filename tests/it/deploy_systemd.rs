//! The standalone deployment's systemd unit (`deploy/systemd/`): the tests read the unit, run
//! `systemd-analyze verify` and `security` on it, and run the real holdfast binary with the
//! unit's arguments and the shipped configuration file. (nginx in front of it:
//! `deploy_nginx.rs`.)

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::process::{holdfast, require_program};

/// The shipped systemd unit.
const UNIT: &str = "deploy/systemd/holdfast.service";
/// The configuration file the unit's README section installs as /etc/holdfast/holdfast.toml.
pub(crate) const UNIT_CONFIG: &str = "deploy/systemd/holdfast.toml";
/// Where the unit reads its configuration.
const UNIT_CONFIG_PATH: &str = "/etc/holdfast/holdfast.toml";

/// holdfast's effective configuration under the shipped unit: the shipped file, checked and
/// printed by the real binary (`holdfast check-config`) with the unit's own arguments.
pub(crate) fn unit_config() -> holdfast::config::RawConfig {
    let unit = SystemdUnit::shipped();
    let exec = unit.one("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/holdfast"), "ExecStart");
    let args: Vec<String> = words
        .map(|w| {
            if w == UNIT_CONFIG_PATH {
                repo_path(UNIT_CONFIG).display().to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    let out = holdfast(&["check-config"])
        .args(&args)
        .output()
        .expect("run holdfast check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`holdfast check-config {}` failed: {}\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&stdout).expect("check-config prints the configuration as TOML")
}

// ------------------------------------------------------------------------------------------
// systemd
// ------------------------------------------------------------------------------------------

/// A unit file's `[Service]` settings: every assignment in order (a key may repeat; an empty
/// assignment resets a list).
struct SystemdUnit(HashMap<String, Vec<String>>);

impl SystemdUnit {
    fn shipped() -> SystemdUnit {
        let mut section = String::new();
        let mut service: HashMap<String, Vec<String>> = HashMap::new();
        for line in read_repo(UNIT).lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            assert!(!line.ends_with('\\'), "{UNIT}: keep settings on one line");
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{UNIT}: not a setting: {line}"));
            if section == "[Service]" {
                service
                    .entry(key.trim().to_string())
                    .or_default()
                    .push(value.trim().to_string());
            }
        }
        SystemdUnit(service)
    }

    /// Every value given to `key`.
    fn all(&self, key: &str) -> &[String] {
        self.0.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// The single value of `key`.
    fn one(&self, key: &str) -> &str {
        match self.all(key) {
            [value] => value,
            other => panic!("{UNIT}: expected one {key}=, found {other:?}"),
        }
    }
}

/// A systemd time span (`30s`, `1min 30s`, `90`).
fn systemd_time(value: &str) -> Duration {
    value
        .split_whitespace()
        .map(|part| {
            let digits = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            let n: u64 = part[..digits].parse().expect("a systemd time span");
            match &part[digits..] {
                "" | "s" | "sec" => Duration::from_secs(n),
                "min" | "m" => Duration::from_secs(n * 60),
                "ms" | "msec" => Duration::from_millis(n),
                other => panic!("unexpected unit {other:?} in {value:?}"),
            }
        })
        .sum()
}

#[test]
fn the_systemd_unit_is_hardened() {
    let unit = SystemdUnit::shipped();
    let yes = |key: &str| assert_eq!(unit.one(key), "yes", "{UNIT}: {key}");

    // No privileges at all: a throwaway user, no capabilities, nothing to gain.
    assert!(
        unit.one("DynamicUser") == "yes" || !unit.all("User").is_empty(),
        "{UNIT}: run as DynamicUser=yes or a dedicated User="
    );
    assert_eq!(unit.one("CapabilityBoundingSet"), "", "no capabilities");
    yes("NoNewPrivileges");
    // A read-only system, no home directories, a private /tmp.
    assert_eq!(unit.one("ProtectSystem"), "strict");
    yes("ProtectHome");
    yes("PrivateTmp");
    yes("MemoryDenyWriteExecute");
    // Sockets: TCP for clients and the MCP server, AF_UNIX for the journal; nothing else.
    let families: Vec<&str> = unit
        .one("RestrictAddressFamilies")
        .split_whitespace()
        .collect();
    assert_eq!(families, ["AF_INET", "AF_INET6", "AF_UNIX"]);
    assert!(
        unit.all("SystemCallFilter")
            .iter()
            .any(|f| f == "@system-service"),
        "{UNIT}: SystemCallFilter=@system-service"
    );

    // Secrets as credentials: the dynamic user cannot read root-only files itself. The session
    // keys (sessions outlive holdfast's restarts) are one, named to holdfast through the
    // environment so that the config file stays checkable anywhere.
    assert!(
        unit.all("LoadCredential")
            .iter()
            .any(|c| c == "session-keys:/etc/holdfast/session-keys"),
        "{UNIT}: LoadCredential=session-keys:/etc/holdfast/session-keys"
    );
    assert!(
        unit.all("Environment")
            .iter()
            .any(|e| e == "HOLDFAST_SESSIONS__KEY_FILE=%d/session-keys"),
        "{UNIT}: Environment=HOLDFAST_SESSIONS__KEY_FILE=%d/session-keys"
    );

    // Restarts on a crash, not on a configuration error (exit status 2) it cannot fix.
    assert_eq!(unit.one("Restart"), "on-failure");
    assert_eq!(unit.one("RestartPreventExitStatus"), "2");

    // The configuration file, and a stop that waits for holdfast's drain.
    let exec = unit.one("ExecStart");
    assert!(
        exec.contains(&format!("--config {UNIT_CONFIG_PATH}")),
        "{UNIT}: ExecStart must read {UNIT_CONFIG_PATH}: {exec}"
    );
    let holdfast = unit_config();
    let stop = systemd_time(unit.one("TimeoutStopSec"));
    let drain = Duration::from_secs_f64(holdfast.shutdown.drain_timeout_secs);
    assert!(
        stop > drain,
        "TimeoutStopSec {stop:?} must exceed shutdown.drain_timeout_secs {drain:?}, or systemd \
         kills holdfast mid-drain"
    );
    assert!(
        stop > Duration::from_secs_f64(
            holdfast::config::RawConfig::default()
                .shutdown
                .drain_timeout_secs
        ),
        "TimeoutStopSec must exceed the default drain timeout too"
    );
}

/// `systemd-analyze` reads the unit as systemd would: no unknown or misspelt setting, an
/// executable ExecStart, and a low exposure score (`systemd-analyze security`, 0 to 10).
#[test]
fn systemd_accepts_the_unit() {
    // Fails rather than skips, as every test here that needs a program does.
    let analyze = require_program(
        "systemd-analyze",
        "apt-get update && apt-get install -y --no-install-recommends systemd",
    );
    // `systemctl reload` is holdfast's SIGHUP (tests/it/reload.rs shows what that does).
    assert!(
        read_repo(UNIT).contains("\nExecReload=/bin/kill -HUP $MAINPID\n"),
        "{UNIT} reloads with SIGHUP"
    );
    let dir = TempDir::new("systemd");
    // The same unit, pointing at the binary this build made instead of /usr/local/bin.
    let unit = read_repo(UNIT).replace(
        "ExecStart=/usr/local/bin/holdfast ",
        &format!("ExecStart={} ", env!("CARGO_BIN_EXE_holdfast")),
    );
    let path = dir.write("holdfast.service", &unit);

    let verify = Command::new(&analyze)
        .arg("verify")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&verify.stderr);
    // Unknown settings are only warnings, on stderr: any output is a finding.
    assert!(
        verify.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify {UNIT}: {}\n{stderr}",
        verify.status
    );

    let security = Command::new(&analyze)
        // The threshold is in tenths: exposure at most 2.0 of 10 (the unit scores about 1).
        .args(["security", "--offline=yes", "--threshold=20", "--no-pager"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("run systemd-analyze security");
    assert!(
        security.status.success(),
        "systemd-analyze security rates {UNIT} above 2.0:\n{}{}",
        String::from_utf8_lossy(&security.stdout),
        String::from_utf8_lossy(&security.stderr)
    );
}
