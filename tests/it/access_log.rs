//! The access log's fuller lines: the request id, the client after the trusted proxies, bytes
//! in and out, the MCP method and a bounded tool name; an event stream's end with its events,
//! bytes, lifetime and reason; and the request's id on every other line logged about it (a
//! `request_id` key, src/telemetry/mod.rs).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Frame;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::support::hold::{call_body, request};
use crate::support::http::{self, response, ChannelBody, TestBody, Upstream};
use crate::support::process::{serving, Running};

const JSON: (&str, &str) = ("content-type", "application/json");

/// The JSON log lines holdfast wrote.
fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The access log's lines about the request `id`.
fn about<'a>(lines: &'a [Value], id: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access" && l["request_id"] == id)
        .collect()
}

fn call_tool(id: u64, tool: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}"}}}}"#)
}

#[tokio::test]
async fn an_access_line_names_the_request_its_client_bytes_method_and_a_known_tool_only() {
    let up = Upstream::start(|seen: http::Seen| async move {
        if seen.uri == "/slow" {
            // Never answers: a 502 once the response timeout passes, the request sent.
            std::future::pending::<()>().await;
        }
        response(200, &[JSON], seen.body)
    })
    .await;
    // Warnings, the access log and the start's lines only (the test reads the addresses from
    // them), as an operator who finds info too chatty sets it: the id is on a warning all the
    // same.
    let filter = "warn,holdfast::access=info,holdfast::server=info";
    let quiet = ["--access-log", "--log-level", filter];
    let mut proxy = Running::start(
        serving(&up.url(), &quiet)
            .env("HOLDFAST_RETRY__IDEMPOTENT_TOOLS", "[count]")
            .env("HOLDFAST_FORWARDED__TRUSTED_PROXIES", "[127.0.0.1]")
            .env("HOLDFAST_CLIENT__RESPONSE_TIMEOUT_SECS", "0.3"),
    );
    let (listen, _) = proxy.addresses();
    let url = |path: &str| format!("http://{listen}{path}");

    let known = call_tool(1, "count");
    let said = [JSON, ("x-request-id", "known-tool")];
    assert_eq!(
        request("POST", &url("/mcp"), &said, &known).await.status,
        200
    );
    let secret_tool = "tool-named-by-a-client-0xdeadbeef";
    let unknown = call_tool(2, secret_tool);
    // Behind a trusted proxy (this test, on 127.0.0.1): the address it says it saw.
    let said = [
        JSON,
        ("x-request-id", "unknown-tool"),
        ("x-forwarded-for", "198.51.100.1, 203.0.113.9"),
    ];
    assert_eq!(
        request("POST", &url("/mcp"), &said, &unknown).await.status,
        200
    );
    let said = [("x-request-id", "a-get")];
    assert_eq!(
        request("GET", &url("/other?q=1"), &said, "").await.status,
        200
    );
    // Sent, then the upstream never answered: the 502 and the warning that says why carry the
    // id.
    let said = [JSON, ("x-request-id", "broken")];
    let got = request("POST", &url("/slow"), &said, &call_body(3)).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("x-request-id"), Some("broken"));

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    up.stop().await;
    let all = stderr.join("\n");
    assert!(
        !all.contains(secret_tool),
        "a client's tool name was logged:\n{all}"
    );
    let lines = json_lines(&stderr);

    let line = about(&lines, "known-tool");
    assert_eq!(line.len(), 1, "{all}");
    let line = line[0];
    assert_eq!(line["client"], "127.0.0.1", "{line}");
    assert_eq!(line["mcp_method"], "tools/call");
    assert_eq!(line["tool"], "count", "a configured tool is named");
    assert_eq!(line["bytes_in"], known.len());
    assert_eq!(line["bytes_out"], known.len(), "the echo");
    assert_eq!(line["status"], 200);

    let line = about(&lines, "unknown-tool")[0];
    assert_eq!(line["client"], "203.0.113.9", "{line}");
    assert_eq!(
        line["tool"], "other",
        "a tool holdfast does not know is not named"
    );
    assert_eq!(line["bytes_in"], unknown.len());

    let line = about(&lines, "a-get")[0];
    assert_eq!(line["path"], "/other");
    assert_eq!(line["bytes_in"], 0);
    assert_eq!(line["bytes_out"], 0);
    assert!(line.get("mcp_method").is_none_or(Value::is_null), "{line}");
    assert!(line.get("tool").is_none_or(Value::is_null), "{line}");

    let line = about(&lines, "broken")[0];
    assert_eq!(line["status"], 502);
    assert_eq!(line["action"], "failed");
    let warned = lines
        .iter()
        .find(|l| l["level"] == "WARN" && l["reason"] == "response_timeout")
        .unwrap_or_else(|| panic!("no warning about the timeout:\n{all}"));
    assert_eq!(warned["request_id"], "broken", "{warned}");
}

/// The senders of the streams an upstream keeps open.
type Senders = Arc<Mutex<Vec<mpsc::Sender<Result<Frame<Bytes>, http::BoxError>>>>>;

/// An upstream that answers `/ends` with three events and ends, and `/open` with one event and
/// a stream that stays open (its sender kept in `open`).
async fn streaming(open: Senders) -> Upstream {
    Upstream::start(move |seen: http::Seen| {
        let open = open.clone();
        async move {
            let sse = [("content-type", "text/event-stream")];
            if seen.uri == "/ends" {
                let events =
                    "event: message\ndata: 1\n\n: keep-alive\n\ndata: 2\r\n\r\nid: 3\ndata: 3\n\n";
                return response(200, &sse, events);
            }
            let (tx, rx) = mpsc::channel(4);
            tx.send(Ok(Frame::data(Bytes::from_static(b"data: first\n\n"))))
                .await
                .unwrap();
            open.lock().unwrap().push(tx);
            let mut resp = ::http::Response::new(TestBody::new(ChannelBody(rx)));
            resp.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            resp
        }
    })
    .await
}

#[tokio::test]
async fn an_event_streams_end_is_logged_with_its_events_bytes_lifetime_and_reason() {
    let open = Arc::new(Mutex::new(Vec::new()));
    let up = streaming(open.clone()).await;
    let mut proxy = Running::start(&mut serving(&up.url(), &["--access-log"]));
    let (listen, _) = proxy.addresses();
    let url = |path: &str| format!("http://{listen}{path}");

    let said = [("accept", "text/event-stream"), ("x-request-id", "ends")];
    let got = request("GET", &url("/ends"), &said, "").await;
    assert_eq!(got.status, 200);
    let ended_len = got.body.len();

    // A stream the client leaves: read its first event, then close the connection.
    drop(open_stream(listen, "/open", "left").await);
    proxy.wait_for_line(r#""reason":"client_gone""#);

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    drop(open);
    up.stop().await;
    let all = stderr.join("\n");
    let lines = json_lines(&stderr);

    let ends = about(&lines, "ends");
    assert_eq!(
        ends.len(),
        2,
        "the request's line at its head, the stream's at its end:\n{all}"
    );
    assert_eq!(ends[0]["status"], 200);
    assert!(
        ends[0].get("bytes_out").is_none_or(Value::is_null),
        "{}",
        ends[0]
    );
    let end = ends[1];
    assert_eq!(end["message"], "event stream ended");
    assert_eq!(end["reason"], "upstream_ended");
    assert_eq!(end["events"], 3, "a comment is not an event: {end}");
    assert_eq!(end["bytes_out"], ended_len);
    assert!(end["duration_ms"].as_f64().is_some());

    let left = about(&lines, "left");
    assert_eq!(left.len(), 2, "{all}");
    assert_eq!(left[1]["reason"], "client_gone", "{}", left[1]);
    assert_eq!(left[1]["events"], 1);
    assert_eq!(left[1]["bytes_out"], "data: first\n\n".len());
}

/// Opens `path` as an event stream on `listen` with request id `id` and reads until its first
/// event: the stream is open, and holdfast has written its request's line.
async fn open_stream(listen: std::net::SocketAddr, path: &str, id: &str) -> tokio::net::TcpStream {
    let mut client = tokio::net::TcpStream::connect(listen).await.unwrap();
    let get = format!("GET {path} HTTP/1.1\r\nhost: {listen}\r\nx-request-id: {id}\r\n\r\n");
    client.write_all(get.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: first") {
        let mut buf = [0u8; 1024];
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    client
}

#[tokio::test]
async fn a_stream_ended_by_its_idle_timeout_or_by_holdfasts_shutdown_says_so() {
    let open = Arc::new(Mutex::new(Vec::new()));
    let up = streaming(open.clone()).await;
    // Real time: the idle timeout is the subject, and a fraction of a second of it.
    let mut proxy = Running::start(
        serving(&up.url(), &["--access-log"]).env("HOLDFAST_STREAMS__IDLE_TIMEOUT_SECS", "0.3"),
    );
    let (listen, _) = proxy.addresses();
    let _idle = open_stream(listen, "/open", "idle").await;
    let line = proxy.wait_for_line(r#""reason":"idle_timeout""#);
    assert!(line.contains(r#""request_id":"idle""#), "{line}");

    drop(proxy);

    // Open when holdfast is told to stop: a standalone stream ends as the drain begins.
    let mut proxy = Running::start(&mut serving(&up.url(), &["--access-log"]));
    let (listen, _) = proxy.addresses();
    let _kept = open_stream(listen, "/open", "kept").await;
    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    let lines = json_lines(&stderr);
    let kept = about(&lines, "kept");
    assert_eq!(kept.len(), 2, "{stderr:?}");
    assert_eq!(kept[1]["reason"], "shutdown", "{}", kept[1]);
    drop(open);
    up.stop().await;
}
