//! The era bridge (issue 48) for what a 2026-07-28 client asks beyond calls: its
//! `subscriptions/listen` on a 2025 session (its URIs subscribed there with `resources/subscribe`,
//! the session's GET stream read for it), and its `server/discover` answered for a 2025 server
//! when `[bridge] answer_discover` says so, so that a dual-era client speaks 2026-07-28 through
//! the bridge; a server's requests for input as input rounds; a server of both revisions; and a
//! 2025 client's log level in front of a 2026-07-28-only server. The peers are the official
//! Python SDK's client and server, the TypeScript SDK 1.x client and server, and the reference
//! everything server.

use crate::support::files::TempDir;
use crate::support::modern::ModernClient;
use crate::support::node::TsServer;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::router::FakeRouter;
use crate::support::stacks::{Stack, StackServer};

/// holdfast in front of `upstream` with the bridge on, answering discover if `discover`.
async fn bridging(upstream: &str, discover: bool) -> Holdfast {
    let mut raw = raw_config(upstream);
    raw.bridge.mode = "auto".into();
    raw.bridge.answer_discover = discover;
    Holdfast::start_with(raw).await
}

/// The client's lines that are failures.
fn failures(out: &[String]) -> Vec<&String> {
    out.iter()
        .filter(|l| l.starts_with("err ") || l.starts_with("connect-failed"))
        .collect()
}

/// How many of the requests the server got were `method`.
fn sent(methods: &[Option<String>], method: &str) -> usize {
    methods
        .iter()
        .filter(|m| m.as_deref() == Some(method))
        .count()
}

const DOCUMENT: &str = "demo://resource/static/document/architecture.md";

#[tokio::test]
async fn a_2026_client_listens_to_a_resource_on_a_2025_session_again_after_the_servers_restart() {
    let mut server = StackServer::start(Stack::Everything).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    // The everything server's tool starts sending the session's subscribed URIs' updates on
    // its GET stream, the first at once.
    let listen = format!("listen:toggle-subscriber-updates:{DOCUMENT}");
    let ops = [listen.as_str(), "wait", listen.as_str()];
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .across(server.restart())
        .await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    let got = format!("ok {listen} honoured {DOCUMENT} updated {DOCUMENT}");
    assert_eq!(out[1], got, "{out:?}");
    // After the restart the session was re-established with its subscription (recorded
    // state), and the GET stream opened again on it.
    assert_eq!(out[3], got, "{out:?}\n{}", server.trace());
    let methods: Vec<Option<String>> = router.log().iter().map(|r| r.rpc_method()).collect();
    let subscribes = sent(&methods, "resources/subscribe");
    assert_eq!(
        subscribes, 2,
        "once, and once more re-established: {methods:?}"
    );
    let gets = router.log().iter().filter(|r| r.method == "GET").count();
    assert!(gets >= 2, "a GET stream for each listen: {methods:?}");
    assert!(
        !methods
            .iter()
            .any(|m| m.as_deref() == Some("subscriptions/listen")),
        "no 2026 method reached the 2025 server: {methods:?}"
    );
}

#[tokio::test]
async fn a_listen_for_what_the_server_cannot_send_is_acknowledged_empty_and_ends() {
    let dir = TempDir::new("bridge-listen-ts");
    let (ledger, levels) = (dir.path().join("ledger"), dir.path().join("levels"));
    // The TypeScript SDK server declares no resources: nothing it sends could reach the listen.
    let server = TsServer::start(crate::support::ports::quiet(), &ledger, &levels).await;
    let holdfast = bridging(&format!("http://{}", server.addr()), false).await;
    let listen = format!("listen:echo:{DOCUMENT}");
    let out = ModernClient::start(&holdfast.url("/mcp"), &[listen.as_str()])
        .output()
        .await;
    assert_eq!(out[1], format!("ok {listen} honoured  ended"), "{out:?}");
}

#[tokio::test]
async fn a_dual_era_client_speaks_2026_through_the_bridge_when_discover_is_answered() {
    let dir = TempDir::new("bridge-discover");
    let (ledger, levels) = (dir.path().join("ledger"), dir.path().join("levels"));
    let server = TsServer::start(crate::support::ports::quiet(), &ledger, &levels).await;
    let ops = ["--mode=auto", r#"call:echo:{"text":"hi"}"#, "call:count"];

    // Answered: the client learns 2026-07-28 from holdfast, and its calls are bridged.
    let holdfast = bridging(&format!("http://{}", server.addr()), true).await;
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .output()
        .await;
    assert!(failures(&out).is_empty(), "{out:?}");
    assert_eq!(out[0], "era 2026-07-28", "{out:?}");
    assert_eq!(out[2], "ok call:count 1", "{out:?}");
    let translated = "holdfast_bridge_requests_total{outcome=\"translated\"}";
    assert!(
        holdfast.metric(translated).await >= 3.0,
        "discover and the calls"
    );

    // Not answered (the default): the server refuses discover, and the client falls back to
    // the handshake, passed as it is.
    let holdfast = bridging(&format!("http://{}", server.addr()), false).await;
    let out = ModernClient::start(&holdfast.url("/mcp"), &ops)
        .output()
        .await;
    assert!(failures(&out).is_empty(), "{out:?}");
    assert_eq!(out[0], "era 2025-11-25", "{out:?}");
    assert_eq!(out[2], "ok call:count 2", "{out:?}");
    assert_eq!(holdfast.metric(translated).await, 0.0);
}

#[tokio::test]
async fn a_2025_servers_requests_for_input_reach_a_2026_client_as_input_rounds() {
    let server = StackServer::start(Stack::Everything).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    let elicit = "call:trigger-elicitation-request:{}";
    let sample = r#"call:trigger-sampling-request:{"prompt":"hi","maxTokens":10}"#;
    let out = ModernClient::start(&holdfast.url("/mcp"), &["--input", elicit, sample])
        .output()
        .await;
    assert!(failures(&out).is_empty(), "{out:?}\n{}", server.trace());
    // Each request reached the client's callback once, as an input round, and the call
    // finished with what it answered: the server's own request got the client's response.
    assert_eq!(out[1], "asked elicitation/create", "{out:?}");
    let elicited = out[2]
        .strip_prefix(&format!("ok {elicit} "))
        .expect("answered");
    assert!(elicited.contains("Ada"), "{elicited}");
    assert_eq!(out[3], "asked sampling/createMessage", "{out:?}");
    let sampled = out[4]
        .strip_prefix(&format!("ok {sample} "))
        .expect("answered");
    assert!(sampled.contains("sampled"), "{sampled}");
    let methods: Vec<Option<String>> = router.log().iter().map(|r| r.rpc_method()).collect();
    let calls = sent(&methods, "tools/call");
    assert_eq!(
        calls, 2,
        "each call sent once, its retry resumed it: {methods:?}"
    );
    // The client's responses went upstream as JSON-RPC responses (no method).
    let responses = router
        .log()
        .iter()
        .filter(|r| r.method == "POST" && r.rpc_method().is_none())
        .count();
    assert_eq!(responses, 2, "{methods:?}");
}

#[tokio::test]
async fn a_retry_of_a_round_holdfast_does_not_have_is_refused_and_sends_nothing() {
    let server = StackServer::start(Stack::Everything).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "x"},
            "requestState": "hf1.unknown", "inputResponses": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}},
    });
    let url = holdfast.url("/mcp");
    let req = http::Request::post(&url)
        .header("host", crate::support::http::host_of(&url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let got = crate::support::http::call(req).await;
    assert_eq!(got.status, 400, "{}", got.text());
    let message: serde_json::Value = serde_json::from_str(got.text()).unwrap();
    assert_eq!(message["id"], 9);
    assert_eq!(message["error"]["code"], -32602);
    assert!(
        !router
            .log()
            .iter()
            .any(|r| r.rpc_method().as_deref() == Some("tools/call")),
        "the call was not sent without its round"
    );
}

#[tokio::test]
async fn a_2025_client_of_a_server_of_both_revisions_passes_untranslated() {
    let dir = TempDir::new("bridge-both");
    // The Python SDK's server lists only 2026-07-28 in its DiscoverResult, and takes the
    // handshake too: its 2025 clients need no bridge.
    let server = crate::support::python::PyServer::start(&dir.path().join("ledger")).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    for round in 1..=2 {
        let mut client = crate::support::clients::PeerClient::start(&holdfast.url("/mcp")).await;
        let n = serde_json::json!({"n": round});
        assert_eq!(
            client.call("lookup", n).await,
            Ok(format!("lookup {round}")),
            "{}",
            client.trace()
        );
        client.close().await.expect("DELETE passed to the server");
    }
    let methods: Vec<Option<String>> = router.log().iter().map(|r| r.rpc_method()).collect();
    // holdfast asked the revision once, and sent the first handshake to learn that the
    // server takes it; from then on both clients' handshakes and calls went as they came.
    assert_eq!(sent(&methods, "server/discover"), 1, "{methods:?}");
    assert_eq!(sent(&methods, "initialize"), 2, "{methods:?}");
    let deletes = router.log().iter().filter(|r| r.method == "DELETE").count();
    assert_eq!(deletes, 2, "each session the server's own: {methods:?}");
    let translated = "holdfast_bridge_requests_total{outcome=\"translated\"}";
    assert_eq!(holdfast.metric(translated).await, 0.0);
}

#[tokio::test]
async fn a_2025_clients_log_level_goes_with_each_request_to_a_2026_only_server() {
    let dir = TempDir::new("bridge-modern-log");
    let server = crate::era_bridge::modern_only(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr()), false).await;
    let mut client = crate::support::clients::PeerClient::start(&holdfast.url("/mcp")).await;
    let logs = async |client: &mut crate::support::clients::PeerClient| {
        client.send(serde_json::json!({"op": "logs"}));
        client.result().await
    };
    let call = serde_json::json!({});
    assert_eq!(client.call("log", call.clone()).await, Ok("logged".into()));
    assert_eq!(
        logs(&mut client).await,
        Ok(String::new()),
        "no level set: none sent"
    );
    client.send(serde_json::json!({"op": "setLevel", "level": "warning"}));
    assert_eq!(
        client.result().await,
        Ok(String::new()),
        "{}",
        client.trace()
    );
    assert_eq!(client.call("log", call).await, Ok("logged".into()));
    assert_eq!(
        logs(&mut client).await,
        Ok("warning:a warning message,error:an error message".into()),
        "{}",
        client.trace()
    );
}

#[tokio::test]
async fn a_2026_only_servers_input_round_reaches_a_2025_client_as_its_request() {
    let dir = TempDir::new("bridge-modern-ask");
    let server = crate::era_bridge::modern_only(&dir).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    let url = holdfast.url("/mcp");
    let peer = crate::support::clients::Peer::TsSdkEliciting;
    let mut client = crate::support::clients::PeerClient::start_peer(peer, &url).await;
    let call = serde_json::json!({"item": "car"});
    // The server answers the call with an input round; the client is asked (an elicitation on
    // the call's stream), answers, and the call is sent again with its answer.
    assert_eq!(
        client.call("confirm", call).await,
        Ok("car: yes".into()),
        "{}",
        client.trace()
    );
    assert!(
        client.trace().contains("asked: Confirm car?"),
        "{}",
        client.trace()
    );
    assert_eq!(
        server.ledger().len(),
        1,
        "the tool ran once, with its answer"
    );
    let calls: Vec<serde_json::Value> = router
        .log()
        .iter()
        .filter(|r| r.rpc_method().as_deref() == Some("tools/call"))
        .filter_map(|r| serde_json::from_slice(&r.body).ok())
        .collect();
    assert_eq!(calls.len(), 2, "the call, and its retry with the answer");
    let retry = &calls[1]["params"];
    assert_eq!(
        retry["inputResponses"].as_object().map(|r| r.len()),
        Some(1)
    );
    assert!(retry["requestState"].is_string(), "{retry}");
    assert_ne!(calls[0]["id"], calls[1]["id"], "a retry has a new id");
}

#[tokio::test]
async fn a_2025_clients_subscription_reaches_a_2026_only_server_on_its_get_stream() {
    let dir = TempDir::new("bridge-modern-subscribe");
    let mut server = crate::era_bridge::modern_only(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr()), false).await;
    let mut client = crate::support::clients::PeerClient::start(&holdfast.url("/mcp")).await;
    // The client's GET stream is open (a listen for list changes) before it subscribes: the
    // subscription is one more listen on it.
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v >= 1.0)
        .await;
    client.send(serde_json::json!({"op": "subscribe", "uri": "note://1"}));
    assert_eq!(
        client.result().await,
        Ok(String::new()),
        "{}",
        client.trace()
    );
    holdfast
        .metric_until("holdfast_sse_streams_active", |v| v >= 2.0)
        .await;
    let update = |uri: &str| serde_json::json!({ "uri": uri });
    assert_eq!(
        client.call("update", update("note://2")).await,
        Ok("updated".into())
    );
    assert_eq!(
        client.call("update", update("note://1")).await,
        Ok("updated".into())
    );
    client.send(serde_json::json!({"op": "updated"}));
    assert_eq!(
        client.result().await,
        Ok("note://1".into()),
        "only the URI subscribed to: {}",
        client.trace()
    );
    // After the server's restart the client opens its GET stream again, and its listen names
    // the subscription from the start.
    // Nothing but that GET is sent meanwhile: once it is answered, the listen is open.
    let translated = "holdfast_bridge_requests_total{outcome=\"translated\"}";
    let before = holdfast.metric(translated).await;
    server.kill().await;
    server.start_again().await;
    holdfast.metric_until(translated, |v| v > before).await;
    assert_eq!(
        client.call("update", update("note://1")).await,
        Ok("updated".into())
    );
    client.send(serde_json::json!({"op": "updated"}));
    assert_eq!(
        client.result().await,
        Ok("note://1".into()),
        "{}",
        client.trace()
    );
}

#[tokio::test]
async fn a_call_refused_for_headers_of_a_tool_added_since_goes_again_with_them() {
    let dir = TempDir::new("bridge-modern-grow");
    let server = crate::era_bridge::modern_only(&dir).await;
    let router = FakeRouter::start(server.addr()).await;
    let holdfast = bridging(&format!("http://{}", router.addr), false).await;
    let mut client = crate::support::clients::PeerClient::start(&holdfast.url("/mcp")).await;
    // The first call lists the tools to learn what they mirror in headers; zone is not yet one.
    let hi = serde_json::json!({"text": "hi"});
    assert_eq!(client.call("echo", hi).await, Ok("hi".into()));
    assert_eq!(
        client.call("grow", serde_json::json!({})).await,
        Ok("grown".into())
    );
    let args = serde_json::json!({"zone": "z1", "q": "x"});
    assert_eq!(
        client.call("zone", args).await,
        Ok("x#z1".into()),
        "{}",
        client.trace()
    );
    let zone_calls: Vec<_> = router
        .log()
        .iter()
        .filter(|r| r.rpc_method().as_deref() == Some("tools/call"))
        .filter(|r| std::str::from_utf8(&r.body).is_ok_and(|b| b.contains("\"zone\"")))
        .map(|r| r.status.map(|s| s.as_u16()))
        .collect();
    // Refused without the header (the server's -32020: the tool did not run), then sent again
    // with it, the tools listed anew.
    assert_eq!(zone_calls, [Some(400), Some(200)]);
}

#[tokio::test]
async fn a_2025_clients_cancellation_closes_the_calls_stream_at_a_2026_only_server() {
    let dir = TempDir::new("bridge-modern-cancel");
    let server = crate::era_bridge::modern_only(&dir).await;
    let holdfast = bridging(&format!("http://{}", server.addr()), false).await;
    let mut client = crate::support::clients::PeerClient::start(&holdfast.url("/mcp")).await;
    client.send(serde_json::json!({"op": "cancel", "tool": "slow"}));
    assert_eq!(
        client.result().await,
        Ok("cancelled".into()),
        "{}",
        client.trace()
    );
    // The client's notifications/cancelled closed the call's stream, which a 2026-07-28
    // server takes as the cancellation: the tool stops waiting.
    let was_cancelled =
        |ledger: &[crate::support::python::Ran]| ledger.iter().any(|ran| ran.tool == "cancelled");
    let ledger = server.ledger_until(was_cancelled).await;
    assert!(was_cancelled(&ledger), "not cancelled: {}", server.trace());
}
