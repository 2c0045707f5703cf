//! The places that read a request's JSON-RPC agree on what it is (issue 27): the 503's echoed
//! id, the decision to send it twice, the session recorder and the metric label. Before, three
//! readers gave a string id, a number with an exponent, a null id and a batch different
//! answers depending on which path read the request.

use std::time::Duration;

use http::HeaderMap;
use http_body_util::BodyExt;
use proptest::prelude::*;

use holdfast::classify::RewriteReason;
use holdfast::idempotent::Idempotency;
use holdfast::mcp_method::McpMethod;
use holdfast::session::rpc;

/// The id the 503 for `body` echoes, as written, if it is a JSON-RPC error at all.
fn echoed_id(body: &str) -> Option<String> {
    let resp = holdfast::respond::unavailable(
        RewriteReason::ConnectRefused,
        Duration::from_secs(1),
        Some(body.as_bytes()),
    );
    let bytes = futures_lite_block(resp.into_body().collect())
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    // `{"jsonrpc":"2.0","id":<raw>,"error":...}`: the raw id stands between its key and the
    // error's.
    let rest = text.strip_prefix(r#"{"jsonrpc":"2.0","id":"#)?;
    Some(rest[..rest.find(r#","error":"#)?].to_owned())
}

/// Polls a future that never waits (a body of full frames) to its end.
fn futures_lite_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn body_of(id: &str, method: &str, name: &str, batch: bool) -> String {
    let id = if id.is_empty() {
        String::new()
    } else {
        format!(r#""id":{id},"#)
    };
    let message = format!(
        r#"{{"jsonrpc":"2.0",{id}"method":"{method}","params":{{"name":"{name}","level":"debug","protocolVersion":"2025-11-25"}}}}"#
    );
    if batch {
        format!("[{message}]")
    } else {
        message
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_reader_of_a_request_agrees(
        id in prop::sample::select(vec!["", "7", "-1", "1e3", "2.5", "0", "null", r#""7""#, r#""a b""#, "{}", "[]", "false"]),
        method in prop::sample::select(vec!["ping", "tools/call", "initialize", "logging/setLevel", "vendor/x"]),
        name in prop::sample::select(vec!["lookup", "record"]),
        batch in any::<bool>(),
    ) {
        let body = body_of(id, method, name, batch);
        // A request: one message, an id that is a string or a number.
        let valid_id = id.starts_with(['"', '-']) || id.starts_with(|c: char| c.is_ascii_digit());
        let is_request = !batch && valid_id;
        // The 503 echoes exactly the id as the client wrote it, and only a request's.
        let echoed = echoed_id(&body);
        prop_assert_eq!(echoed.as_deref(), is_request.then_some(id), "{}", body);
        // Sent twice only if it is a request (ping is read-only; `lookup` configured safe).
        let safety = Idempotency::new(true, false, &["lookup".to_owned()], &[]);
        let safe = safety.judge(None, &HeaderMap::new(), body.as_bytes()).is_some();
        let safe_method = method == "ping" || (method == "tools/call" && name == "lookup");
        prop_assert_eq!(safe, is_request && safe_method, "{}", body);
        // The session recorder: an initialize is tracked, a setLevel recorded, only as requests.
        prop_assert_eq!(rpc::initialize(body.as_bytes()).is_some(), is_request && method == "initialize", "{}", body);
        let recorded = !rpc::state_changes(body.as_bytes()).is_empty();
        // (A batch's requests are each recorded.)
        let recordable = valid_id && method == "logging/setLevel";
        prop_assert_eq!(recorded, recordable, "{}", body);
        // The metric label names the method of one message, whatever its id.
        let label = McpMethod::of_body(body.as_bytes());
        let expected = if batch { McpMethod::Other } else { McpMethod::from_name(method.as_bytes()) };
        prop_assert_eq!(label, expected, "{}", body);
    }
}
