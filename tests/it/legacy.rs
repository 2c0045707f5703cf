//! A legacy MCP server (the deprecated 2024-11-05 HTTP+SSE transport) behind a router and
//! holdfast, with the official TypeScript SDK on both ends (`SSEServerTransport`,
//! `SSEClientTransport`). Its paths (`/sse`, `/messages`) are not `routes.endpoints`; holdfast
//! learns them from the stream's `endpoint` event, so while the server restarts the router's
//! route-missing 404 on them never reaches the client, and the server's own "unknown session"
//! 404 after the restart does, unchanged.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::node::TsServer;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::router::{FakeRouter, Routed};
use crate::support::LIMIT;

/// Waits until the router has seen a request `seen` is true for (polling its log: it records
/// every request as it arrives).
async fn until_routed(router: &FakeRouter, what: &str, seen: impl Fn(&Routed) -> bool) {
    let wait = async {
        while !router.log().iter().any(&seen) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(LIMIT, wait).await.is_err() {
        panic!(
            "no {what} within {LIMIT:?}; the router saw {:#?}",
            router.log()
        );
    }
}

/// A `tools/call` POST to `/messages`.
fn is_call(r: &Routed) -> bool {
    r.path == "/messages" && r.rpc_method().as_deref() == Some("tools/call")
}

#[tokio::test]
async fn a_legacy_servers_restart_never_shows_the_client_a_routers_404_and_its_own_404_passes() {
    let dir = TempDir::new("legacy");
    let mut server =
        TsServer::start_legacy(crate::support::ports::quiet(), &dir.path().join("ledger")).await;
    let router = FakeRouter::start(server.addr()).await;
    let mut raw = raw_config(&format!("http://{}", router.addr));
    // Only what the stream shows may make /sse and /messages expected routes: not learning
    // from answers (which would cover them too, for an hour after the last one).
    raw.routes.learn = false;
    raw.routes.behind_router = Some(true);
    let holdfast = Holdfast::start_with(raw).await;
    let mut client = PeerClient::start_legacy(&holdfast.url("/sse")).await;
    assert_eq!(client.count().await, Ok(1), "trace:\n{}", client.trace());

    // The container is recreated: its route vanishes from the router, then the server stops
    // (cutting the event stream). A call made now meets the router's 404.
    router.missing.store(true, Ordering::SeqCst);
    server.stop().await;
    client.send(serde_json::json!({ "op": "call", "tool": "count" }));
    until_routed(&router, "the call meeting the router's 404", |r| {
        is_call(r) && r.answered_404
    })
    .await;
    // Held, not answered: the router's 404 did not reach the client.
    holdfast
        .metric_until(
            "holdfast_rewrites_total{reason=\"route_missing_404\",action=\"held\"}",
            |v| v >= 1.0,
        )
        .await;

    server.start_again().await;
    router.missing.store(false, Ordering::SeqCst);
    // The held call goes to the new server, which does not know the old session: its own 404,
    // as the SDK's example sends it, is what the client gets.
    let outcome = client.result().await;
    let error = outcome.expect_err("the new server does not know the old session");
    assert!(
        error.contains("404") && error.contains("Session not found"),
        "the server's own answer, unchanged: {error}; trace:\n{}",
        client.trace()
    );
    let log = router.log();
    let forwarded: Vec<_> = log
        .iter()
        .filter(|r| is_call(r) && !r.answered_404)
        .collect();
    assert_eq!(
        forwarded.len(),
        2,
        "the call before the restart and the held one, each forwarded once: {log:#?}"
    );
    assert_eq!(server.ledger_lines(), 1, "only the first call ran");
    // No answer the client got was the router's (Traefik's 404 says `text/plain; charset=utf-8`,
    // the server's own `text/plain`).
    let trace = client.trace();
    assert!(
        !trace.contains("404 text/plain; charset=utf-8"),
        "the router's 404 reached the client:\n{trace}"
    );
}
