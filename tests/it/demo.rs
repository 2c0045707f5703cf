//! `holdfast demo` and `holdfast healthcheck`.

use std::time::Duration;

use holdfast::demo::{run, DemoOptions};

use crate::support::http::Reserved;
use crate::support::process::holdfast;
use crate::support::proxy::Holdfast;

#[tokio::test]
async fn the_demo_shows_failures_direct_and_none_through_holdfast() {
    let tally = run(DemoOptions {
        duration: Duration::from_secs(5),
        period: Duration::from_secs(2),
    })
    .await
    .unwrap();
    assert!(tally.direct_ok > 0 && tally.holdfast_ok > 0, "{tally:?}");
    assert!(
        tally.direct_failed > 0,
        "the direct client meets the 404 and refused windows: {tally:?}"
    );
    assert_eq!(tally.holdfast_failed, 0, "{tally:?}");
    // The client never re-initializes: its one session lived through every restart.
    assert_eq!(tally.holdfast_sessions, 1, "{tally:?}");
    assert!(tally.restarts >= 1, "{tally:?}");
    // At most one resume per restart (the run may end before the call that would resume).
    assert!(
        tally.resumed >= 1 && tally.resumed <= tally.restarts,
        "{tally:?}"
    );
    // The planned recreation: the call in flight completed, the pause drained, every call made
    // during the recreation succeeded.
    let planned = tally.planned;
    assert!(planned.slow_ok, "{planned:?}");
    assert_eq!(planned.pause_exit, 0, "{planned:?}");
    assert_eq!(
        (planned.held_ok, planned.held_failed),
        (holdfast::demo::DURING, 0),
        "{planned:?}"
    );
    assert_eq!(planned.restarts, 1, "{planned:?}");
    // The pod replacement: every call before and after it succeeded, the one held at the
    // leaving pod ran at its peer (once), the new holdfast re-established a session it never saw.
    let replaced = tally.replaced;
    assert_eq!(
        (replaced.ok, replaced.failed),
        (2 * holdfast::demo::replaced::CALLS + 1, 0),
        "{replaced:?}"
    );
    assert!(replaced.handed_off, "{replaced:?}");
    assert_eq!(replaced.peer_executed, 1, "{replaced:?}");
    assert!(replaced.reestablished, "{replaced:?}");
    assert_eq!(replaced.restarts, 1, "{replaced:?}");
    assert_eq!(
        tally.executed,
        tally.direct_ok + tally.holdfast_ok + planned.ok() + replaced.ok,
        "every successful call ran once and no failed one ran: {tally:?}"
    );
}

#[test]
fn the_demo_binary_runs_and_summarises() {
    let out = holdfast(&["demo", "--duration", "2", "--period", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("summary after"), "{stdout}");
    assert!(stdout.contains("through holdfast:"), "{stdout}");
    assert!(stdout.contains("session lived on"), "{stdout}");
    assert!(
        stdout.contains(
            "planned recreation with `holdfast pause`: the slow call in flight completed"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "pod replacement (holdfast and its backend): 7 calls ok, 0 failed, the one held at \
             the leaving pod answered by its peer"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("t=  1s"),
        "a live line per second: {stdout}"
    );
}

#[tokio::test]
async fn healthcheck_follows_readiness() {
    // An upstream port that stays ours and refuses: readiness is holdfast's own, not the
    // upstream's.
    let upstream = Reserved::new();
    let mut hf = Holdfast::start(&upstream.url()).await;
    let admin = hf.admin.to_string();
    let check = |admin: String| async move {
        tokio::task::spawn_blocking(move || {
            holdfast(&["healthcheck", "--admin", &admin])
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    let ok = check(admin.clone()).await;
    assert!(ok.status.success(), "{ok:?}");
    // The admin address from the environment works too, as the container image sets it: the
    // unspecified address the listener binds means "this host".
    let env = tokio::task::spawn_blocking({
        let port = hf.admin.port();
        move || {
            holdfast(&["healthcheck"])
                .env("HOLDFAST_ADMIN", format!("0.0.0.0:{port}"))
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(env.status.success(), "{env:?}");

    hf.begin_shutdown();
    hf.wait().await;
    let down = check(admin).await;
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    assert!(
        String::from_utf8_lossy(&down.stderr).contains("not ready"),
        "{down:?}"
    );
}
