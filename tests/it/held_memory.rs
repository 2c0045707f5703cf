//! What a full hold costs in memory, measured on the release binary as it ships: holdfast with
//! its default configuration holds `hold.max_requests` tool calls (each on its own connection,
//! as that many clients would send them) while the upstream refuses connections, then releases
//! them all. Its resident set must stay within the budget the README derives the defaults from,
//! while held and at its peak during the release. The benchmark (`benches/release.rs`) reports
//! the per-request figure; this test only checks the bound.

use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use holdfast::config::defaults;

use crate::support::http::{response, Reserved, Upstream};
use crate::support::process::{release_binary, serving_at, Running};
use crate::support::proxy::metric_until_at;
use crate::support::within_secs;

/// The README's budget for a full hold and its release, over the process's own footprint at
/// rest: `hold.max_requests` × 8 KiB (the cost per held and released request the defaults are
/// derived from, issue 11's target; 7.4 KiB measured at the release peak), plus slack for the
/// allocator and the runtime. `hold.max_buffered_bytes` is a separate, byte-counted bound; these
/// bodies are small.
const PER_REQUEST_KIB: u64 = 8;
const SLACK_KIB: u64 = 8 * 1024;

const TOOL_CALL: &str =
    r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_hold_and_its_release_fit_the_memory_budget() {
    let held = defaults::HOLD_MAX_REQUESTS;
    // One descriptor per client connection on this side too.
    let files = holdfast::rlimit::raise_open_files(0).unwrap();
    assert!(
        files.now >= held as u64 + 64,
        "this test opens {held} connections: raise the hard open-file limit"
    );
    let upstream = Reserved::new();
    let mut cmd = serving_at(&release_binary(), &upstream.url(), &[]);
    cmd.env("RUST_LOG", "info");
    // Each worker thread has its own allocator arenas, which grow under load: the budget is
    // for two workers (this machine's), whatever the machine running the test has.
    cmd.env("TOKIO_WORKER_THREADS", "2");
    let mut proxy = Running::start(&mut cmd);
    let started: Value = serde_json::from_str(&proxy.wait_for_line("holdfast proxying")).unwrap();
    let listen = started["listen"].as_str().unwrap().to_string();
    let admin = started["admin"].as_str().unwrap().to_string();
    let pid = proxy.pid();
    let at_rest = status_kib(pid, "VmRSS");

    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {listen}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: s-1\r\n\
         Connection: close\r\n\
         Content-Length: {}\r\n\r\n{TOOL_CALL}",
        TOOL_CALL.len()
    );
    let mut clients = JoinSet::new();
    for _ in 0..held {
        let (listen, request) = (listen.clone(), request.clone());
        clients.spawn(async move {
            let mut stream = TcpStream::connect(&listen).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await.unwrap();
            answer
        });
    }
    metric_until_at(&admin, "holdfast_held_requests", |v| v >= held as f64).await;
    let holding = status_kib(pid, "VmRSS");
    eprintln!("all {held} held");

    let started_release = Instant::now();
    let back = Upstream::serve(upstream.listen(), |_| async {
        response(
            200,
            &[("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#,
        )
    });
    let mut ok = 0;
    within_secs(120, async {
        while let Some(answer) = clients.join_next().await {
            let answer = Bytes::from(answer.unwrap());
            assert!(
                answer.starts_with(b"HTTP/1.1 200 "),
                "every held call is answered by the application: {:?}",
                String::from_utf8_lossy(&answer)
            );
            ok += 1;
        }
    })
    .await;
    assert_eq!(ok, held);
    let peak = status_kib(pid, "VmHWM");
    let budget = at_rest + held as u64 * PER_REQUEST_KIB + SLACK_KIB;
    eprintln!(
        "{held} held: at rest {at_rest} KiB, held {holding} KiB ({:.1} KiB each), peak {peak} KiB \
         ({:.1} KiB each), released in {:?}",
        (holding - at_rest) as f64 / held as f64,
        (peak - at_rest) as f64 / held as f64,
        started_release.elapsed(),
    );
    assert!(
        holding <= budget,
        "{held} held requests: {holding} KiB resident, over the budget {budget} KiB"
    );
    assert!(
        peak <= budget,
        "releasing {held} held requests peaked at {peak} KiB, over the budget {budget} KiB"
    );
    back.stop().await;
}

/// A `/proc/PID/status` field in KiB (`VmRSS`: resident now; `VmHWM`: the resident peak).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}
