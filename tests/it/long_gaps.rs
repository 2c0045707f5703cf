//! Long recreations (docs/holding.md "How long the client waits"), with the official TypeScript
//! SDK client in front of the Python SDK server, each call's runs in the server's ledger:
//! - a recreation longer than holdfast's old 15 s hold: gone for 20 s (an image pulled, a cache
//!   warmed), with holdfast's default settings. The call is held through the whole gap (the client
//!   waits 60 s) and runs once when the server is back, on the session holdfast re-established.
//!   With the old default the call got a 503 at 15 s;
//! - a recreation longer than the client waits, scaled down: holdfast's 503 comes first;
//! - a held call its client gave up on is never sent: the call times out on the client's side (a
//!   per-call timeout; the SDK's default is 60 s) and the SDK sends `notifications/cancelled` for
//!   it, but keeps the call's connection open. holdfast takes the call out of the hold on that
//!   cancellation and answers the cancellation itself; when the server is back the call does not
//!   run for nobody.

use std::time::Duration;

use serde_json::json;

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::python::PyServer;

/// The recreation's length: the scenario itself, not a wait for an event.
const GAP: Duration = Duration::from_secs(20);

/// The server, holdfast in front of it (`hold_secs`: its hold, else the default) and the client,
/// after one call that ran; the ledger's folder lives as long as its binding.
struct Stack {
    _ledger: TempDir,
    server: PyServer,
    holdfast: Holdfast,
    client: PeerClient,
}

async fn started(tag: &str, hold_secs: Option<f64>) -> Stack {
    let ledger = TempDir::new(tag);
    let server = PyServer::start(&ledger.path().join("ledger")).await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    if let Some(secs) = hold_secs {
        raw.hold.timeout_secs = secs;
    }
    let holdfast = Holdfast::start_with(raw).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    assert_eq!(
        client.call("record", json!({ "n": 1 })).await,
        Ok("record 1".into())
    );
    Stack {
        _ledger: ledger,
        server,
        holdfast,
        client,
    }
}

#[tokio::test]
async fn a_twenty_second_recreation_loses_no_call_with_the_default_hold() {
    let Stack {
        mut server,
        holdfast,
        mut client,
        _ledger,
    } = started("long-gap", None).await;

    server.kill().await;
    client.send(json!({ "op": "call", "tool": "record", "args": { "n": 2 } }));
    let held = "holdfast_held_requests";
    holdfast.metric_until(held, |n| n >= 1.0).await;
    tokio::time::sleep(GAP).await;
    server.start_again().await;
    let answer = client.result().await;
    assert_eq!(answer, Ok("record 2".into()), "{}", client.trace());
    assert_eq!(
        client.call("record", json!({ "n": 3 })).await,
        Ok("record 3".into())
    );
    let ran: Vec<u64> = server.ledger().iter().map(|r| r.n).collect();
    assert_eq!(ran, [1, 2, 3], "each call ran once");
    let timed_out = "holdfast_holds_total{outcome=\"timed_out\"}";
    assert_eq!(holdfast.metric(timed_out).await, 0.0);
}

/// A recreation longer than the client waits, scaled down tenfold: the default hold (50 s) is
/// below the TypeScript SDK client's 60 s, here 5 s below a per-call 6 s, with a gap of 7 s (for
/// 70 s). The client gets holdfast's 503 saying the call did not run, before its own timeout
/// would leave it guessing, and the call never runs, not even once the server is back.
#[tokio::test]
async fn a_recreation_longer_than_the_client_waits_gets_the_503_first() {
    let Stack {
        mut server,
        holdfast,
        mut client,
        _ledger,
    } = started("longer-gap", Some(5.0)).await;

    server.kill().await;
    let call = json!({ "op": "call", "tool": "record", "args": { "n": 2 }, "timeout": 6000 });
    client.send(call);
    let answer = client.result().await;
    let error = answer.expect_err("the hold ended before the server came back");
    assert!(
        error.contains("temporarily unavailable"),
        "holdfast's 503, not the client's timeout: {error}"
    );
    // The call's hold, and perhaps already the one of the client's GET stream, which holdfast
    // asks for again meanwhile.
    let timed_out = "holdfast_holds_total{outcome=\"timed_out\"}";
    assert!(holdfast.metric(timed_out).await >= 1.0);

    // The rest of the 7 s recreation (the scenario itself, not a wait for an event).
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.start_again().await;
    assert_eq!(
        client.call("record", json!({ "n": 3 })).await,
        Ok("record 3".into())
    );
    let ran: Vec<u64> = server.ledger().iter().map(|r| r.n).collect();
    assert_eq!(ran, [1, 3], "the call answered 503 never ran");
}

#[tokio::test]
async fn a_held_call_its_client_cancelled_is_never_sent() {
    let Stack {
        mut server,
        holdfast,
        mut client,
        _ledger,
    } = started("hold-cancelled", Some(60.0)).await;

    server.kill().await;
    client.send(json!({ "op": "call", "tool": "record", "args": { "n": 2 }, "timeout": 1500 }));
    let gave_up = client.result().await;
    let error = gave_up.expect_err("the client's own timeout");
    assert!(error.contains("timed out"), "{error}");
    let cancelled = "holdfast_holds_total{outcome=\"cancelled\"}";
    holdfast.metric_until(cancelled, |n| n >= 1.0).await;

    server.start_again().await;
    assert_eq!(
        client.call("record", json!({ "n": 3 })).await,
        Ok("record 3".into()),
        "{}",
        client.trace()
    );
    let ran: Vec<u64> = server.ledger().iter().map(|r| r.n).collect();
    assert_eq!(ran, [1, 3], "the cancelled call never ran");
    assert_eq!(holdfast.metric(cancelled).await, 1.0);
}
