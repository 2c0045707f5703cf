//! A deploy's changes reach the clients holdfast carried (docs/sessions.md "When the server
//! changed"): the official TypeScript SDK client keeps its session and its GET stream through
//! the official Python SDK server's restart into its next version (`tests/python/ledger_server.py`
//! with a `LEDGER.release` file), is told with `notifications/tools/list_changed` when the tools
//! changed and with nothing when the same version came back, and ends with the new list. Its GET
//! stream is never closed on it: the client made one GET in all. No call ran twice. The same deploy
//! reaches the Python SDK's client (2025 handshake), fastmcp's and the TypeScript SDK client through
//! mcp-remote.

use serde_json::json;

use crate::support::clients::{Peer, PeerClient};
use crate::support::files::TempDir;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::python::PyServer;
use crate::support::stacks::{Stack, StackServer};

fn changes(what: &str) -> String {
    format!("holdfast_server_changes_total{{what=\"{what}\"}}")
}

/// How a deploy stops the old version.
#[derive(Clone, Copy)]
enum Stop {
    /// SIGTERM: uvicorn's graceful shutdown ends every event stream cleanly.
    Term,
    /// SIGKILL: every connection is cut.
    Kill,
}

/// One carried client, and the server it started with.
struct Deploy {
    peer: Peer,
    server: PyServer,
    holdfast: Holdfast,
    client: PeerClient,
    ledger: TempDir,
    /// Calls made so far (each `record`'s argument is its number).
    calls: u64,
}

impl Deploy {
    async fn start(raw: impl FnOnce(&str) -> holdfast::config::RawConfig) -> Deploy {
        Deploy::start_peer(Peer::TsSdk, raw).await
    }

    async fn start_peer(
        peer: Peer,
        raw: impl FnOnce(&str) -> holdfast::config::RawConfig,
    ) -> Deploy {
        let ledger = TempDir::new("server-changes");
        let server = PyServer::start(&ledger.path().join("ledger")).await;
        let holdfast = Holdfast::start_with(raw(&format!("http://{}", server.addr()))).await;
        let mut client = PeerClient::start_peer(peer, &holdfast.url("/mcp")).await;
        assert_eq!(
            client.list().await,
            "record,lookup,peek,put",
            "{}",
            client.trace()
        );
        let mut deploy = Deploy {
            peer,
            server,
            holdfast,
            client,
            ledger,
            calls: 0,
        };
        deploy.call().await;
        deploy
    }

    /// Stops the server and starts its next version (`release`: ledger_server.py's changes, one
    /// a line; empty: the same version again).
    async fn release(&mut self, stop: Stop, release: &str) {
        let file = self.ledger.path().join("ledger.release");
        std::fs::write(&file, release).expect("write the release");
        match stop {
            Stop::Term => {
                self.server.sigterm();
                self.server.wait_exit().await;
            }
            Stop::Kill => self.server.kill().await,
        }
        self.server.start_again().await;
    }

    /// One `record` call, which must run once.
    async fn call(&mut self) {
        self.calls += 1;
        let n = self.calls;
        let answer = self.client.call("record", json!({ "n": n })).await;
        assert_eq!(
            answer,
            Ok(format!("record {n}")),
            "client:\n{}\nserver:\n{}",
            self.client.trace(),
            self.server.trace()
        );
    }

    /// Every call ran exactly once, and the client's GET stream was never closed on it.
    async fn check(&mut self) {
        let calls = self.calls;
        let ledger = self.server.ledger_until(|l| l.len() as u64 >= calls).await;
        let mut runs: Vec<u64> = ledger.iter().map(|r| r.n).collect();
        runs.sort_unstable();
        assert_eq!(runs, (1..=calls).collect::<Vec<_>>(), "each call ran once");
        if self.peer != Peer::TsSdk {
            // The other clients' own requests are not traced.
            return;
        }
        let trace = self.client.trace();
        let gets = trace
            .lines()
            .filter(|l| l.contains(" GET session="))
            .count();
        assert_eq!(gets, 1, "the client opened its GET stream once:\n{trace}");
        assert!(
            !trace.contains("onerror"),
            "the client saw no error:\n{trace}"
        );
    }
}

#[tokio::test]
async fn a_new_tool_reaches_the_typescript_client_through_a_graceful_restart() {
    let mut deploy = Deploy::start(raw_config).await;
    deploy.release(Stop::Term, "extra\nversion=2.0\n").await;
    deploy.call().await;
    let client = &mut deploy.client;
    assert_eq!(client.tools_changed().await, "1", "{}", client.trace());
    assert_eq!(client.list().await, "record,lookup,peek,put,extra");
    let holdfast = &deploy.holdfast;
    assert_eq!(holdfast.metric(&changes("tools")).await, 1.0);
    assert_eq!(holdfast.metric(&changes("server_info")).await, 1.0);
    assert_eq!(holdfast.metric(&changes("instructions")).await, 0.0);
    // The notification may reach the client before the server's stream is open again.
    let reopened = "holdfast_sse_streams_reopened_total";
    holdfast.metric_until(reopened, |n| n >= 1.0).await;
    deploy.check().await;
}

#[tokio::test]
async fn the_same_version_again_tells_nothing_and_the_next_deploy_tells_once() {
    let mut deploy = Deploy::start(raw_config).await;
    // A plain restart: nothing changed, nothing is sent.
    deploy.release(Stop::Term, "").await;
    deploy.call().await;
    let resumed = "holdfast_session_resumes_total{outcome=\"resumed\"}";
    assert_eq!(deploy.holdfast.metric(resumed).await, 1.0);
    // Then a deploy that removes a tool and changes another's schema, its server killed. Its
    // notification comes on the same stream after anything the plain restart would have sent:
    // one in all says the plain restart sent none.
    deploy
        .release(Stop::Kill, "no-peek\nput-schema\ninstructions=Be brief.\n")
        .await;
    deploy.call().await;
    let client = &mut deploy.client;
    assert_eq!(client.tools_changed().await, "1", "{}", client.trace());
    assert_eq!(client.list().await, "record,lookup,put");
    let holdfast = &deploy.holdfast;
    assert_eq!(holdfast.metric(resumed).await, 2.0);
    assert_eq!(holdfast.metric(&changes("tools")).await, 1.0);
    assert_eq!(holdfast.metric(&changes("instructions")).await, 1.0);
    assert_eq!(holdfast.metric(&changes("server_info")).await, 0.0);
    deploy.check().await;
}

#[tokio::test]
async fn lists_set_to_carry_are_counted_and_not_told() {
    let mut deploy = Deploy::start(|upstream| {
        let mut raw = raw_config(upstream);
        raw.sessions.on_change.lists = "carry".into();
        raw
    })
    .await;
    deploy.release(Stop::Term, "extra\n").await;
    deploy.call().await;
    assert_eq!(deploy.holdfast.metric(&changes("tools")).await, 1.0);
    // A second call after the re-establishment that found the change: a notification would have
    // been written on the client's stream before it.
    deploy.call().await;
    deploy.client.send(json!({ "op": "changes" }));
    assert_eq!(deploy.client.result().await, Ok("0".into()));
    // The session goes on with the new server's tools, which the client did not hear of.
    assert_eq!(deploy.client.list().await, "record,lookup,peek,put,extra");
    deploy.check().await;
}

#[tokio::test]
async fn a_change_set_to_end_ends_the_session_the_specifications_way() {
    let end_for_instructions = |raw: &mut holdfast::config::RawConfig| {
        raw.sessions.on_change.instructions = "end".into();
    };
    ends_the_session(
        end_for_instructions,
        "instructions=New rules.\n",
        "instructions",
    )
    .await;
}

#[tokio::test]
async fn lists_set_to_end_end_the_session() {
    let end_for_lists = |raw: &mut holdfast::config::RawConfig| {
        raw.sessions.on_change.lists = "end".into();
    };
    ends_the_session(end_for_lists, "extra\n", "tools").await;
}

/// A deploy of `release` with `[sessions.on_change]` set by `set` to end for what it changes
/// (`what`): the session ends (the client gets the server's own 404 for it, as it would without
/// holdfast: the TypeScript SDK client does not start a new one by itself), the server's session
/// opened to compare is closed, and the call never ran.
async fn ends_the_session(
    set: impl FnOnce(&mut holdfast::config::RawConfig),
    release: &str,
    what: &str,
) {
    let mut deploy = Deploy::start(|upstream| {
        let mut raw = raw_config(upstream);
        set(&mut raw);
        raw
    })
    .await;
    deploy.release(Stop::Term, release).await;
    let answer = deploy.client.call("record", json!({ "n": 99 })).await;
    let error = answer.expect_err("the session ended");
    assert!(error.contains("Session not found"), "{error}");
    let holdfast = &deploy.holdfast;
    assert_eq!(holdfast.metric(&changes(what)).await, 1.0);
    let resumed = "holdfast_session_resumes_total{outcome=\"resumed\"}";
    assert_eq!(holdfast.metric(resumed).await, 0.0);
    let ledger = deploy.server.ledger();
    assert!(ledger.iter().all(|r| r.n != 99), "{ledger:?}");
    // The new process ends the session holdfast opened in it (the SDK logs each DELETE).
    deploy.server.wait_for_line("Terminating session").await;
}

/// The deploy of the first test, for another client.
async fn a_new_tool_reaches(peer: Peer) {
    let mut deploy = Deploy::start_peer(peer, raw_config).await;
    deploy.release(Stop::Term, "extra\nversion=2.0\n").await;
    deploy.call().await;
    let client = &mut deploy.client;
    assert_eq!(client.tools_changed().await, "1", "{}", client.trace());
    assert_eq!(client.list().await, "record,lookup,peek,put,extra");
    assert_eq!(deploy.holdfast.metric(&changes("tools")).await, 1.0);
    deploy.check().await;
}

#[tokio::test]
async fn a_new_tool_reaches_the_python_sdk_client() {
    a_new_tool_reaches(Peer::PySdkHandshake).await;
}

#[tokio::test]
async fn a_new_tool_reaches_fastmcps_client() {
    // Pinned to the handshake: in front of this server of both eras its default speaks
    // 2026-07-28, which has no session to carry (docs/sessions.md says what it gets there).
    a_new_tool_reaches(Peer::FastmcpHandshake).await;
}

#[tokio::test]
async fn a_new_tool_reaches_the_typescript_client_through_mcp_remote() {
    a_new_tool_reaches(Peer::McpRemote).await;
}

/// The tools' digest `holdfast probe` shows for the server at `url`.
async fn probed_tools(url: &str) -> (Option<String>, String) {
    let report = crate::probe::probe(url).await;
    let server = report.server.as_ref().expect("a server");
    let tools = server.lists.iter().find(|l| l.list == "tools");
    let digest = tools.and_then(|t| t.digest.clone());
    let line = report.text();
    assert!(
        line.contains("lists:    tools "),
        "the text names the digests:\n{line}"
    );
    // And what recreation each kind of client survives, with the default hold.
    assert!(
        line.contains("gaps:     a recreation survived through holdfast: the TypeScript SDK"),
        "{line}"
    );
    (digest, server.version.clone().unwrap_or_default())
}

#[tokio::test]
async fn the_probe_shows_the_digests_a_deploy_changes() {
    let ledger = TempDir::new("probe-digests");
    let mut server = PyServer::start(&ledger.path().join("ledger")).await;
    let url = format!("http://{}/mcp", server.addr());
    let (first, version) = probed_tools(&url).await;
    assert!(first.is_some());
    assert_eq!(version, "1.0");
    // The same version again: the same digest, nothing holdfast would tell.
    server.kill().await;
    server.start_again().await;
    assert_eq!(probed_tools(&url).await, (first.clone(), "1.0".into()));
    // The next version, one tool more: another digest.
    std::fs::write(ledger.path().join("ledger.release"), "extra\nversion=2.0\n").unwrap();
    server.kill().await;
    server.start_again().await;
    let (next, version) = probed_tools(&url).await;
    assert_eq!(version, "2.0");
    assert!(next.is_some() && next != first, "{next:?} {first:?}");
}

/// A rollout replaces holdfast with its server: the session reaches a holdfast that shares the key
/// but never saw what its client was told, so every list the new server offers is told.
#[tokio::test]
async fn a_session_from_another_holdfast_is_told_every_list_the_new_server_offers() {
    use crate::support::http;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    let ledger = TempDir::new("server-changes-rollout");
    let mut server = PyServer::start(&ledger.path().join("ledger")).await;
    let key = "8f1c2b7a9d3e4f5061728394a5b6c7d8e9f00112233445566778899aabbccdd0";
    let mut raw = raw_config(&format!("http://{}", server.addr()));
    raw.sessions.key_file = Some(ledger.write("keys", &format!("{key}\n")));
    let leaving = Holdfast::start_with(raw.clone()).await;
    let mut client = PeerClient::start(&leaving.url("/mcp")).await;
    assert_eq!(client.list().await, "record,lookup,peek,put");
    let id = client.session_id().expect("a session").to_owned();
    drop(client);
    leaving.shutdown().await;

    std::fs::write(ledger.path().join("ledger.release"), "extra\nversion=2.0\n").unwrap();
    server.kill().await;
    server.start_again().await;
    let next = Holdfast::start_with(raw).await;
    let stream = crate::support::within(http::send(
        ::http::Request::get(next.url("/mcp"))
            .header("host", next.addr.to_string())
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &id)
            .header("mcp-protocol-version", "2025-11-25")
            .body(Full::<Bytes>::default())
            .unwrap(),
    ))
    .await;
    assert_eq!(stream.status(), 200);
    let mut body = stream.into_body();
    let mut text = String::new();
    let wanted = [
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    ];
    while !wanted.iter().all(|w| text.contains(w)) {
        let frame = crate::support::within(body.frame())
            .await
            .expect("the stream goes on")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let told = next.metric(&changes("tools")).await;
    assert_eq!(told, 1.0, "{text}");
    let reestablished = "holdfast_session_reestablished_total{cause=\"unknown_to_this_replica\"}";
    assert_eq!(next.metric(reestablished).await, 1.0);
    // What the other holdfast was told could not be compared here.
    assert_eq!(next.metric(&changes("server_info")).await, 0.0);
}

/// The next version no longer speaks the protocol version the client agreed on: by default the
/// session ends, and the client gets what the server answers without holdfast (the Python SDK
/// routes a version it does not speak to its 2026-07-28 entry, which refuses the request: 400).
/// Nothing is re-established for it again: every later request passes as it is.
#[tokio::test]
async fn another_protocol_version_ends_the_session() {
    let mut deploy = Deploy::start(raw_config).await;
    deploy.release(Stop::Term, "protocol=2025-06-18\n").await;
    for n in [98, 99] {
        let answer = deploy.client.call("record", json!({ "n": n })).await;
        let error = answer.expect_err("the new server refuses the old version");
        assert!(error.contains("-32602"), "{error}");
    }
    let holdfast = &deploy.holdfast;
    assert_eq!(holdfast.metric(&changes("protocol_version")).await, 1.0);
    let resumed = "holdfast_session_resumes_total{outcome=\"resumed\"}";
    assert_eq!(holdfast.metric(resumed).await, 0.0);
    let ended = "holdfast_session_tokens_refused_total{reason=\"ended\"}";
    assert!(holdfast.metric(ended).await >= 1.0);
    // The session opened to compare was closed; no call ran.
    deploy.server.wait_for_line("Terminating session").await;
    let ledger = deploy.server.ledger();
    assert!(ledger.iter().all(|r| r.n < 98), "{ledger:?}");
}

/// A deploy of one tool more behind the TypeScript SDK client, in front of `stack` (stopped with
/// SIGTERM): told once, the new list, one GET stream.
async fn a_new_tool_reaches_the_typescript_client_in_front_of(stack: Stack) {
    let mut server = StackServer::start(stack).await;
    let holdfast = Holdfast::start(&format!("http://{}", server.addr())).await;
    let mut client = PeerClient::start(&holdfast.url("/mcp")).await;
    let before = client.list().await;
    server.release("extra");
    server.restart().await;
    let (tool, args, text) = stack.call(1);
    let answer = client.call(tool, args).await;
    assert_eq!(answer, Ok(text), "{}\n{}", client.trace(), server.trace());
    assert_eq!(client.tools_changed().await, "1", "{}", client.trace());
    assert_eq!(client.list().await, format!("{before},extra"));
    let trace = client.trace();
    let gets = trace
        .lines()
        .filter(|l| l.contains(" GET session="))
        .count();
    assert_eq!(gets, 1, "the client opened its GET stream once:\n{trace}");
    assert_eq!(holdfast.metric(&changes("tools")).await, 1.0);
}

#[tokio::test]
async fn a_new_tool_reaches_the_typescript_client_in_front_of_a_one_transport_sdk_server() {
    // Its forgotten session is a 400 "Server not initialized", not a 404.
    a_new_tool_reaches_the_typescript_client_in_front_of(Stack::SdkOneTransport).await;
}

#[tokio::test]
async fn a_new_tool_reaches_the_typescript_client_in_front_of_fastmcp() {
    a_new_tool_reaches_the_typescript_client_in_front_of(Stack::Fastmcp).await;
}

#[tokio::test]
async fn a_new_tool_reaches_the_typescript_client_in_front_of_fastmcp_for_typescript() {
    a_new_tool_reaches_the_typescript_client_in_front_of(Stack::FastmcpTs).await;
}
