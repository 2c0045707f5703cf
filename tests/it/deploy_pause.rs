//! The planned-restart recipes (issue 14): `deploy/traefik/deploy.sh` and the systemd drop-in
//! `deploy/systemd/mcp-server-pause.conf`, run as shipped against a running holdfast. Docker is
//! not here, so `docker` is a stand-in on PATH that runs holdfast's real binary for `compose
//! exec holdfast ...` and records every call; systemd's commands are run as systemd
//! would, with the binary and configuration paths pointed at this build and a test
//! configuration.

use std::os::unix::fs::PermissionsExt;

use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::http;
use crate::support::mcp::{call_wait, connect, McpServer, Mode, Options};
use crate::support::process::{finish, require_program, Finished};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

const DEPLOY_SH: &str = "deploy/traefik/deploy.sh";
const DROP_IN: &str = "deploy/systemd/mcp-server-pause.conf";

async fn holdfast_in_front() -> (McpServer, Holdfast) {
    let server = McpServer::start_with(Options {
        mode: Mode::StatelessJson,
        ..Options::default()
    })
    .await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.routes.behind_router = Some(false);
    let holdfast = Holdfast::start_with(raw).await;
    (server, holdfast)
}

async fn paused(holdfast: &Holdfast) -> bool {
    let got = http::get(&format!("http://{}/status", holdfast.admin)).await;
    let state: serde_json::Value = serde_json::from_slice(&got.body).expect("JSON");
    state["paused"] == true
}

/// Runs `cmd` off the runtime (holdfast serves on it meanwhile).
async fn run(cmd: std::process::Command) -> Finished {
    tokio::task::spawn_blocking(move || finish(cmd, "the recipe"))
        .await
        .expect("the recipe's thread")
}

/// A `docker` stand-in: `docker compose -f F exec -T holdfast /usr/local/bin/holdfast ARGS`
/// (where the image has it: `Dockerfile`) runs holdfast's binary with ARGS against `admin`; `docker compose -f F up ...` succeeds unless `up_fails`.
/// Every call is appended to `calls.log` in `dir`.
fn fake_docker(dir: &TempDir, admin: &str, up_fails: bool) {
    let bin = env!("CARGO_BIN_EXE_holdfast");
    let log = dir.path().join("calls.log");
    let script = format!(
        r#"#!/bin/sh
echo "$*" >> '{log}'
[ "$1" = compose ] && [ "$2" = -f ] || {{ echo "unexpected: docker $*" >&2; exit 64; }}
shift 3
case "$1" in
exec)
    [ "$2 $3 $4" = "-T holdfast /usr/local/bin/holdfast" ] || {{ echo "unexpected exec: $*" >&2; exit 64; }}
    shift 4
    exec '{bin}' "$@" --admin '{admin}'
    ;;
up) exit {up} ;;
*) echo "unexpected: docker $*" >&2; exit 64 ;;
esac
"#,
        log = log.display(),
        up = if up_fails { 1 } else { 0 },
    );
    let path = dir.write("docker", &script);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn deploy_sh(dir: &TempDir) -> std::process::Command {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg(repo_path(DEPLOY_SH))
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
        .env("DRAIN_SECS", "5")
        .stdin(std::process::Stdio::null());
    cmd
}

fn calls(dir: &TempDir) -> Vec<String> {
    std::fs::read_to_string(dir.path().join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().skip(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[tokio::test]
async fn deploy_sh_pauses_recreates_and_resumes() {
    let (_server, holdfast) = holdfast_in_front().await;
    let dir = TempDir::new("deploy-sh");
    fake_docker(&dir, &holdfast.admin.to_string(), false);
    let out = run(deploy_sh(&dir)).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        calls(&dir),
        [
            "exec -T holdfast /usr/local/bin/holdfast pause --drain-timeout 5",
            "up -d --force-recreate --wait mcp",
            "exec -T holdfast /usr/local/bin/holdfast resume",
        ],
        "{out:?}"
    );
    assert!(!paused(&holdfast).await);
    assert_eq!(
        holdfast
            .metric("holdfast_pauses_total{outcome=\"drained\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn deploy_sh_recreates_nothing_when_holdfast_cannot_pause_and_resumes_when_up_fails() {
    // Nothing listens at the admin address: no pause, so no recreation.
    let nowhere = http::Reserved::new();
    let addr = nowhere.addr.to_string();
    let dir = TempDir::new("deploy-sh-down");
    fake_docker(&dir, &addr, false);
    let out = run(deploy_sh(&dir)).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("nothing was recreated"), "{out:?}");
    assert_eq!(calls(&dir).len(), 1, "only the pause: {:?}", calls(&dir));

    // The recreation fails: holdfast is resumed, not left paused until pause.max_secs.
    let (_server, holdfast) = holdfast_in_front().await;
    let dir = TempDir::new("deploy-sh-up-fails");
    fake_docker(&dir, &holdfast.admin.to_string(), true);
    let out = run(deploy_sh(&dir)).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        calls(&dir).last().map(String::as_str),
        Some("exec -T holdfast /usr/local/bin/holdfast resume")
    );
    assert!(!paused(&holdfast).await);
}

/// A call still in flight when the drain times out (`holdfast pause` exit 4): recreating the
/// server would cut it, so deploy.sh recreates nothing, resumes, and says why.
#[tokio::test]
async fn deploy_sh_recreates_nothing_while_a_call_is_in_flight() {
    let (server, holdfast) = holdfast_in_front().await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    let peer = client.peer().clone();
    let slow = tokio::spawn(async move { call_wait(&peer).await });
    // holdfast's own count of what is in flight says the call is out (polled: nothing else
    // announces it; bounded).
    within(async {
        loop {
            let got = http::get(&format!("http://{}/status", holdfast.admin)).await;
            let state: serde_json::Value = serde_json::from_slice(&got.body).expect("JSON");
            if state["in_flight_calls"] == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let dir = TempDir::new("deploy-sh-call-in-flight");
    fake_docker(&dir, &holdfast.admin.to_string(), false);
    let mut cmd = deploy_sh(&dir);
    cmd.env("DRAIN_SECS", "0.2");
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("calls still in flight"), "{out:?}");
    assert_eq!(
        calls(&dir),
        [
            "exec -T holdfast /usr/local/bin/holdfast pause --drain-timeout 0.2",
            "exec -T holdfast /usr/local/bin/holdfast resume",
        ],
        "{out:?}"
    );
    assert!(!paused(&holdfast).await);
    server.release_waits(1);
    assert!(within(slow).await.unwrap().is_ok(), "the call was not cut");
}

/// The drop-in's `[Service]` assignments.
fn drop_in(key: &str) -> String {
    let values: Vec<String> = read_repo(DROP_IN)
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
        .collect();
    match values.as_slice() {
        [one] => one.clone(),
        other => panic!("{DROP_IN}: expected one {key}=, found {other:?}"),
    }
}

/// A drop-in command as systemd runs it: the leading "-" (ignore failure) off, the binary and
/// configuration paths pointed at this build and `config`.
fn systemd_command(line: &str, config: &std::path::Path) -> std::process::Command {
    let line = line.strip_prefix('-').unwrap_or_else(|| {
        panic!("{DROP_IN}: a failed pause or resume must not fail the unit: {line}")
    });
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| match w {
            "/usr/local/bin/holdfast" => env!("CARGO_BIN_EXE_holdfast").to_owned(),
            "/etc/holdfast/holdfast.toml" => config.display().to_string(),
            other => other.to_owned(),
        })
        .collect();
    let mut cmd = crate::support::process::holdfast(&[]);
    assert_eq!(words[0], env!("CARGO_BIN_EXE_holdfast"), "{line}");
    cmd.args(&words[1..]);
    cmd
}

#[tokio::test]
async fn the_systemd_drop_in_pauses_before_the_stop_and_resumes_after_the_start() {
    let (_server, holdfast) = holdfast_in_front().await;
    let dir = TempDir::new("drop-in");
    let config = dir.write(
        "holdfast.toml",
        &format!(
            "upstream = \"http://127.0.0.1:9\"\nadmin = \"{}\"\n",
            holdfast.admin
        ),
    );

    let stop = run(systemd_command(&drop_in("ExecStop"), &config)).await;
    assert_eq!(stop.status.code(), Some(0), "{stop:?}");
    assert!(paused(&holdfast).await);
    let start = run(systemd_command(&drop_in("ExecStartPost"), &config)).await;
    assert_eq!(start.status.code(), Some(0), "{start:?}");
    assert!(!paused(&holdfast).await);

    // systemd's stop timeout covers ExecStop: the drain must fit in it.
    let exec_stop = drop_in("ExecStop");
    let drain: f64 = exec_stop
        .split_whitespace()
        .skip_while(|w| *w != "--drain-timeout")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("ExecStop names its --drain-timeout");
    let timeout: f64 = drop_in("TimeoutStopSec")
        .trim_end_matches('s')
        .parse()
        .expect("TimeoutStopSec in seconds");
    assert!(
        drain + 10.0 <= timeout,
        "drain {drain} s, TimeoutStopSec {timeout} s"
    );
}

/// `systemd-analyze verify` reads the drop-in on a server's unit as systemd would.
#[test]
fn systemd_accepts_the_drop_in() {
    let analyze = require_program(
        "systemd-analyze",
        "apt-get update && apt-get install -y --no-install-recommends systemd",
    );
    let dir = TempDir::new("drop-in-verify");
    dir.write(
        "your-mcp.service",
        "[Unit]\nDescription=an MCP server\n\n[Service]\nExecStart=/bin/sleep infinity\n",
    );
    std::fs::create_dir_all(dir.path().join("your-mcp.service.d")).unwrap();
    let bin = env!("CARGO_BIN_EXE_holdfast");
    let drop_in = read_repo(DROP_IN).replace("/usr/local/bin/holdfast", bin);
    std::fs::write(
        dir.path().join("your-mcp.service.d/holdfast-pause.conf"),
        drop_in,
    )
    .unwrap();
    let out = std::process::Command::new(&analyze)
        .arg("verify")
        .arg(dir.path().join("your-mcp.service"))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display()))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify with {DROP_IN}: {}\n{stderr}",
        out.status
    );
}
