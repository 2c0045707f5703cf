//! Planned restarts (issue 14): `pause` drains what is in flight, holds what comes after, and
//! the new instance gets every held call exactly once. Real rmcp peers; the admin endpoints
//! asked the way `holdfast pause` asks them.
//!
//! The server runs in rmcp's stateless JSON mode: its client opens no standalone GET stream
//! there (a GET gets 405), so a drain can finish. A stream that outlives the drain is reported,
//! which `a_call_that_outlives_the_drain_timeout_is_named_and_not_cut` shows with a slow call.

use std::time::Duration;

use holdfast::admin::client::{self, Outcome, EXIT_CALLS_IN_FLIGHT, EXIT_STREAMS_ONLY};
use rmcp::service::Peer;
use rmcp::RoleClient;
use tokio::task::JoinHandle;

use crate::support::mcp::{call_ledger, call_wait, connect, Client, McpServer, Mode};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::{http, within};

/// A stateless JSON server, holdfast in front of it (nothing in between), and a client that has
/// listed the tools.
async fn setup(pause_max_secs: f64) -> (McpServer, Holdfast, Client) {
    let server = McpServer::start_with(crate::support::mcp::Options {
        mode: Mode::StatelessJson,
        ..Default::default()
    })
    .await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.routes.behind_router = Some(false);
    raw.pause.max_secs = pause_max_secs;
    let holdfast = Holdfast::start_with(raw).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    within(client.peer().list_all_tools())
        .await
        .expect("tools/list");
    (server, holdfast, client)
}

/// `GET /status`.
async fn status(holdfast: &Holdfast) -> serde_json::Value {
    let got = http::get(&format!("http://{}/status", holdfast.admin)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    serde_json::from_slice(&got.body).expect("status is JSON")
}

/// Waits until `/status` satisfies `ok` (what holdfast's own watcher finds, on its own time).
async fn status_until(holdfast: &Holdfast, ok: impl Fn(&serde_json::Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = status(holdfast).await;
        if ok(&state) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the status never got there: {state}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `holdfast pause` against this holdfast, on its own task.
fn pause(holdfast: &Holdfast, drain: Duration) -> JoinHandle<Outcome> {
    let admin = holdfast.admin;
    tokio::spawn(async move { client::pause(admin, None, drain).await })
}

/// `record` calls with these ids, each on its own task.
fn records(peer: &Peer<RoleClient>, ids: &[&str]) -> Vec<JoinHandle<String>> {
    ids.iter()
        .map(|id| {
            let (peer, id) = (peer.clone(), id.to_string());
            tokio::spawn(async move {
                call_ledger(&peer, "record", &id)
                    .await
                    .unwrap_or_else(|e| panic!("record {id} failed: {e}"))
            })
        })
        .collect()
}

/// The ledger holds each of `ids` exactly once, and nothing else.
fn assert_ran_once(server: &McpServer, ids: &[&str]) {
    let mut ledger = server.ledger();
    ledger.sort();
    let mut want: Vec<String> = ids.iter().map(|id| format!("record:{id}")).collect();
    want.sort();
    assert_eq!(ledger, want, "every call ran exactly once");
}

#[tokio::test]
async fn a_call_in_flight_completes_and_calls_after_pause_go_to_the_new_instance_once() {
    let (mut server, holdfast, client) = setup(60.0).await;
    let peer = client.peer().clone();
    let slow = tokio::spawn({
        let peer = peer.clone();
        async move { call_wait(&peer).await }
    });
    // In JSON mode the server records a request only once it answers: holdfast's own count of
    // what is in flight says the call is out.
    status_until(&holdfast, |s| s["in_flight"] == 1).await;

    let paused = pause(&holdfast, Duration::from_secs(20));
    holdfast.metric_until("holdfast_paused", |v| v == 1.0).await;
    let state = status(&holdfast).await;
    assert_eq!(state["in_flight"], 1, "the slow call: {state}");
    assert_eq!(state["oldest_in_flight"][0]["method"], "POST");

    // Calls after the pause are held before they are sent.
    let ids = ["a", "b", "c"];
    let calls = records(&peer, &ids);
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 3.0)
        .await;
    assert!(server.ledger().is_empty(), "nothing sent while paused");
    assert!(!paused.is_finished(), "the slow call is still in flight");

    // The call in flight finishes on the old instance; the drain ends with it.
    server.release_waits(1);
    assert_eq!(
        within(slow).await.unwrap().expect("the slow call"),
        "released"
    );
    let outcome = within(paused).await.unwrap();
    assert_eq!(outcome.code, 0, "{}", outcome.message);
    assert!(
        outcome.message.contains("nothing in flight"),
        "{}",
        outcome.message
    );

    // The deploy stops the old instance and starts the new one; holdfast sees both.
    within(server.stop()).await;
    status_until(&holdfast, |s| s["upstream_gone"] == true).await;
    within(server.restart()).await;
    for call in calls {
        within(call).await.expect("the held call's task");
    }
    assert_ran_once(&server, &ids);
    status_until(&holdfast, |s| s["paused"] == false).await;
    assert_eq!(holdfast.metric("holdfast_paused").await, 0.0);
    assert_eq!(
        holdfast
            .metric("holdfast_pauses_total{outcome=\"drained\"}")
            .await,
        1.0
    );
    assert_eq!(
        holdfast
            .metric("holdfast_holds_total{outcome=\"released\"}")
            .await,
        3.0
    );
}

#[tokio::test]
async fn killed_right_after_pause_returned_nothing_fails() {
    let (mut server, holdfast, client) = setup(60.0).await;
    let peer = client.peer().clone();
    let outcome = within(pause(&holdfast, Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(outcome.code, 0, "{}", outcome.message);

    // Killed: the listener and every connection gone at once, nothing answered.
    within(server.stop()).await;
    let ids = ["k1", "k2"];
    let calls = records(&peer, &ids);
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 2.0)
        .await;
    status_until(&holdfast, |s| s["upstream_gone"] == true).await;
    within(server.restart()).await;
    for call in calls {
        within(call).await.expect("the held call's task");
    }
    assert_ran_once(&server, &ids);
    assert_eq!(
        holdfast
            .metric("holdfast_upstream_failures_total{reason=\"upstream_reset\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_call_that_outlives_the_drain_timeout_is_named_and_not_cut() {
    let (server, holdfast, client) = setup(60.0).await;
    let peer = client.peer().clone();
    let slow = tokio::spawn({
        let peer = peer.clone();
        async move { call_wait(&peer).await }
    });
    // In JSON mode the server records a request only once it answers: holdfast's own count of
    // what is in flight says the call is out.
    status_until(&holdfast, |s| s["in_flight"] == 1).await;

    let outcome = within(pause(&holdfast, Duration::from_millis(200)))
        .await
        .unwrap();
    // A call is still in flight: recreating the server now would cut it.
    assert_eq!(outcome.code, EXIT_CALLS_IN_FLIGHT, "{}", outcome.message);
    assert!(
        outcome.message.contains("calls are still in flight")
            && outcome.message.contains("1 of them calls")
            && outcome.message.contains("POST for"),
        "{}",
        outcome.message
    );
    // A second pause is harmless: it reports, and counts no second pause.
    let again = within(pause(&holdfast, Duration::ZERO)).await.unwrap();
    assert_eq!(again.code, EXIT_CALLS_IN_FLIGHT, "{}", again.message);
    assert!(
        again.message.starts_with("already paused"),
        "{}",
        again.message
    );
    assert_eq!(
        holdfast
            .metric("holdfast_pauses_total{outcome=\"drain_timeout\"}")
            .await,
        1.0
    );
    assert!(!slow.is_finished(), "not cut off");

    let resumed = within(client::resume(holdfast.admin, None)).await;
    assert_eq!(resumed.code, 0);
    assert_eq!(resumed.message, "resumed");
    let again = within(client::resume(holdfast.admin, None)).await;
    assert_eq!(
        (again.code, again.message.as_str()),
        (0, "not paused: nothing to resume")
    );

    server.release_waits(1);
    assert_eq!(
        within(slow).await.unwrap().expect("the slow call"),
        "released"
    );
    let calls = records(&peer, &["after"]);
    for call in calls {
        within(call).await.expect("a call after resume");
    }
    assert_ran_once(&server, &["after"]);
}

#[tokio::test]
async fn pause_max_secs_releases_the_held_calls_to_whatever_answers() {
    let (server, holdfast, client) = setup(1.0).await;
    let peer = client.peer().clone();
    let outcome = within(pause(&holdfast, Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(outcome.code, 0, "{}", outcome.message);
    let calls = records(&peer, &["m"]);
    // The server never went away: the pause ends by itself and the call goes to it.
    for call in calls {
        within(call).await.expect("the held call's task");
    }
    assert_ran_once(&server, &["m"]);
    assert_eq!(
        holdfast
            .metric("holdfast_holds_total{outcome=\"released\"}")
            .await,
        1.0,
        "held, then released by the pause's end"
    );
    assert_eq!(status(&holdfast).await["paused"], false);
    assert_eq!(holdfast.metric("holdfast_outages_total").await, 0.0);
}

/// Runs the real binary with `args` and `env` off the runtime (holdfast serves on it meanwhile).
async fn run_binary(args: &[&str], env: &[(&str, &str)]) -> crate::support::process::Finished {
    let mut cmd = crate::support::process::holdfast(args);
    cmd.envs(env.iter().copied());
    tokio::task::spawn_blocking(move || crate::support::process::finish(cmd, "holdfast"))
        .await
        .expect("the binary's thread")
}

#[tokio::test]
async fn the_binary_pauses_and_resumes_with_the_token_and_is_refused_without() {
    let dir = crate::support::files::TempDir::new("pause-token");
    let token_file = dir.write("token", "pause-token-0123456789abcdef\n");
    let token_file = token_file.to_str().unwrap();
    let server = McpServer::start_with(crate::support::mcp::Options {
        mode: Mode::StatelessJson,
        ..Default::default()
    })
    .await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.admin_token_file = Some(token_file.into());
    let holdfast = Holdfast::start_with(raw).await;
    let admin = holdfast.admin.to_string();

    let refused = run_binary(&["pause", "--admin", &admin, "--drain-timeout", "1"], &[]).await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("needs the admin token"),
        "{refused:?}"
    );
    assert_eq!(status(&holdfast).await["paused"], false, "nothing changed");

    let with_token = [("HOLDFAST_ADMIN_TOKEN_FILE", token_file)];
    let paused = run_binary(
        &["pause", "--admin", &admin, "--drain-timeout", "1"],
        &with_token,
    )
    .await;
    assert_eq!(paused.status.code(), Some(0), "{paused:?}");
    assert!(
        paused.stdout.starts_with("paused; nothing in flight"),
        "{paused:?}"
    );
    assert_eq!(status(&holdfast).await["paused"], true);

    let resumed = run_binary(&["resume", "--admin", &admin], &with_token).await;
    assert_eq!(resumed.status.code(), Some(0), "{resumed:?}");
    assert_eq!(resumed.stdout.trim(), "resumed");
    assert_eq!(status(&holdfast).await["paused"], false);

    // Nothing listening: could not pause, and says where it asked.
    let closed = http::Reserved::new();
    let nowhere = closed.addr.to_string();
    let unreachable = run_binary(&["pause", "--admin", &nowhere], &[]).await;
    assert_eq!(unreachable.status.code(), Some(1), "{unreachable:?}");
    assert!(
        unreachable.stderr.contains("cannot reach"),
        "{unreachable:?}"
    );
}

#[tokio::test]
async fn status_shows_the_upstream_and_its_outage() {
    let port = http::Reserved::new();
    let hf = Holdfast::start(&port.url()).await;
    let got = status(&hf).await;
    assert_eq!(got["upstream"]["url"], port.url());
    assert_eq!(got["upstream"]["up"], true, "{got}");
    assert!(got["upstream"]["outage_reason"].is_null(), "{got}");

    // A request meets the refused port: an outage is open, and /status says which, and since
    // when (not before this instant).
    let before = tokio::time::Instant::now();
    let url = hf.url("/mcp");
    let held = tokio::spawn(async move {
        http::post_json(&url, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await
    });
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    let got = status(&hf).await;
    assert_eq!(got["upstream"]["up"], false, "{got}");
    assert_eq!(got["upstream"]["outage_reason"], "connect_refused", "{got}");
    let age = got["upstream"]["outage_secs"].as_f64().unwrap();
    assert!(
        age <= before.elapsed().as_secs_f64() + 0.001,
        "the outage began after the request was sent: {got}"
    );
    // It is an age: a later look sees it no younger.
    let later = status(&hf).await["upstream"]["outage_secs"]
        .as_f64()
        .unwrap();
    assert!(later >= age, "{later} after {age}");

    let back = http::Upstream::serve(port.listen(), |_| async {
        http::response(200, &[("content-type", "application/json")], "{}")
    });
    assert_eq!(within(held).await.unwrap().status, 200);
    assert_eq!(status(&hf).await["upstream"]["up"], true);
    back.stop().await;
}

/// A client's standalone GET stream carries no call, and its client opens it again: a pause that
/// times out with only such streams in flight says so with its own exit status, on which the
/// recipes go on (a call in flight is [`EXIT_CALLS_IN_FLIGHT`]).
#[tokio::test]
async fn a_pause_with_only_get_streams_left_exits_3() {
    let (upstream, mut streams) = crate::sse::sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let mut events =
        crate::sse::Events::new(crate::sse::open(&holdfast, crate::sse::Client::H1).await);
    let tx = within(streams.recv()).await.unwrap();
    crate::sse::push(&tx, 1).await;
    assert_eq!(events.next().await, crate::sse::event(1));

    let outcome = within(pause(&holdfast, Duration::from_millis(100)))
        .await
        .unwrap();
    assert_eq!(outcome.code, EXIT_STREAMS_ONLY, "{}", outcome.message);
    assert!(
        outcome.message.contains("only GET streams") && outcome.message.contains("0 of them calls"),
        "{}",
        outcome.message
    );
    // The stream goes on through the pause.
    crate::sse::push(&tx, 2).await;
    assert_eq!(events.next().await, crate::sse::event(2));
}
