//! OpenTelemetry traces, end to end: the real binary exporting to a real OTLP/HTTP receiver
//! (`tests/python/otlp_receiver.py`, which decodes with the official `opentelemetry-proto`
//! definitions, not holdfast's crates), and what the server behind it sees of the trace.

use serde_json::Value;

use crate::support::hold::request;
use crate::support::http::{self, response, Reserved, Upstream};
use crate::support::process::{serving, Running};
use crate::support::proxy::metric_until_at;
use crate::support::python::python_script;
use crate::support::script::Script;

const JSON: (&str, &str) = ("content-type", "application/json");
const PROTO: (&str, &str) = ("opentelemetry.proto", "opentelemetry-proto==1.45.2");

/// The client's trace: its id and the span the request was sent from.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The receiver, answering `status`, and the traces URL it listens on.
async fn receiver(status: Option<&str>) -> (Script, String) {
    let args: Vec<&str> = status.map(|s| vec!["--status", s]).unwrap_or_default();
    let name = "the OTLP receiver".to_owned();
    let mut script = python_script(name, "otlp_receiver.py", &args, PROTO);
    let port = script.next_event("its port").await["listening"].clone();
    (script, format!("http://127.0.0.1:{port}/v1/traces"))
}

/// The next `n` spans the receiver got, in the order they came.
async fn spans(receiver: &mut Script, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for i in 0..n {
        got.push(receiver.next_event(&format!("span {} of {n}", i + 1)).await);
    }
    got
}

/// holdfast in front of `upstream`, tracing to `endpoint`.
fn traced(upstream: &str, endpoint: &str) -> std::process::Command {
    let mut cmd = serving(upstream, &[]);
    cmd.env("HOLDFAST_TRACING__ENABLED", "true")
        .env("HOLDFAST_TRACING__ENDPOINT", endpoint)
        // A tool holdfast knows by name: spans may name it.
        .env("HOLDFAST_RETRY__IDEMPOTENT_TOOLS", "[count]")
        // The check at rest off: the first request must meet the refused connection itself.
        .env("HOLDFAST_HOLD__CHECK_INTERVAL_SECS", "0");
    cmd
}

fn event<'a>(span: &'a Value, name: &str) -> Option<&'a Value> {
    span["events"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

#[tokio::test]
async fn a_held_then_replayed_call_is_one_trace_under_the_clients_traceparent() {
    let (mut otlp, endpoint) = receiver(None).await;
    let upstream = Reserved::new();
    let mut proxy = Running::start(
        traced(&upstream.url(), &endpoint)
            // The standard variables: the exporter's headers, the resource's attributes.
            .env("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret%21")
            .env("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=pod-1"),
    );
    let (listen, admin) = proxy.addresses();
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let call = tokio::spawn(async move {
        let said = [
            JSON,
            ("traceparent", traceparent.as_str()),
            ("tracestate", "vendor=client"),
            ("x-request-id", "traced-call"),
        ];
        let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count"}}"#;
        request("POST", &format!("http://{listen}/mcp"), &said, body).await
    });
    // Refused, so held; then the server comes back and the call is replayed to it.
    metric_until_at(&admin.to_string(), "holdfast_held_requests", |v| v >= 1.0).await;
    let back = Upstream::serve(upstream.listen(), |seen: http::Seen| async move {
        response(200, &[JSON], seen.body)
    });
    assert_eq!(call.await.unwrap().status, 200);
    let seen = back.seen();
    assert_eq!(seen.len(), 1, "the call ran once");

    // The server span ends with its answer's body; the batch goes within a second.
    let mut got = spans(&mut otlp, 3).await;
    got.sort_by_key(|s| s["start"].as_u64());
    let [server, refused, replayed] = &got[..] else {
        unreachable!()
    };
    for span in &got {
        assert_eq!(
            span["trace_id"], TRACE_ID,
            "one trace, the client's: {span}"
        );
        assert_eq!(span["resource"]["service.name"], "holdfast", "{span}");
        assert_eq!(span["resource"]["k8s.pod.name"], "pod-1", "{span}");
        assert_eq!(span["scope"], "holdfast");
        assert_eq!(span["content_type"], "application/x-protobuf");
        assert_eq!(span["api_key"], "s3cret!");
    }

    assert_eq!(server["kind"], "server", "{server}");
    assert_eq!(server["parent_span_id"], CLIENT_SPAN, "{server}");
    // Sampled (the client said so), and its parent known to be remote.
    assert_eq!(server["flags"], 0x301, "{server}");
    assert_eq!(server["name"], "tools/call count", "{server}");
    let attrs = &server["attributes"];
    assert_eq!(attrs["http.request.method"], "POST");
    assert_eq!(attrs["http.response.status_code"], 200);
    assert_eq!(attrs["mcp.method.name"], "tools/call");
    assert_eq!(attrs["gen_ai.tool.name"], "count");
    assert_eq!(attrs["holdfast.action"], "replayed");
    assert_eq!(attrs["holdfast.request_id"], "traced-call");
    assert_eq!(attrs["client.address"], "127.0.0.1");
    let held = event(server, "held").unwrap_or_else(|| panic!("no held event: {server}"));
    assert_eq!(held["attributes"]["holdfast.reason"], "connect_refused");
    let released = event(server, "released").expect("a released event");
    assert_eq!(released["attributes"]["holdfast.outcome"], "go");
    assert!(event(server, "replayed").is_some(), "{server}");
    let names: Vec<&str> = server["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["held", "released", "replayed"], "in order");
    assert_eq!(server["status"], "unset", "answered 200: {server}");

    for attempt in [refused, replayed] {
        assert_eq!(attempt["kind"], "client", "{attempt}");
        assert_eq!(attempt["parent_span_id"], server["span_id"], "{attempt}");
        assert_eq!(attempt["name"], "POST");
        assert_eq!(attempt["attributes"]["server.address"], "127.0.0.1");
    }
    assert_eq!(refused["flags"], 0x101, "a local parent: {refused}");
    assert_eq!(refused["attributes"]["error.type"], "connect_refused");
    assert_eq!(refused["status"], "error");
    assert_eq!(replayed["attributes"]["http.response.status_code"], 200);
    assert_eq!(replayed["attributes"]["http.request.resend_count"], 1);

    // The server got the attempt's own span as its parent, and the client's trace state.
    let sent = &seen[0].headers;
    let expected = format!("00-{TRACE_ID}-{}-01", replayed["span_id"].as_str().unwrap());
    assert_eq!(sent["traceparent"], expected.as_str());
    assert_eq!(sent["tracestate"], "vendor=client");

    // Counted once the receiver has answered.
    let series = r#"holdfast_trace_spans_total{outcome="exported"}"#;
    let exported = metric_until_at(&admin.to_string(), series, |v| v >= 3.0).await;
    assert_eq!(exported, 3.0);
    tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    back.stop().await;
}

#[tokio::test]
async fn an_event_streams_span_ends_with_the_stream_and_a_new_trace_starts_without_a_parent() {
    let (mut otlp, endpoint) = receiver(None).await;
    let up = Upstream::start(|_| async {
        let events = "event: message\ndata: 1\n\n: keep-alive\n\ndata: 2\n\nid: 3\ndata: 3\n\n";
        response(200, &[("content-type", "text/event-stream")], events)
    })
    .await;
    let mut proxy = Running::start(&mut traced(&up.url(), &endpoint));
    let (listen, _) = proxy.addresses();
    let got = request("GET", &format!("http://{listen}/mcp"), &[], "").await;
    assert_eq!(got.status, 200);
    let sent = up.seen();
    let mut got = spans(&mut otlp, 2).await;
    got.sort_by_key(|s| s["start"].as_u64());
    let [server, attempt] = &got[..] else {
        unreachable!()
    };
    assert_eq!(server["parent_span_id"], "", "a trace of its own: {server}");
    assert_eq!(server["name"], "GET");
    let ended = event(server, "stream ended").unwrap_or_else(|| panic!("{server}"));
    assert_eq!(ended["attributes"]["holdfast.reason"], "upstream_ended");
    assert_eq!(ended["attributes"]["holdfast.events"], 3, "{ended}");
    assert!(server["end"].as_u64() >= attempt["end"].as_u64());
    // No tracestate of the client's to pass on: none is sent, not an empty one.
    let headers = &sent[0].headers;
    assert!(headers.get("tracestate").is_none(), "{headers:?}");
    let trace_id = server["trace_id"].as_str().unwrap();
    let traceparent = headers["traceparent"].to_str().unwrap();
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "{traceparent}"
    );
    tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    up.stop().await;
}

#[tokio::test]
async fn a_collector_that_refuses_costs_no_request_and_is_counted() {
    let (_otlp, endpoint) = receiver(Some("503")).await;
    let up =
        Upstream::start(|seen: http::Seen| async move { response(200, &[JSON], seen.body) }).await;
    let mut proxy = Running::start(&mut traced(&up.url(), &endpoint));
    let (listen, admin) = proxy.addresses();
    for id in 0..3 {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        let got = request("POST", &format!("http://{listen}/mcp"), &[JSON], &body).await;
        assert_eq!(got.status, 200);
    }
    let series = r#"holdfast_trace_spans_total{outcome="failed"}"#;
    let failed = metric_until_at(&admin.to_string(), series, |v| v >= 6.0).await;
    assert_eq!(failed, 6.0, "3 server spans and 3 attempts");
    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    let warned = stderr.iter().any(|l| l.contains("exporting spans failed"));
    assert!(warned, "{stderr:?}");
    up.stop().await;
}

#[tokio::test]
async fn with_tracing_off_the_clients_trace_headers_pass_untouched() {
    let up =
        Upstream::start(|seen: http::Seen| async move { response(200, &[JSON], seen.body) }).await;
    let mut proxy = Running::start(&mut serving(&up.url(), &[]));
    let (listen, _) = proxy.addresses();
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let said = [
        JSON,
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=client"),
    ];
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let got = request("POST", &format!("http://{listen}/mcp"), &said, body).await;
    assert_eq!(got.status, 200);
    let seen = up.seen();
    assert_eq!(seen[0].headers["traceparent"], traceparent.as_str());
    assert_eq!(seen[0].headers["tracestate"], "vendor=client");
    tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    up.stop().await;
}

#[tokio::test]
async fn a_trace_begun_here_is_sampled_at_the_ratio_and_a_clients_sampled_one_always() {
    let (mut otlp, endpoint) = receiver(None).await;
    let up =
        Upstream::start(|seen: http::Seen| async move { response(200, &[JSON], seen.body) }).await;
    let mut proxy =
        Running::start(traced(&up.url(), &endpoint).env("HOLDFAST_TRACING__SAMPLE_RATIO", "0"));
    let (listen, admin) = proxy.addresses();
    let url = format!("http://{listen}/mcp");
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    assert_eq!(request("POST", &url, &[JSON], ping).await.status, 200);
    let sampled = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let said = [JSON, ("traceparent", sampled.as_str())];
    assert_eq!(request("POST", &url, &said, ping).await.status, 200);

    let seen = up.seen();
    // Not recorded, but its context still goes on, marked not sampled, so the server's own
    // spans follow the decision.
    let unsampled = seen[0].headers["traceparent"].to_str().unwrap();
    assert!(unsampled.ends_with("-00"), "{unsampled}");
    let followed = seen[1].headers["traceparent"].to_str().unwrap();
    assert!(followed.starts_with(&format!("00-{TRACE_ID}-")) && followed.ends_with("-01"));

    // Both requests' spans would go in one batch: only the client's trace was recorded.
    let series = r#"holdfast_trace_spans_total{outcome="exported"}"#;
    let exported = metric_until_at(&admin.to_string(), series, |v| v >= 2.0).await;
    assert_eq!(exported, 2.0);
    for span in spans(&mut otlp, 2).await {
        assert_eq!(span["trace_id"], TRACE_ID, "{span}");
    }
    tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    up.stop().await;
}

#[tokio::test]
async fn a_client_gone_while_held_ends_its_span_as_counted() {
    let (mut otlp, endpoint) = receiver(None).await;
    let upstream = Reserved::new();
    let mut proxy = Running::start(&mut traced(&upstream.url(), &endpoint));
    let (listen, admin) = proxy.addresses();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mut client = tokio::net::TcpStream::connect(listen).await.unwrap();
    let post = format!(
        "POST /mcp HTTP/1.1\r\nhost: {listen}\r\ncontent-type: application/json\r\n\
         x-request-id: gone\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut client, post.as_bytes())
        .await
        .unwrap();
    metric_until_at(&admin.to_string(), "holdfast_held_requests", |v| v >= 1.0).await;
    drop(client);
    // The refused attempt's span, then the server span, cut.
    let got = spans(&mut otlp, 2).await;
    let server = got
        .iter()
        .find(|s| s["kind"] == "server")
        .unwrap_or_else(|| panic!("{got:?}"));
    assert_eq!(server["attributes"]["holdfast.request_id"], "gone");
    assert_eq!(
        server["attributes"]["http.response.status_code"], 499,
        "{server}"
    );
    assert_eq!(
        server["attributes"]["holdfast.action"], "client_gone",
        "{server}"
    );
    assert!(event(server, "held").is_some(), "{server}");
    tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
}
