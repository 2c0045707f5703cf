//! Calls made while a stateful server shuts down gracefully: the official Python SDK's server
//! under uvicorn, stopped with SIGTERM and started again on the same port, again and again.
//!
//! In the window between SIGTERM and uvicorn closing its listener the server still reads
//! requests on open connections, but sse-starlette ends every event stream at once: a tool call
//! is answered `200 text/event-stream` with no event, and the tool then runs anyway. Passed
//! through as it is, that leaves the client waiting for its own timeout (20-60 s) for an answer
//! that never comes. With holdfast each call is answered while its client waits: a call safe to
//! run twice (`lookup`, announced idempotent) is held and sent again to the new instance and
//! succeeds; any other (`record`) gets a prompt 502 saying it may have run, and ran once.
//!
//! Each test restarts the server [`RESTARTS`] times, a call going out right after every SIGTERM,
//! and checks every call, every restart: answered within the restart plus [`SLACK`], never run
//! twice (but `lookup` when it was sent again: once in the process going away, once in the new
//! one), never run after its client had its answer, and the window hit at least once (else the
//! test proved nothing).
//!
//! The last tests pin each answer down with an in-process upstream whose streams end as a
//! shutting-down server's do: at once (a 502, or held and sent again when safe), or after a
//! notification (a JSON-RPC error event added for the client).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::http as http_upstream;
use crate::support::mcp::{mcp_post, raw_http, RawResponse};
use crate::support::proxy::Holdfast;
use crate::support::python::{PyServer, Ran};

/// Restarts per test.
const RESTARTS: usize = 30;

/// Calls between two restarts.
const CALLS_BETWEEN: usize = 3;

/// What a call may take beyond the restart it met: one probe interval (`hold.backoff_max_ms`,
/// 250 ms) and a loaded two-core machine's scheduling. Far below any client's timeout (20 s for
/// the Java SDK, 60 s for the TypeScript SDK's default), which is what a call left waiting takes.
const SLACK: Duration = Duration::from_secs(5);

/// One call as a client saw it.
#[derive(Debug)]
struct Call {
    tool: &'static str,
    n: u64,
    /// The tool's text, or the client's error.
    outcome: Result<String, String>,
    /// How long the call took.
    took: Duration,
    /// When its answer arrived, in seconds since the Unix epoch.
    answered_at: f64,
    /// The restart it met, if it was made right after a SIGTERM: how long that took.
    restart: Option<Duration>,
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// The tool called right after the `i`th SIGTERM: both, by turns.
fn tool_after_sigterm(i: usize) -> &'static str {
    if i.is_multiple_of(2) {
        "lookup"
    } else {
        "record"
    }
}

/// The checks every test makes of its `calls` against the server's ledger.
fn check(calls: &[Call], ledger: &[Ran], trace: &str) {
    for call in calls {
        let ran: Vec<&Ran> = ledger
            .iter()
            .filter(|r| r.tool == call.tool && r.n == call.n)
            .collect();
        let bound = call.restart.unwrap_or_default() + SLACK;
        assert!(
            call.took <= bound,
            "{call:?} took longer than its restart plus {SLACK:?}"
        );
        // Nothing runs after its client was answered (a request sent after its client gave up
        // would run late): a call that ran did so before its answer, or within a moment of it
        // in the process that was shutting down (the Python SDK runs the tool after it ended
        // the stream).
        for r in &ran {
            assert!(
                r.at <= call.answered_at + 1.0,
                "{call:?} ran at {} after its client had its answer; ledger: {ran:?}",
                r.at
            );
        }
        match (&call.outcome, call.tool) {
            (Ok(text), _) => {
                assert_eq!(text, &format!("{} {}", call.tool, call.n), "{call:?}");
                if call.tool == "record" {
                    assert_eq!(ran.len(), 1, "{call:?} ran {} times: {ran:?}", ran.len());
                } else {
                    // Sent again after the stream that dropped its answer: it may have run in
                    // the process that was going away too, once, and held until that one was
                    // gone, never sent into it again. Or its connection broke (uvicorn closing
                    // the kept-alive connection it came on, seen once in CI): a call safe to run
                    // twice goes again at once, as after any reset, and the dying listener may
                    // still take it; a second break holds it for the new process. So at most
                    // twice in the process going away, once in the new one.
                    let newest = ran
                        .iter()
                        .max_by(|a, b| a.at.total_cmp(&b.at))
                        .map(|r| r.pid);
                    let in_newest = ran.iter().filter(|r| Some(r.pid) == newest).count();
                    let older: std::collections::BTreeSet<u32> = ran
                        .iter()
                        .map(|r| r.pid)
                        .filter(|pid| Some(*pid) != newest)
                        .collect();
                    let (in_older, alone) = (ran.len() - in_newest, older.is_empty());
                    assert!(
                        !ran.is_empty()
                            && older.len() <= 1
                            && in_older <= 2
                            && (in_newest == 1 || (alone && in_newest == 2)),
                        "{call:?} ran {} times: {ran:?}",
                        ran.len()
                    );
                }
            }
            (Err(error), "record") => {
                assert!(
                    call.restart.is_some(),
                    "{call:?} failed, and it met no restart; server:\n{trace}"
                );
                // Unanswered (its stream ended without the answer), or reset (uvicorn closed
                // the kept-alive connection it came on as it shut down, after the kernel had
                // taken the request in: no proxy can tell whether the server read it). Either
                // way a 502 at once that says it may have run.
                assert!(
                    error.contains("may have been executed")
                        && (error.contains("unanswered") || error.contains("upstream_reset")),
                    "{call:?}: a record call may fail only as unanswered or reset, saying it may \
                     have run"
                );
                assert!(ran.len() <= 1, "{call:?} ran {} times: {ran:?}", ran.len());
            }
            (Err(_), _) => {
                panic!("{call:?} failed: a lookup is safe to send again; server:\n{trace}")
            }
        }
    }
}

/// Requests whose stream ended unanswered that were held to be sent again.
const HELD_UNANSWERED: &str = "holdfast_rewrites_total{reason=\"unanswered\",action=\"held\"}";

/// Streams ended unanswered that a client got a failure for: a 502, or an added error event.
const FAILED_UNANSWERED: &str = "holdfast_upstream_failures_total{reason=\"unanswered\"}";

/// How often the window was hit: a stream ended unanswered (held, or answered 502).
async fn unanswered(holdfast: &Holdfast) -> f64 {
    holdfast.metric(HELD_UNANSWERED).await + holdfast.metric(FAILED_UNANSWERED).await
}

#[tokio::test]
async fn ts_client_calls_through_graceful_restarts_of_a_python_sdk_server() {
    let dir = TempDir::new("graceful-ts");
    let mut server = PyServer::start(&dir.path().join("ledger")).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = client.session_id().expect("a stateful server").to_owned();
    // The tools' annotations pass through holdfast: `lookup` is safe to send twice.
    client.send(json!({ "op": "list" }));
    assert_eq!(
        client.result().await,
        Ok("record,lookup,peek,put".to_owned())
    );

    let mut calls = Vec::new();
    let mut n = 0;
    for i in 0..RESTARTS {
        for _ in 0..CALLS_BETWEEN {
            n += 1;
            calls.push(ts_call(&mut client, "record", n).await);
        }
        server.sigterm();
        n += 1;
        let tool = tool_after_sigterm(i);
        let started = Instant::now();
        client.send(json!({ "op": "call", "tool": tool, "args": { "n": n } }));
        let restart = async {
            server.wait_exit().await;
            server.start_again().await;
            started.elapsed()
        };
        let (outcome, restart) = tokio::join!(
            async {
                let outcome = client.result().await;
                (outcome, started.elapsed(), epoch_now())
            },
            restart
        );
        let ((outcome, took, answered_at), restart) = (outcome, restart);
        calls.push(Call {
            tool,
            n,
            outcome,
            took,
            answered_at,
            restart: Some(restart),
        });
    }
    n += 1;
    calls.push(ts_call(&mut client, "record", n).await);

    check(&calls, &server.ledger(), &server.trace());
    assert_eq!(
        client.session_id(),
        Some(session.as_str()),
        "the client kept its one session"
    );
    assert!(
        unanswered(&holdfast).await >= 1.0,
        "no call met a stream ended unanswered in {RESTARTS} restarts: the test proved nothing"
    );
    client.close().await.expect("DELETE the session");
}

/// One call by the TypeScript SDK client, timed.
async fn ts_call(client: &mut PeerClient, tool: &'static str, n: u64) -> Call {
    let started = Instant::now();
    let outcome = client.call(tool, json!({ "n": n })).await;
    Call {
        tool,
        n,
        outcome,
        took: started.elapsed(),
        answered_at: epoch_now(),
        restart: None,
    }
}

#[tokio::test]
async fn raw_client_calls_through_graceful_restarts_of_a_python_sdk_server() {
    let dir = TempDir::new("graceful-raw");
    let mut server = PyServer::start(&dir.path().join("ledger")).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let raw = RawClient::initialize(&holdfast).await;
    let listed = raw.rpc("tools/list", json!({})).await;
    assert!(listed.is_ok(), "tools/list: {listed:?}");

    let mut calls = Vec::new();
    let mut n = 0;
    for i in 0..RESTARTS {
        for _ in 0..CALLS_BETWEEN {
            n += 1;
            calls.push(raw.call("record", n, None).await);
        }
        server.sigterm();
        n += 1;
        let started = Instant::now();
        let restart = async {
            server.wait_exit().await;
            server.start_again().await;
            started.elapsed()
        };
        let (mut call, restart) = tokio::join!(raw.call(tool_after_sigterm(i), n, None), restart);
        call.restart = Some(restart);
        calls.push(call);
    }
    n += 1;
    calls.push(raw.call("record", n, None).await);

    check(&calls, &server.ledger(), &server.trace());
    assert!(
        unanswered(&holdfast).await >= 1.0,
        "no call met a stream ended unanswered in {RESTARTS} restarts: the test proved nothing"
    );
}

/// A client that writes its MCP requests by hand, one connection per request, as a script with
/// curl would: the session id kept from `initialize`, each answer read off the socket.
struct RawClient {
    addr: std::net::SocketAddr,
    host: String,
    session: String,
    next_id: std::sync::atomic::AtomicU64,
}

impl RawClient {
    async fn initialize(holdfast: &Holdfast) -> RawClient {
        let host = holdfast.addr.to_string();
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "holdfast-raw-test", "version": "1" },
            },
        });
        let resp = raw_http(holdfast.addr, &mcp_post(&host, None, &init.to_string()))
            .await
            .expect("initialize");
        let session = resp
            .header("mcp-session-id")
            .unwrap_or_else(|| panic!("no session id: {}", resp.status_line))
            .to_owned();
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let resp = raw_http(
            holdfast.addr,
            &mcp_post(&host, Some(&session), &initialized.to_string()),
        )
        .await
        .expect("notifications/initialized");
        assert!(resp.status_line.contains(" 202 "), "{}", resp.status_line);
        RawClient {
            addr: holdfast.addr,
            host,
            session,
            next_id: 1.into(),
        }
    }

    /// Sends one request; its JSON-RPC result, or what came instead.
    async fn rpc(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let request = mcp_post(&self.host, Some(&self.session), &body.to_string());
        let resp = raw_http(self.addr, &request)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        match answer_in(&resp) {
            Some(answer) if answer["id"] == id => match answer.get("result") {
                Some(result) => Ok(result.clone()),
                None => Err(format!("{}: {answer}", resp.status_line)),
            },
            _ => Err(format!(
                "{}: {}",
                resp.status_line,
                String::from_utf8_lossy(&resp.body)
            )),
        }
    }

    /// Calls `tool` with `n`, timed.
    async fn call(&self, tool: &'static str, n: u64, restart: Option<Duration>) -> Call {
        let started = Instant::now();
        let result = self
            .rpc(
                "tools/call",
                json!({ "name": tool, "arguments": { "n": n } }),
            )
            .await;
        let outcome = result.map(|result| {
            result["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        Call {
            tool,
            n,
            outcome,
            took: started.elapsed(),
            answered_at: epoch_now(),
            restart,
        }
    }
}

/// The JSON-RPC response in an answer: its JSON body, or the `data` of an event of its event
/// stream (read off the wire, chunk-size lines and all: each event is on lines of its own).
fn answer_in(resp: &RawResponse) -> Option<Value> {
    let body = String::from_utf8_lossy(&resp.body);
    if let Ok(value) = serde_json::from_str::<Value>(&body) {
        return Some(value);
    }
    body.lines()
        .filter_map(|line| line.trim_end().strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|value| value.get("result").is_some() || value.get("error").is_some())
}

/// An upstream that answers POSTs with event streams: the `i`th answer (from 0) is `streams[i]`
/// (the last one again after that), and it counts the requests it saw.
async fn streaming(
    streams: &'static [&'static str],
) -> (http_upstream::Upstream, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let upstream = http_upstream::Upstream::start(move |_| {
        let i = count.fetch_add(1, Ordering::SeqCst);
        let body = streams[i.min(streams.len() - 1)];
        async move { http_upstream::response(200, &[("content-type", "text/event-stream")], body) }
    })
    .await;
    (upstream, seen)
}

const PING_RESULT: &str = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";

#[tokio::test]
async fn an_event_stream_ended_without_its_answer_is_a_502_for_a_call_that_may_have_run() {
    let (upstream, seen) = streaming(&["", PING_RESULT]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"}}"#;
    let got = http_upstream::post_json(&holdfast.url("/mcp"), call).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.headers["holdfast-reason"], "unanswered");
    assert_eq!(seen.load(Ordering::SeqCst), 1, "sent once: it may have run");
    assert_eq!(holdfast.metric(FAILED_UNANSWERED).await, 1.0);
    upstream.stop().await;
}

#[tokio::test]
async fn an_event_stream_ended_without_its_answer_is_held_and_sent_again_when_safe() {
    let (upstream, seen) = streaming(&["", PING_RESULT]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let got = http_upstream::post_json(&holdfast.url("/mcp"), ping).await;
    assert_eq!(got.status, 200);
    assert_eq!(&got.body[..], PING_RESULT.as_bytes());
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(holdfast.metric(HELD_UNANSWERED).await, 1.0);
    assert_eq!(
        holdfast
            .metric("holdfast_safe_retries_total{kind=\"read_only_method\"}")
            .await,
        1.0
    );
    upstream.stop().await;
}

#[tokio::test]
async fn an_event_stream_ended_unanswered_after_an_event_gets_a_json_rpc_error_event() {
    const PROGRESS: &str = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\
                            \"params\":{\"progressToken\":1,\"progress\":1}}\n\n";
    let (upstream, seen) = streaming(&[PROGRESS]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let call =
        r#"{"jsonrpc":"2.0","id":"call-9","method":"tools/call","params":{"name":"charge"}}"#;
    let got = http_upstream::post_json(&holdfast.url("/mcp"), call).await;
    assert_eq!(got.status, 200);
    let text = String::from_utf8(got.body.to_vec()).unwrap();
    let added = text
        .strip_prefix(PROGRESS)
        .unwrap_or_else(|| panic!("{text:?}"));
    let data = added
        .strip_prefix("event: message\ndata: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("one event added: {added:?}"));
    let error: Value = serde_json::from_str(data).unwrap();
    assert_eq!(error["id"], "call-9");
    assert_eq!(error["error"]["data"]["reason"], "unanswered");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(holdfast.metric(FAILED_UNANSWERED).await, 1.0);
    upstream.stop().await;
}
