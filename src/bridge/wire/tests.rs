use serde_json::json;

use super::*;

/// A `tools/call` as the Python SDK's client pinned to 2026-07-28 sent it (design 1.1), with
/// a progress token and a foreign `_meta` key beside the envelope.
fn modern_call() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}, "roots": {"listChanged": true}},
            "io.modelcontextprotocol/logLevel": "info",
            "progressToken": "p-1",
            "com.example/trace": "x"
        }}
    }))
    .unwrap()
}

fn parse(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

#[test]
fn a_modern_request_loses_its_envelope_and_gets_the_sessions_id() {
    let legacy = request_to_legacy(&modern_call(), 41).unwrap();
    assert_eq!(legacy.method, "tools/call");
    assert_eq!(legacy.client_id, json!(3));
    assert_eq!(
        legacy.envelope.client_info,
        Some(json!({"name": "mcp", "version": "0.1.0"}))
    );
    assert_eq!(legacy.envelope.log_level.as_deref(), Some("info"));
    assert_eq!(
        parse(&legacy.body),
        json!({
            "jsonrpc": "2.0", "id": 41, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"},
                       "_meta": {"progressToken": "p-1", "com.example/trace": "x"}}
        })
    );
    // Nothing but the envelope in `_meta`: no `_meta` at all.
    let list = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let legacy = request_to_legacy(&serde_json::to_vec(&list).unwrap(), 1).unwrap();
    assert_eq!(legacy.client_id, json!("a"));
    assert_eq!(
        parse(&legacy.body),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    );
}

#[test]
fn what_is_not_a_request_is_refused_with_the_reason() {
    for (body, want) in [
        (&b"not json"[..], "not one JSON-RPC"),
        (
            br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
            "not one JSON-RPC",
        ),
        (
            br#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#,
            "not one JSON-RPC",
        ),
        (
            br#"{"jsonrpc":"2.0","method":"notifications/x"}"#,
            "not a request",
        ),
        (
            br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#,
            "not a request",
        ),
    ] {
        let e = request_to_legacy(body, 1).unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(body));
    }
}

#[test]
fn a_legacy_answer_gets_the_clients_id_and_what_a_modern_client_requires() {
    let client_id = json!("c-7");
    let list = br#"{"jsonrpc":"2.0","id":41,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}"#;
    let got = parse(&answer_to_modern(list, &client_id, "tools/list").unwrap());
    assert_eq!(got["id"], client_id);
    assert_eq!(got["result"]["resultType"], "complete");
    assert_eq!(got["result"]["ttlMs"], 0);
    assert_eq!(got["result"]["cacheScope"], "private");
    assert_eq!(got["result"]["tools"][0]["name"], "echo");
    // A call's result is not cached: no ttlMs; what the server said itself is kept.
    let call = br#"{"jsonrpc":"2.0","id":42,"result":{"content":[],"isError":true,"resultType":"complete"}}"#;
    let got = parse(&answer_to_modern(call, &json!(3), "tools/call").unwrap());
    assert_eq!(got["result"]["isError"], true);
    assert!(got["result"].get("ttlMs").is_none(), "{got}");
    // An error passes with the client's id.
    let err = br#"{"jsonrpc":"2.0","id":43,"error":{"code":-32602,"message":"bad"}}"#;
    let got = parse(&answer_to_modern(err, &json!(3), "tools/call").unwrap());
    assert_eq!(
        got,
        json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "bad"}})
    );
    // A request from the server is not an answer.
    let s2c = br#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{}}"#;
    assert_eq!(
        answer_to_modern(s2c, &json!(3), "tools/call"),
        Err(WireError::NotResponse)
    );
}

#[test]
fn the_bridges_initialize_speaks_for_the_client_at_the_legacy_version() {
    let envelope = request_to_legacy(&modern_call(), 1).unwrap().envelope;
    let init = parse(&legacy_initialize(&envelope, 0));
    assert_eq!(init["method"], "initialize");
    assert_eq!(init["params"]["protocolVersion"], LEGACY);
    assert_eq!(init["params"]["clientInfo"]["name"], "mcp");
    assert_eq!(
        init["params"]["capabilities"],
        json!({"elicitation": {"form": {}}, "roots": {}}),
        "roots.listChanged is a notification a 2026 client never sends"
    );
    let bare = parse(&legacy_initialize(&Envelope::default(), 0));
    assert_eq!(bare["params"]["clientInfo"]["name"], "holdfast");
    assert_eq!(bare["params"]["capabilities"], json!({}));
}

#[test]
fn headers_lose_the_modern_routing_and_carry_the_session() {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "echo"),
        ("mcp-param-region", "eu"),
        ("content-length", "99"),
        ("authorization", "Bearer t"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    assert!(is_modern(&h));
    headers_to_legacy(&mut h, LEGACY, HeaderValue::from_static("hf1.token"));
    assert!(!is_modern(&h));
    let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["authorization", "mcp-protocol-version", "mcp-session-id"]
    );
    assert_eq!(h["mcp-protocol-version"], LEGACY);
}

#[test]
fn a_bridged_streams_answer_is_translated_its_progress_passed_its_asks_kept_and_the_rest_dropped() {
    let sent = |upstream_id, log_level: Option<&str>| Sent {
        upstream_id,
        client_id: json!("c-1"),
        method: "tools/call".into(),
        log_level: log_level.map(str::to_owned),
    };
    let answer = br#"{"jsonrpc":"2.0","id":9,"result":{"content":[]}}"#;
    let EventOut::Answer(out) = event_to_modern(answer, &sent(9, None)) else {
        panic!("the answer is translated");
    };
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["id"], "c-1");
    assert_eq!(out["result"]["resultType"], "complete");
    // Another request's answer on a shared session is not this one's.
    assert_eq!(event_to_modern(answer, &sent(10, None)), EventOut::Pass);
    let progress = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
    assert_eq!(event_to_modern(progress, &sent(9, None)), EventOut::Pass);
    // A request for input during a call is an input round's; any other request of the
    // server's has no 2026 carrier.
    let asks = br#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{}}"#;
    assert!(matches!(
        event_to_modern(asks, &sent(9, None)),
        EventOut::Ask(_)
    ));
    let ping = br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    assert_eq!(event_to_modern(ping, &sent(9, None)), EventOut::Drop);
    assert_eq!(event_to_modern(b"", &sent(9, None)), EventOut::Pass);
}

#[test]
fn log_messages_pass_only_from_the_level_the_request_opted_in_to() {
    let log = |level: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"{level}","data":"x"}}}}"#
        )
    };
    let sent = |log_level: Option<&str>| Sent {
        upstream_id: 1,
        client_id: json!(1),
        method: "tools/call".into(),
        log_level: log_level.map(str::to_owned),
    };
    let out = |level: &str, wanted| event_to_modern(log(level).as_bytes(), &sent(wanted));
    assert_eq!(out("error", None), EventOut::Drop, "no opt-in, no log");
    assert_eq!(out("info", Some("warning")), EventOut::Drop);
    assert_eq!(out("warning", Some("warning")), EventOut::Pass);
    assert_eq!(out("emergency", Some("warning")), EventOut::Pass);
    assert_eq!(out("loud", Some("debug")), EventOut::Drop, "no such level");
    assert_eq!(level_rank("debug"), Some(0));
    assert!(level_rank("notice") < level_rank("warning"));
}

#[test]
fn a_legacy_servers_discover_answer_is_made_from_its_initialize_result() {
    let initialized = json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {}, "resources": {"subscribe": true}},
        "serverInfo": {"name": "everything", "version": "2"},
        "instructions": "be kind",
    });
    let result = discover_result(&initialized);
    assert_eq!(result["supportedVersions"], json!([MODERN]));
    assert_eq!(result["capabilities"], initialized["capabilities"]);
    assert_eq!(result["instructions"], "be kind");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"],
        initialized["serverInfo"]
    );
    assert_eq!(result["resultType"], "complete");
    assert_eq!(
        (result["ttlMs"].clone(), result["cacheScope"].clone()),
        (json!(0), json!("private"))
    );
    let bare = discover_result(&json!({}));
    assert_eq!(bare["capabilities"], json!({}));
    assert!(bare.get("_meta").is_none() && bare.get("instructions").is_none());
    let answer = result_for(&json!("d1"), bare);
    assert_eq!(
        (answer["id"].clone(), answer["jsonrpc"].clone()),
        (json!("d1"), json!("2.0"))
    );
}

fn sent(method: &str) -> Sent {
    Sent {
        upstream_id: 5,
        client_id: json!(1),
        method: method.into(),
        log_level: None,
    }
}

fn message(text: &str) -> Map<String, Value> {
    serde_json::from_str(text).unwrap()
}

#[test]
fn a_servers_request_for_input_during_a_call_becomes_an_input_round() {
    let elicit = message(
        r#"{"jsonrpc":"2.0","id":0,"method":"elicitation/create","params":{"message":"Name?"}}"#,
    );
    let ask = ask_of(&elicit, &sent("tools/call")).expect("asked during a call");
    assert_eq!(ask.method, "elicitation/create");
    assert_eq!(
        ask_of(&elicit, &sent("tools/list")),
        None,
        "not a round's method"
    );
    let ping = message(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    assert_eq!(ask_of(&ping, &sent("tools/call")), None);
    let note = message(r#"{"jsonrpc":"2.0","method":"elicitation/create"}"#);
    assert_eq!(ask_of(&note, &sent("tools/call")), None, "no id");

    let out: Value = serde_json::from_slice(&input_required(&json!(7), &ask, "hf1.x")).unwrap();
    assert_eq!(out["id"], 7);
    assert_eq!(out["result"]["resultType"], "input_required");
    assert_eq!(out["result"]["requestState"], "hf1.x");
    assert_eq!(
        out["result"]["inputRequests"]["elicitation/create"],
        json!({"method": "elicitation/create", "params": {"message": "Name?"}})
    );
}
