//! The era bridge (issue 48, docs/design/era-bridge.md), build order step 1: a client of the
//! final 2026-07-28 revision in front of a server that speaks only the 2025 one.
//!
//! The client is the official Python SDK's, pinned with `Client(url, mode="2026-07-28")`: it
//! sends no `server/discover` and no handshake, only requests carrying the revision in their
//! headers and `_meta`. Straight at a 2025 server every one fails (the TypeScript SDK server:
//! 400, "No valid session ID provided"); through holdfast with `[bridge] mode = "auto"` each is
//! sent on a 2025 session holdfast opened for it, and the session outlives the server's restart.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

use crate::support::clients::PeerClient;
use crate::support::files::TempDir;
use crate::support::http::{call, host_of};
use crate::support::modern::ModernClient;
use crate::support::node::TsServer;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::python::PyServer;
use crate::support::router::FakeRouter;
use crate::support::stacks::{Stack, StackServer};

/// holdfast in front of `upstream` with the bridge on.
async fn bridging(upstream: &str) -> Holdfast {
    let mut raw = raw_config(upstream);
    raw.bridge.mode = "auto".into();
    Holdfast::start_with(raw).await
}

/// A TypeScript SDK 1.x server recording into `dir`.
async fn ts_server(dir: &TempDir) -> TsServer {
    let (ledger, levels) = (dir.path().join("ledger"), dir.path().join("levels"));
    TsServer::start(crate::support::ports::quiet(), &ledger, &levels).await
}

/// The client's lines that are failures.
fn failures(out: &[String]) -> Vec<&String> {
    out.iter()
        .filter(|l| l.starts_with("err ") || l.starts_with("connect-failed"))
        .collect()
}

const TS_OPS: [&str; 5] = [
    "list",
    r#"call:echo:{"text":"hi"}"#,
    "call:count",
    "call:count",
    "call:count",
];

#[tokio::test]
async fn a_pinned_2026_client_fails_at_a_2025_server_and_works_through_the_bridge() {
    let dir = TempDir::new("bridge-ts");
    let server = ts_server(&dir).await;

    // Straight at the server: every request refused, nothing run.
    let direct = ModernClient::start(&server.url(), &TS_OPS).output().await;
    assert_eq!(failures(&direct).len(), TS_OPS.len(), "{direct:?}");
    assert!(
        direct[1].contains("No valid session ID provided"),
        "{direct:?}"
    );
    assert_eq!(server.ledger_lines(), 0);
    // The probe names its era, and what the bridge does for such clients.
    let report = crate::probe::probe(&server.url()).await;
    assert_eq!(report.eras.discover, None, "{}", report.text());
    assert!(report.eras.initialize.is_some(), "{}", report.text());
    let bridge = report.bridge.expect("the eras are known");
    assert!(
        bridge.contains("holdfast bridges them"),
        "{}",
        report.text()
    );

    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let out = ModernClient::start(&holdfast.url("/mcp"), &TS_OPS)
        .output()
        .await;
    assert_eq!(
        out,
        [
            "era 2026-07-28",
            "ok list count,echo,log",
            r#"ok call:echo:{"text":"hi"} hi"#,
            "ok call:count 1",
            "ok call:count 2",
            "ok call:count 3",
        ],
        "server:\n{}",
        server.trace()
    );
    assert_eq!(server.ledger_lines(), 3, "each call ran once");
}

#[tokio::test]
async fn with_the_bridge_off_a_pinned_2026_client_fails_as_without_holdfast() {
    let dir = TempDir::new("bridge-off");
    let server = ts_server(&dir).await;
    // The default: off.
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let out = ModernClient::start(&holdfast.url("/mcp"), &TS_OPS)
        .output()
        .await;
    assert_eq!(failures(&out).len(), TS_OPS.len(), "{out:?}");
    assert_eq!(server.ledger_lines(), 0);
    for outcome in ["translated", "passed", "accepted", "failed"] {
        let series = format!("holdfast_bridge_requests_total{{outcome=\"{outcome}\"}}");
        assert_eq!(holdfast.metric(&series).await, 0.0, "{series}");
    }
}

#[tokio::test]
async fn a_bridged_session_outlives_the_servers_restart_with_no_failed_call() {
    let dir = TempDir::new("bridge-restart");
    let mut server = ts_server(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let ops = [
        "call:count",
        "call:count",
        "call:count",
        "wait",
        "call:count",
        "call:count",
        "call:count",
    ];
    let mut client = ModernClient::start(&holdfast.url("/mcp"), &ops);
    client.until("waiting").await;
    // The container stops; the next call meets its refused port and waits in the hold.
    server.stop().await;
    client.go_on();
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    // It comes back with no sessions: the bridge's session is re-established for the call.
    server.start_again().await;
    let out = client.output().await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    let counted: Vec<&str> = out
        .iter()
        .filter_map(|l| l.strip_prefix("ok call:count "))
        .collect();
    assert_eq!(counted, ["1", "2", "3", "4", "5", "6"], "{out:?}");
    assert_eq!(server.ledger_lines(), 6, "each call ran exactly once");
    let resumed = "holdfast_session_resumes_total{outcome=\"resumed\"}";
    assert_eq!(holdfast.metric(resumed).await, 1.0);
}

#[tokio::test]
async fn the_everything_server_through_the_bridge_and_its_restart() {
    let mut server = StackServer::start(Stack::Everything).await;
    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let echo = |word: &str| format!(r#"call:echo:{{"message":"{word}"}}"#);
    let (first, second) = (echo("one"), echo("two"));
    let ops = ["list", first.as_str(), "wait", second.as_str()];
    // Its restart forgets the session; it answers a forgotten one with 400, not 404.
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .across(server.restart())
        .await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    let listed = out[1].strip_prefix("ok list ").expect("listed");
    assert!(listed.split(',').any(|tool| tool == "echo"), "{listed}");
    assert_eq!(out[2], format!("ok {first} Echo: one"));
    assert_eq!(out[4], format!("ok {second} Echo: two"));
}

/// A 2026-07-28 `tools/call` as raw bytes, with `authorization`.
fn modern_call(url: &str, id: u64, authorization: &str) -> Request<Full<Bytes>> {
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": format!("t{id}")}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }},
    });
    Request::post(url)
        .header("host", host_of(url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .header("authorization", authorization)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The JSON-RPC message of an answer, JSON or the first event of a stream.
fn message_of(body: &str) -> Value {
    let text = body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or(body);
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn two_credentials_never_share_an_upstream_session() {
    let dir = TempDir::new("bridge-principals");
    let server = ts_server(&dir).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr)).await;
    let url = holdfast.url("/mcp");

    for (id, who) in [(1, "Bearer a"), (2, "Bearer b"), (3, "Bearer a")] {
        let got = call(modern_call(&url, id, who)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        assert!(got.header("mcp-session-id").is_none(), "no session shown");
        let message = message_of(got.text());
        assert_eq!(message["id"], id, "the client's own id back");
        assert_eq!(message["result"]["resultType"], "complete");
        assert_eq!(message["result"]["content"][0]["text"], format!("t{id}"));
    }
    let log = router.log();
    let initializes = log
        .iter()
        .filter(|r| r.rpc_method().as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 2, "one session for each credential");
    // Each call went on its credential's session, named by the server's own id.
    let call_sessions: Vec<Option<String>> = log
        .iter()
        .filter(|r| r.rpc_method().as_deref() == Some("tools/call"))
        .map(|r| r.session.clone())
        .collect();
    assert_eq!(call_sessions.len(), 3);
    assert!(
        call_sessions.iter().all(Option::is_some),
        "{call_sessions:?}"
    );
    assert_ne!(call_sessions[0], call_sessions[1]);
    assert_eq!(call_sessions[0], call_sessions[2]);
    let translated = "holdfast_bridge_requests_total{outcome=\"translated\"}";
    assert_eq!(holdfast.metric(translated).await, 3.0);
    assert_eq!(holdfast.metric("holdfast_bridge_sessions").await, 2.0);
}

#[tokio::test]
async fn a_server_of_the_clients_revision_is_passed_through_untranslated() {
    let dir = TempDir::new("bridge-pass");
    // The Python SDK's server speaks both revisions.
    let server = PyServer::start(&dir.path().join("ledger")).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr)).await;
    let ops = [r#"call:lookup:{"n":1}"#, r#"call:lookup:{"n":2}"#];
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .output()
        .await;
    assert!(failures(&out).is_empty(), "{out:?}");
    assert_eq!(server.ledger().len(), 2, "each call ran once");
    let methods: Vec<Option<String>> = router.log().iter().map(|r| r.rpc_method()).collect();
    // holdfast asked once which revision it speaks; then the client's requests went as sent
    // (the client lists the tools itself before a call), with no handshake.
    assert_eq!(
        methods[0].as_deref(),
        Some("server/discover"),
        "{methods:?}"
    );
    let calls = methods
        .iter()
        .filter(|m| m.as_deref() == Some("tools/call"));
    assert_eq!(calls.count(), 2, "{methods:?}");
    assert!(
        !methods.iter().any(|m| m.as_deref() == Some("initialize")),
        "{methods:?}"
    );
    assert!(
        router.log().iter().all(|r| r.session.is_none()),
        "no session was opened"
    );
}

#[tokio::test]
async fn a_server_upgraded_across_its_restart_is_asked_again_and_passed_through() {
    let dir = TempDir::new("bridge-upgrade");
    // The port the new server will take: the Python SDK server's, which speaks both revisions.
    let mut upgraded = PyServer::start(&dir.path().join("ledger")).await;
    upgraded.sigterm();
    upgraded.wait_exit().await;
    let port = upgraded.addr().port();
    // Before the upgrade, a TypeScript SDK 1.x server (2025 only) listens there.
    let (ledger, levels) = (dir.path().join("ts-ledger"), dir.path().join("levels"));
    let mut old = TsServer::start(port, &ledger, &levels).await;
    let router = FakeRouter::start(old.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr)).await;
    let ops = [
        r#"call:echo:{"text":"before"}"#,
        "wait",
        r#"call:lookup:{"n":1}"#,
        r#"call:lookup:{"n":2}"#,
    ];
    let mut client = ModernClient::start(&holdfast.url("/mcp"), &ops);
    client.until("waiting").await;
    old.stop().await;
    upgraded.start_again().await;
    let before_upgrade = router.log().len();
    client.go_on();
    let out = client.output().await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", upgraded.trace());
    assert_eq!(upgraded.ledger().len(), 2, "each call ran once");

    // The first call after the restart went on the bridge's session, re-established; then
    // holdfast asked again, found 2026-07-28, and passed the second as the client sent it.
    let after: Vec<(Option<String>, bool)> = router.log()[before_upgrade..]
        .iter()
        .map(|r| (r.rpc_method(), r.session.is_some()))
        .collect();
    let discover = after
        .iter()
        .position(|(m, _)| m.as_deref() == Some("server/discover"))
        .unwrap_or_else(|| panic!("asked again: {after:?}"));
    let (method, with_session) = after.last().expect("a last request");
    assert_eq!(method.as_deref(), Some("tools/call"), "{after:?}");
    assert!(!with_session, "passed through, no session: {after:?}");
    assert!(discover < after.len() - 1, "{after:?}");
    let passed = "holdfast_bridge_requests_total{outcome=\"passed\"}";
    assert!(holdfast.metric(passed).await >= 1.0);
}

#[tokio::test]
async fn prompts_resources_and_progress_of_the_everything_server_through_the_bridge() {
    let server = StackServer::start(Stack::Everything).await;
    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let ops = [
        "prompts",
        "prompt:simple-prompt:{}",
        "read:demo://resource/static/document/architecture.md",
        r#"progress:trigger-long-running-operation:{"duration":1,"steps":3}"#,
    ];
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .output()
        .await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    let prompts = out[1].strip_prefix("ok prompts ").expect("listed");
    assert!(
        prompts.split(',').any(|p| p == "simple-prompt"),
        "{prompts}"
    );
    assert_eq!(out[2], "ok prompt:simple-prompt:{} 1 messages");
    assert_eq!(
        out[3],
        "ok read:demo://resource/static/document/architecture.md 1 contents \
         demo://resource/static/document/architecture.md"
    );
    // Progress notifications cross on the call's stream, unchanged: one a step.
    assert_eq!(out[4], format!("ok {} 3 progress, done", ops[3]), "{out:?}");
}

#[tokio::test]
async fn log_messages_reach_a_client_from_its_level_and_the_level_outlives_a_restart() {
    let dir = TempDir::new("bridge-log");
    let mut server = ts_server(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let ops = ["--log-level=warning", "call:log", "wait", "call:log"];
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .across(server.restart())
        .await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    // The server sends all four levels; the client asked for warning and up.
    let logged: Vec<&str> = out
        .iter()
        .filter(|l| l.starts_with("log "))
        .map(String::as_str)
        .collect();
    let twice = [
        "log warning a warning message",
        "log error an error message",
    ];
    assert_eq!(logged, [twice, twice].concat(), "{out:?}");
    // The bridge set the session's level once; the re-established session got it again.
    assert_eq!(server.levels(), ["setLevel warning", "setLevel warning"]);
}

#[tokio::test]
async fn a_client_closing_its_stream_cancels_the_call_on_the_session() {
    let server = StackServer::start(Stack::Everything).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr)).await;
    let long = r#"cancel:trigger-long-running-operation:{"duration":30,"steps":30}"#;
    let out = ModernClient::start(&holdfast.url("/mcp"), &[long])
        .output()
        .await;
    assert_eq!(
        out,
        ["era 2026-07-28".to_owned(), format!("ok {long} cancelled")]
    );
    // The call went upstream with an id of holdfast's; the cancellation names that id, on the
    // same session, well before the operation's 30 s were over.
    let call = crate::support::within(async {
        loop {
            let log = router.log();
            let call = log
                .iter()
                .find(|r| r.rpc_method().as_deref() == Some("tools/call"))
                .cloned();
            let cancelled = log
                .iter()
                .find(|r| r.rpc_method().as_deref() == Some("notifications/cancelled"))
                .cloned();
            if let (Some(call), Some(cancelled)) = (call, cancelled) {
                return (call, cancelled);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let (call, cancelled) = call;
    let id = |body: &Bytes| serde_json::from_slice::<Value>(body).unwrap();
    assert_eq!(
        id(&cancelled.body)["params"]["requestId"],
        id(&call.body)["id"]
    );
    assert_eq!(cancelled.session, call.session);
    assert!(call.session.is_some());
}

/// A server of the 2026-07-28 revision only: the Python SDK's with its handshake cut off
/// (`tests/python/modern_only_server.py`), its ledger in `dir`.
pub(crate) async fn modern_only(dir: &TempDir) -> PyServer {
    let ledger = dir.path().join("ledger");
    PyServer::start_script("tests/python/modern_only_server.py", &ledger).await
}

#[tokio::test]
async fn a_2025_client_fails_at_a_2026_only_server_and_works_through_the_bridge() {
    let dir = TempDir::new("bridge-modern");
    let server = modern_only(&dir).await;
    let url = format!("http://{}/mcp", server.addr());

    // Straight at it, the TypeScript SDK client's handshake is refused.
    let direct = PeerClient::try_start(&url).await;
    assert!(direct.is_err(), "the handshake alone cannot connect");

    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = client
        .session_id()
        .expect("a session of holdfast's")
        .to_owned();
    assert_eq!(
        client.call("echo", json!({"text": "hi"})).await,
        Ok("hi".to_owned())
    );
    for n in 1..=3 {
        assert_eq!(
            client.call("lookup", json!({"n": n})).await,
            Ok(format!("lookup {n}")),
            "{}",
            client.trace()
        );
    }
    // A tool whose argument the revision mirrors in a header (`x-mcp-header`): the server
    // refuses the call without `Mcp-Param-Region`.
    assert_eq!(
        client
            .call("region", json!({"region": "eu-west", "q": "x"}))
            .await,
        Ok("x@eu-west".to_owned()),
        "{}",
        client.trace()
    );
    assert_eq!(client.session_id(), Some(session.as_str()));
    assert_eq!(server.ledger().len(), 3, "each call ran once");
    // The client's GET stream is a subscriptions/listen upstream: once it is open, a change
    // of the server's tools reaches the client on it.
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v >= 1.0)
        .await;
    assert_eq!(client.call("touch", json!({})).await, Ok("touched".into()));
    client.send(json!({"op": "toolsChanged"}));
    assert_eq!(client.result().await, Ok("1".into()), "{}", client.trace());
    client.close().await.expect("DELETE answered by holdfast");
    let translated = "holdfast_bridge_requests_total{outcome=\"translated\"}";
    assert!(holdfast.metric(translated).await >= 4.0);
}

#[tokio::test]
async fn a_2025_clients_bridged_session_outlives_the_2026_servers_restart() {
    let dir = TempDir::new("bridge-modern-restart");
    let mut server = modern_only(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let session = client.session_id().expect("a session").to_owned();
    assert_eq!(
        client.call("lookup", json!({"n": 1})).await,
        Ok("lookup 1".into())
    );
    // The container stops (killed: the Python SDK's graceful shutdown waits for the listen
    // stream that stands in for the client's GET stream, which never ends); a call meets its
    // refused port and waits in the hold.
    server.kill().await;
    client.send(json!({"op": "call", "tool": "lookup", "args": {"n": 2}}));
    holdfast
        .metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    server.start_again().await;
    assert_eq!(
        client.result().await,
        Ok("lookup 2".into()),
        "{}",
        client.trace()
    );
    assert_eq!(
        client.call("lookup", json!({"n": 3})).await,
        Ok("lookup 3".into())
    );
    assert_eq!(
        client.session_id(),
        Some(session.as_str()),
        "the same session"
    );
    let ran: Vec<u64> = server.ledger().iter().map(|r| r.n).collect();
    assert_eq!(ran, [1, 2, 3], "each call ran exactly once");
}
