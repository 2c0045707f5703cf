//! The reader against the specifications' cases, and the fast method scan against the reader.

use super::*;

fn kind(body: &str) -> Option<Kind> {
    one(body.as_bytes()).map(|m| m.kind())
}

#[test]
fn requests_notifications_responses_and_what_is_none_of_them() {
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
        Some(Kind::Request)
    );
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#),
        Some(Kind::Request)
    );
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
        Some(Kind::Notification)
    );
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
        Some(Kind::Response)
    );
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":1,"result":null}"#),
        Some(Kind::Response)
    );
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#),
        Some(Kind::Response)
    );
    // MCP: a request's id is never null; nor an object, a boolean.
    for id in ["null", "{}", "true", "[1]"] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        assert_eq!(kind(&body), Some(Kind::Invalid), "{body}");
    }
    // Both result and error, or neither.
    assert_eq!(
        kind(r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#),
        Some(Kind::Invalid)
    );
    assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1}"#), Some(Kind::Invalid));
    // Not JSON-RPC 2.0 at all.
    for body in [
        r#"{"id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping""#,
        "7",
        "not json",
        "",
    ] {
        assert!(one(body.as_bytes()).is_none(), "{body}");
    }
}

#[test]
fn ids_are_kept_as_written() {
    for id in [
        "7",
        "-1",
        "1e3",
        "1.0",
        r#""7""#,
        r#""a\"b""#,
        "12345678901234567890123",
    ] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call"}}"#);
        let got = one(body.as_bytes()).and_then(|m| m.request_id());
        assert_eq!(got.as_ref().map(Id::as_raw), Some(id), "{body}");
    }
}

#[test]
fn a_batch_is_read_as_one_and_its_messages_each() {
    let body =
        br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"},{"x":1}]"#;
    let Read::Batch(messages) = read(body) else {
        panic!("a batch")
    };
    let kinds: Vec<Kind> = messages.iter().map(Message::kind).collect();
    assert_eq!(kinds, [Kind::Request, Kind::Notification]);
    assert!(one(body).is_none(), "a batch is not one message");
}

#[test]
fn params_results_and_errors() {
    let call = one(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"look\u0075p","arguments":{"name":"x"}}}"#).unwrap();
    assert_eq!(call.tool().as_deref(), Some("lookup"));
    let list =
        one(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"x"}}"#).unwrap();
    assert_eq!(list.tool(), None, "only a tools/call calls a tool");
    let ok = one(br#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#).unwrap();
    assert_eq!(ok.result(), Some(serde_json::json!({"a":1})));
    assert_eq!(ok.error(), None);
    let err =
        one(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#)
            .unwrap();
    assert_eq!(err.error(), Some((-32601, "Method not found".into())));
    assert_eq!(err.result(), None);
}

#[test]
fn the_scan_finds_the_top_level_method_wherever_it_stands() {
    let scan = |b: &str| method_scan(b.as_bytes()).map(|m| String::from_utf8(m.to_vec()).unwrap());
    assert_eq!(
        scan(r#"{"params":{"method":"ping","a":[{"method":"initialize"}]},"method":"tools/list","id":2}"#).as_deref(),
        Some("tools/list")
    );
    assert_eq!(
        scan(r#"{"id":"{\"method\":\"ping\"}","x":"]}","method":"prompts/get"}"#).as_deref(),
        Some("prompts/get")
    );
    for body in [
        r#"[{"method":"ping"}]"#,
        r#"{"method":"tools\/call"}"#,
        r#"{"method":7}"#,
        "x",
    ] {
        assert_eq!(scan(body), None, "{body}");
    }
}

/// A JSON-RPC-ish body built from parts, some of them wrong on purpose.
fn body_of(
    id: &str,
    method: Option<&str>,
    members_first: bool,
    jsonrpc: bool,
    params: &str,
) -> String {
    let mut members: Vec<String> = Vec::new();
    if jsonrpc {
        members.push(r#""jsonrpc":"2.0""#.into());
    }
    if !id.is_empty() {
        members.push(format!(r#""id":{id}"#));
    }
    let params = format!(r#""params":{params}"#);
    let method = method.map(|m| format!(r#""method":{m}"#));
    if members_first {
        members.push(params);
        members.extend(method);
    } else {
        members.extend(method);
        members.push(params);
    }
    format!("{{{}}}", members.join(","))
}

proptest::proptest! {
    /// Wherever the reader finds a method, the metric's scan finds the same one (or, for a name
    /// written with escapes, none: then the label is `other`, never another method's).
    #[test]
    fn the_scan_agrees_with_the_reader(
        id in proptest::sample::select(vec!["", "1", "-7", "1e3", "2.5", "null", r#""s""#, r#""a\"}b""#, "{}", "true"]),
        method in proptest::option::of(proptest::sample::select(vec![
            r#""ping""#, r#""tools/call""#, r#""tools\/call""#, r#""server/discover""#, "7", r#""""#,
        ])),
        params in proptest::sample::select(vec![
            "{}", r#"{"name":"lookup"}"#, r#"{"method":"initialize","a":[{"method":"x"}]}"#,
            r#"{"s":"\"method\":\"ping\"}"}"#, "[1,{}]", "null",
        ]),
        members_first in proptest::bool::ANY,
        jsonrpc in proptest::bool::ANY,
    ) {
        let body = body_of(id, method, members_first, jsonrpc, params);
        if let Some(message) = one(body.as_bytes()) {
            if let Some(read_method) = message.method() {
                match method_scan(body.as_bytes()) {
                    Some(scanned) => proptest::prop_assert_eq!(scanned, read_method.as_bytes(), "{}", body),
                    None => proptest::prop_assert!(body.contains('\\'), "{}", body),
                }
            }
            // A request has an id, and an id is a request's only when it is a string or number.
            let is_request = message.kind() == Kind::Request;
            proptest::prop_assert_eq!(is_request, message.request_id().is_some());
            if let Some(request_id) = message.request_id() {
                proptest::prop_assert_eq!(request_id.as_raw(), id);
            }
        }
    }
}

#[test]
fn a_param_is_read_alone_escaped_or_not_the_last_when_twice() {
    let msg = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
    };
    let body = msg(r#"{"arguments":{"text":"a \"big\" one","n":[1,2,{"x":null}]},"name":"echo"}"#);
    assert_eq!(
        one(body.as_bytes()).unwrap().param_str("name").as_deref(),
        Some("echo")
    );
    // Names and values escaped; a member given twice keeps its last value, as a map would.
    let body = msg(r#"{"n\u0061me":"first","name":"l\u00e9\"st"}"#);
    assert_eq!(
        one(body.as_bytes()).unwrap().param_str("name").as_deref(),
        Some("lé\"st")
    );
    for params in [
        r#"{"name":7}"#,
        r#"{"other":"x"}"#,
        r#"["name"]"#,
        "null",
        r#"{"name":null}"#,
    ] {
        let body = msg(params);
        assert_eq!(
            one(body.as_bytes()).unwrap().param_str("name"),
            None,
            "{params}"
        );
    }
}

#[test]
fn a_calls_tool_is_read_in_one_pass_as_the_reader_reads_it() {
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"t":"a \"b\""},"name":"echo"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"l\u00e9"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":null}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}]"#,
        "not json",
    ] {
        let reader = one(body.as_bytes()).and_then(|m| m.param_str("name"));
        assert_eq!(call_tool_name(body.as_bytes()), reader, "{body}");
    }
    let named = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#;
    assert_eq!(call_tool_name(named.as_bytes()).as_deref(), Some("echo"));
}
