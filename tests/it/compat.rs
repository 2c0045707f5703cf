//! The compatibility matrix: real MCP servers people deploy, recreated behind a Traefik-like
//! router while real clients call them through holdfast. What each server answers for a session
//! it forgot differs (docs/compatibility.md#forgotten-sessions: 404 from most, 400 from the
//! reference everything server and one-transport TypeScript servers); every pairing must lose no
//! call, and run each call exactly once.
//!
//! A recreation, as Traefik's Docker provider shows it: the route disappears (Traefik's 404), the
//! container gets SIGTERM and starts again with no sessions, the route comes back. One call is
//! made while the route is gone, so it is held through the recreation. The router's log shows
//! every request the server answered, so "ran once" is counted where the server is, whatever the
//! server (none of these keeps a ledger).
//!
//! The controls run the same recreation with the client straight at the router: the calls after
//! it fail, which is what holdfast is for.

use std::sync::atomic::Ordering;

use serde_json::Value;

use crate::support::clients::{Peer, PeerClient};
use crate::support::proxy::Holdfast;
use crate::support::router::{FakeRouter, Routed};
use crate::support::stacks::{Stack, StackServer};
use crate::support::within;

/// The stateless revision: no session.
const MODERN: &str = "2026-07-28";

/// Calls before the recreation, one during it, and calls after it.
const BEFORE: u64 = 3;
const AFTER: u64 = 3;

/// Whether `routed` is a `tools/call` of `tool` with `args`.
fn is_call(routed: &Routed, tool: &str, args: &Value) -> bool {
    let Ok(body) = serde_json::from_slice::<Value>(&routed.body) else {
        return false;
    };
    body["method"] == "tools/call"
        && body["params"]["name"] == tool
        && &body["params"]["arguments"] == args
}

/// How often call `n` reached the server and was answered with a success.
fn runs(router: &FakeRouter, stack: Stack, n: u64) -> usize {
    let (tool, args, _) = stack.call(n);
    router
        .log()
        .iter()
        .filter(|r| is_call(r, tool, &args) && r.status.is_some_and(|s| s.is_success()))
        .count()
}

/// What one pairing went through: each call's outcome, in order.
struct Run {
    outcomes: Vec<Result<String, String>>,
    /// The revision the client settled on, where it says: a 2026-07-28 client has no session.
    era: Option<String>,
    /// Sessions the client opened before the server was recreated (initializes it answered).
    opened: usize,
}

/// Calls the stack's tool `BEFORE` times, once more while the server is recreated behind the
/// router, then `AFTER` times; `url` is where the client connects (holdfast, or the router).
async fn recreate_under(
    peer: Peer,
    stack: Stack,
    server: &mut StackServer,
    router: &FakeRouter,
    url: &str,
) -> Run {
    let mut client = PeerClient::start_peer(peer, url).await;
    let era = client.era().map(str::to_owned);
    let mut outcomes = Vec::new();
    for n in 0..BEFORE {
        let (tool, args, _) = stack.call(n);
        outcomes.push(client.call(tool, args).await);
    }
    // The route goes, the container is recreated, and a call arrives in the gap.
    let opened = router
        .log()
        .iter()
        .filter(|r| {
            r.rpc_method().as_deref() == Some("initialize")
                && r.status.is_some_and(|s| s.is_success())
        })
        .count();
    router.missing.store(true, Ordering::SeqCst);
    let (tool, args, _) = stack.call(BEFORE);
    let mut command = serde_json::json!({ "op": "call", "tool": tool, "args": args });
    if args.is_null() {
        command.as_object_mut().unwrap().remove("args");
    }
    client.send(command);
    within(server.restart()).await;
    router.missing.store(false, Ordering::SeqCst);
    outcomes.push(client.result().await);
    for n in BEFORE + 1..=BEFORE + AFTER {
        let (tool, args, _) = stack.call(n);
        outcomes.push(client.call(tool, args).await);
    }
    let trace = client.trace();
    // The client's own close: a failed DELETE is not a lost call, and the controls' sessions
    // are gone.
    let _ = client.close().await;
    if outcomes.iter().any(Result::is_err) {
        eprintln!("{} trace:\n{trace}", peer.name());
    }
    Run {
        outcomes,
        era,
        opened,
    }
}

/// One pairing through holdfast: every call succeeds with its own answer and ran exactly once.
async fn no_call_lost(stack: Stack, peer: Peer) {
    let mut server = StackServer::start(stack).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = Holdfast::start(&format!("http://{}", router.addr)).await;
    let run = recreate_under(peer, stack, &mut server, &router, &holdfast.url("/mcp")).await;
    for (n, outcome) in (0..).zip(&run.outcomes) {
        let (_, _, expected) = stack.call(n);
        assert_eq!(
            outcome.as_deref(),
            Ok(expected.as_str()),
            "{} through holdfast to {}, call {n}; server:\n{}",
            peer.name(),
            stack.name(),
            server.trace()
        );
        assert_eq!(
            runs(&router, stack, n),
            1,
            "call {n} ran once on {}",
            stack.name()
        );
    }
    // A 2026-07-28 client (the Python SDK's default against a server of both eras) has no
    // session to lose. A 2025 client's session is re-established once; a client that opened
    // more than one (mcp-remote opens two, and keeps the first's event stream) may have each
    // re-established, as the abandoned one's stream reconnects: whether that one is counted yet
    // when this reads depends on the client's reconnect delay, not on holdfast.
    let resumed = holdfast
        .metric("holdfast_session_resumes_total{outcome=\"resumed\"}")
        .await;
    let expected = if run.era.as_deref() == Some(MODERN) {
        0.0..=0.0
    } else {
        1.0..=run.opened as f64
    };
    assert!(
        expected.contains(&resumed),
        "{} forgot the sessions, and holdfast re-established {resumed} of the {} the client \
         opened (client era {:?})",
        stack.name(),
        run.opened,
        run.era
    );
}

/// The same recreation with the client straight at the router: the client loses calls.
async fn calls_lost_without_holdfast(stack: Stack, peer: Peer) {
    let mut server = StackServer::start(stack).await;
    let router = FakeRouter::start(server.addr()).await;
    let url = format!("http://{}/mcp", router.addr);
    let run = recreate_under(peer, stack, &mut server, &router, &url).await;
    let failed = run.outcomes.iter().filter(|o| o.is_err()).count();
    assert!(
        run.outcomes[..BEFORE as usize].iter().all(Result::is_ok),
        "before the recreation every call works: {:?}",
        run.outcomes
    );
    assert!(
        failed > AFTER as usize,
        "{} straight to {}: the call in the gap and every call after it fail, got {:?}",
        peer.name(),
        stack.name(),
        run.outcomes
    );
}

#[tokio::test]
async fn everything_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::Everything, Peer::TsSdk).await;
}

#[tokio::test]
async fn everything_server_with_the_python_sdk_client() {
    no_call_lost(Stack::Everything, Peer::PySdk).await;
}

#[tokio::test]
async fn everything_server_with_fastmcps_client() {
    no_call_lost(Stack::Everything, Peer::Fastmcp).await;
}

#[tokio::test]
async fn everything_server_with_mcp_remote() {
    no_call_lost(Stack::Everything, Peer::McpRemote).await;
}

#[tokio::test]
async fn one_transport_ts_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::SdkOneTransport, Peer::TsSdk).await;
}

#[tokio::test]
async fn one_transport_ts_server_with_the_python_sdk_client() {
    no_call_lost(Stack::SdkOneTransport, Peer::PySdk).await;
}

#[tokio::test]
async fn sdk_example_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::SdkExample, Peer::TsSdk).await;
}

#[tokio::test]
async fn sdk_example_server_with_the_python_sdk_client() {
    no_call_lost(Stack::SdkExample, Peer::PySdk).await;
}

#[tokio::test]
async fn python_sdk_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::PySdk, Peer::TsSdk).await;
}

#[tokio::test]
async fn python_sdk_server_with_the_python_sdk_client() {
    no_call_lost(Stack::PySdk, Peer::PySdk).await;
}

#[tokio::test]
async fn python_sdk_server_with_the_python_sdk_client_on_the_handshake() {
    no_call_lost(Stack::PySdk, Peer::PySdkHandshake).await;
}

#[tokio::test]
async fn fastmcp_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::Fastmcp, Peer::TsSdk).await;
}

#[tokio::test]
async fn fastmcp_server_with_the_python_sdk_client() {
    no_call_lost(Stack::Fastmcp, Peer::PySdk).await;
}

#[tokio::test]
async fn fastmcp_server_with_the_python_sdk_client_on_the_handshake() {
    no_call_lost(Stack::Fastmcp, Peer::PySdkHandshake).await;
}

#[tokio::test]
async fn fastmcp_ts_server_with_the_ts_sdk_client() {
    no_call_lost(Stack::FastmcpTs, Peer::TsSdk).await;
}

#[tokio::test]
async fn fastmcp_ts_server_with_the_python_sdk_client() {
    no_call_lost(Stack::FastmcpTs, Peer::PySdk).await;
}

#[tokio::test]
async fn without_holdfast_the_everything_server_loses_the_ts_sdk_clients_calls() {
    calls_lost_without_holdfast(Stack::Everything, Peer::TsSdk).await;
}

#[tokio::test]
async fn without_holdfast_the_everything_server_loses_the_python_sdk_clients_calls() {
    calls_lost_without_holdfast(Stack::Everything, Peer::PySdk).await;
}
