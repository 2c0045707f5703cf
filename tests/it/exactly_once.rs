//! Exactly once under a backend killed at the instant a call reaches it (issue 10): a real rmcp
//! server, stopped the way a killed process stops (its listener and every connection closed,
//! nothing answered), many times in a loop, with a ledger of every tool run.
//!
//! - A call the server read and never ran is an honest failure for a tool that is not safe to
//!   run twice (`record`): it must not have run, and no call may run twice.
//! - A call to a tool the server announced read-only (`lookup`) or idempotent (`put`) never
//!   fails: holdfast sends it once more, and holds it until the server is back.

use std::time::Duration;

use rmcp::service::Peer;
use rmcp::RoleClient;

use crate::support::mcp::{call_ledger, connect, McpServer, Mode, Options};
use crate::support::proxy::Holdfast;
use crate::support::within;

/// How long the killed backend stays down before it is back: long enough that the call sent
/// once more meets a refused connection and is held.
const DOWN: Duration = Duration::from_millis(40);

/// Calls `tool` with `id` while the server dies the instant it has read that call, then comes
/// back after [`DOWN`]. Returns the call's outcome.
async fn call_into_a_death(
    server: &mut McpServer,
    peer: &Peer<RoleClient>,
    tool: &'static str,
    id: String,
) -> Result<String, rmcp::ServiceError> {
    let died = server.die_on_next(&format!("\"{id}\""));
    let call = tokio::spawn({
        let peer = peer.clone();
        async move { call_ledger(&peer, tool, &id).await }
    });
    within(died).await.expect("the server read the call");
    within(server.stop()).await;
    tokio::time::sleep(DOWN).await;
    within(server.restart()).await;
    within(call).await.expect("the call's task")
}

async fn setup(
    mode: Mode,
) -> (
    McpServer,
    Holdfast,
    rmcp::service::RunningService<RoleClient, ()>,
) {
    let server = McpServer::start_with(Options {
        mode,
        ..Options::default()
    })
    .await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let client = within(connect(&holdfast.url("/mcp")))
        .await
        .expect("connect");
    // The answer that teaches holdfast which tools are safe passes through it first.
    let tools = within(client.peer().list_all_tools())
        .await
        .expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "lookup"));
    (server, holdfast, client)
}

async fn assert_exactly_once_under_deaths(mode: Mode) {
    let (mut server, holdfast, client) = setup(mode).await;
    let peer = client.peer().clone();
    const ROUNDS: usize = 5;
    let mut record_failures = 0;
    for round in 0..ROUNDS {
        for tool in ["record", "lookup", "put"] {
            let id = format!("{tool}-{round}");
            let outcome = call_into_a_death(&mut server, &peer, tool, id.clone()).await;
            let ran = server
                .runs()
                .get(&format!("{tool}:{id}"))
                .copied()
                .unwrap_or(0);
            match tool {
                // Read, never run: holdfast cannot prove that, so the client is told it
                // failed; and it indeed never ran.
                "record" => {
                    assert!(outcome.is_err(), "{id}: {outcome:?}");
                    assert_eq!(ran, 0, "{id} never ran");
                    record_failures += 1;
                }
                // Safe to run twice: sent once more, held through the death, answered.
                _ => {
                    assert_eq!(outcome.expect("a safe call never fails"), id);
                    assert_eq!(ran, 1, "{id}: the first attempt died before it ran");
                }
            }
        }
    }
    let retried = holdfast
        .metric("holdfast_safe_retries_total{kind=\"annotated_tool\"}")
        .await;
    assert_eq!(retried, (2 * ROUNDS) as f64);
    let failed = holdfast
        .metric("holdfast_upstream_failures_total{reason=\"upstream_reset\"}")
        .await;
    assert_eq!(failed, record_failures as f64);
    // After all that, ordinary calls work and run once each.
    for n in 0..3 {
        let id = format!("after-{n}");
        assert_eq!(within(call_ledger(&peer, "record", &id)).await.unwrap(), id);
        assert_eq!(server.runs()[&format!("record:{id}")], 1);
    }
    eprintln!(
        "exactly_once ({mode:?}): {} deaths; record failed {record_failures} times, never ran \
         twice; lookup and put never failed",
        3 * ROUNDS
    );
    within(client.cancel()).await.expect("close");
}

#[tokio::test]
async fn a_json_server_killed_as_it_reads_each_call() {
    assert_exactly_once_under_deaths(Mode::StatelessJson).await;
}

/// Stateful: the tools/list answer is an SSE stream (learning reads its events), and every
/// death also costs the session, which holdfast re-establishes.
#[tokio::test]
async fn a_stateful_server_killed_as_it_reads_each_call() {
    assert_exactly_once_under_deaths(Mode::Stateful).await;
}

/// Deaths at random instants around each call (before it arrives, while it runs, after it
/// answered), JSON answers: whatever the instant, nothing runs twice unless it is safe to,
/// every call that succeeded ran, and the safe tools never fail.
#[tokio::test]
async fn deaths_at_random_instants_never_run_a_call_twice() {
    let (mut server, holdfast, client) = setup(Mode::StatelessJson).await;
    let peer = client.peer().clone();
    let mut rng = fastrand::Rng::with_seed(10);
    let mut outcomes = Vec::new();
    for n in 0..30 {
        let tool = ["record", "lookup", "put"][n % 3];
        let id = format!("{tool}-{n}");
        let call = tokio::spawn({
            let (peer, id) = (peer.clone(), id.clone());
            async move { call_ledger(&peer, tool, &id).await }
        });
        tokio::time::sleep(Duration::from_micros(rng.u64(0..3000))).await;
        within(server.stop()).await;
        tokio::time::sleep(DOWN).await;
        within(server.restart()).await;
        let outcome = within(call).await.expect("the call's task");
        outcomes.push((tool, id, outcome));
    }
    let runs = server.runs();
    let mut failed = 0;
    for (tool, id, outcome) in &outcomes {
        let ran = runs.get(&format!("{tool}:{id}")).copied().unwrap_or(0);
        match (*tool, outcome) {
            ("record", Ok(answer)) => {
                assert_eq!(answer, id);
                assert_eq!(ran, 1, "{id} succeeded, so it ran exactly once");
            }
            ("record", Err(_)) => {
                assert!(ran <= 1, "{id} ran {ran} times");
                failed += 1;
            }
            (_, Ok(answer)) => {
                assert_eq!(answer, id);
                assert!((1..=2).contains(&ran), "{id} ran {ran} times");
            }
            (_, Err(error)) => panic!("{id}: a safe call failed: {error:?}"),
        }
    }
    eprintln!(
        "exactly_once random deaths: 30 calls, {failed} of 10 record calls failed, none ran \
         twice; lookup and put never failed; holdfast sent {} once more",
        holdfast
            .metric("holdfast_safe_retries_total{kind=\"annotated_tool\"}")
            .await
    );
    within(client.cancel()).await.expect("close");
}
