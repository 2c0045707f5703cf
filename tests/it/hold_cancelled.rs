//! A held call its client gave up on is never sent (docs/holding.md "Clients that give up"): the
//! official TypeScript SDK client's call, held while the Python SDK server is down, times out on
//! the client's side (a per-call timeout here; the SDK's default is 60 s) and the SDK sends
//! `notifications/cancelled` for it, but keeps the call's connection open. holdfast takes the call
//! out of the hold on that cancellation and answers the cancellation itself; when the server is
//! back the call does not run for nobody.

use serde_json::json;

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::python::PyServer;

#[tokio::test]
async fn a_held_call_its_client_cancelled_is_never_sent() {
    let ledger = TempDir::new("hold-cancelled");
    let mut server = PyServer::start(&ledger.path().join("ledger")).await;
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.hold.timeout_secs = 60.0;
    let holdfast = Holdfast::start_with(raw).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    assert_eq!(
        client.call("record", json!({ "n": 1 })).await,
        Ok("record 1".into())
    );

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
