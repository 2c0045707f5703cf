//! Sending a request once more after an ambiguous failure, only when running it twice is safe
//! (issue 10, item 2): read-only JSON-RPC methods, tools the server announced as read-only or
//! idempotent, tools the configuration names; never other tools, never notifications, never a
//! second time.
//!
//! The upstream is a raw HTTP/1.1 server on a socket: it reads each request whole (so the
//! upstream's TCP acknowledged it and holdfast cannot prove it unread) and then either answers
//! or closes the connection without a byte of answer, as a backend killed mid-call does.

use std::sync::{Arc, Mutex};

use holdfast::config::RawConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::http::post_json;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// What the scripted server does with one request.
enum Act {
    /// Answers 200 with this JSON body.
    Answer(String),
    /// Closes the connection, having read the request and answered nothing.
    Die,
}

type Script = dyn Fn(&str) -> Act + Send + Sync;

/// A raw upstream: every request body it read, in order, and the script deciding each answer.
struct Scripted {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    async fn start(script: impl Fn(&str) -> Act + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    tokio::spawn(serve(stream, seen.clone(), script.clone()));
                }
            }
        });
        Scripted { url, seen, task }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests mentioned `needle` (a method or tool name).
    fn count(&self, needle: &str) -> usize {
        self.seen().iter().filter(|b| b.contains(needle)).count()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one connection: requests read whole (head, then `Content-Length` bytes), answered
/// or died on as the script says.
async fn serve(mut stream: TcpStream, seen: Arc<Mutex<Vec<String>>>, script: Arc<Script>) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
        buf.drain(..head_end + length);
        seen.lock().unwrap().push(body.clone());
        match script(&body) {
            Act::Die => return,
            Act::Answer(json) => {
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json}",
                    json.len()
                );
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A JSON-RPC result for request `id`.
fn result(id: u64, result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

fn request(id: u64, method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
}

fn tool_call(id: u64, tool: &str) -> String {
    request(
        id,
        "tools/call",
        &format!(r#"{{"name":"{tool}","arguments":{{}}}}"#),
    )
}

const TOOLS: &str = r#"{"tools":[
    {"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
    {"name":"put","inputSchema":{"type":"object"},"annotations":{"idempotentHint":true}},
    {"name":"charge","inputSchema":{"type":"object"},"annotations":{"destructiveHint":true}},
    {"name":"plain","inputSchema":{"type":"object"}}
]}"#;

/// Answers every request ([`TOOLS`] for a `tools/list`), except that it dies on the first `n`
/// requests whose body mentions `needle`, for each `(needle, n)`.
fn dies_on(deaths: &[(&'static str, usize)]) -> impl Fn(&str) -> Act + Send + Sync {
    let left = Mutex::new(deaths.to_vec());
    move |body| {
        for (needle, n) in left.lock().unwrap().iter_mut() {
            if body.contains(*needle) && *n > 0 {
                *n -= 1;
                return Act::Die;
            }
        }
        let request: serde_json::Value = serde_json::from_str(body).unwrap();
        let id = request["id"].as_u64().unwrap_or(0);
        if request["method"] == "tools/list" {
            Act::Answer(result(id, &TOOLS.replace('\n', "")))
        } else {
            Act::Answer(result(id, r#"{"content":[{"type":"text","text":"done"}]}"#))
        }
    }
}

async fn holdfast(upstream: &Scripted, edit: impl FnOnce(&mut RawConfig)) -> Holdfast {
    let mut raw = raw_config(&upstream.url);
    raw.routes.endpoints = vec!["/".into()];
    edit(&mut raw);
    Holdfast::start_with(raw).await
}

async fn retries(hf: &Holdfast, kind: &str) -> f64 {
    hf.metric(&format!("holdfast_safe_retries_total{{kind=\"{kind}\"}}"))
        .await
}

async fn resets(hf: &Holdfast) -> f64 {
    hf.metric("holdfast_upstream_failures_total{reason=\"upstream_reset\"}")
        .await
}

#[tokio::test]
async fn a_read_only_method_that_met_a_dying_backend_goes_once_more() {
    let upstream = Scripted::start(dies_on(&[("resources/read", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let read = request(1, "resources/read", r#"{"uri":"file:///a"}"#);
    let got = post_json(&hf.url("/mcp"), &read).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().contains("done"));
    assert_eq!(upstream.count("resources/read"), 2, "sent exactly twice");
    assert_eq!(retries(&hf, "read_only_method").await, 1.0);
    assert_eq!(resets(&hf).await, 0.0);
}

/// Broken twice (a server dying under the call, its listener still accepting): the second time
/// the call is held like one that never arrived, and goes once the server answers.
#[tokio::test]
async fn broken_twice_it_is_held_and_sent_once_the_server_is_back() {
    let upstream = Scripted::start(dies_on(&[("resources/read", 2)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let read = request(1, "resources/read", r#"{"uri":"file:///a"}"#);
    let got = post_json(&hf.url("/mcp"), &read).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(upstream.count("resources/read"), 3);
    assert_eq!(retries(&hf, "read_only_method").await, 2.0);
    assert_eq!(resets(&hf).await, 0.0, "no 502");
    let held = "holdfast_rewrites_total{reason=\"upstream_reset\",action=\"held\"}";
    assert_eq!(hf.metric(held).await, 1.0);
    assert_eq!(
        hf.metric("holdfast_outages_total").await,
        1.0,
        "an outage like any other"
    );
    assert_eq!(
        hf.metric("holdfast_upstream_up").await,
        1.0,
        "and it closed"
    );
}

/// A call that breaks the server every time (a crash it causes itself) gets its 502 at the
/// third break: sent at once after the first, from the hold after the second, never again.
#[tokio::test]
async fn a_call_that_breaks_the_server_every_time_gets_its_502_at_the_third_break() {
    let upstream = Scripted::start(dies_on(&[("ping", usize::MAX)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let got = post_json(&hf.url("/mcp"), &request(1, "ping", "{}")).await;
    assert_eq!(got.status, 502, "{}", got.text());
    assert_eq!(
        upstream.count("ping"),
        3,
        "the first attempt, once at once, once held"
    );
    assert_eq!(retries(&hf, "read_only_method").await, 2.0);
    assert_eq!(resets(&hf).await, 1.0);
}

/// With holding off there is no hold to wait in: once more at once, then the 502.
#[tokio::test]
async fn with_holding_off_a_safe_call_goes_once_more_at_most() {
    let upstream = Scripted::start(dies_on(&[("ping", usize::MAX)])).await;
    let hf = holdfast(&upstream, |raw| raw.hold.enabled = false).await;
    let got = post_json(&hf.url("/mcp"), &request(1, "ping", "{}")).await;
    assert_eq!(got.status, 502, "{}", got.text());
    assert_eq!(upstream.count("ping"), 2, "the first attempt and one more");
    assert_eq!(retries(&hf, "read_only_method").await, 1.0);
}

#[tokio::test]
async fn a_notification_is_never_sent_twice() {
    let upstream = Scripted::start(dies_on(&[("notifications/", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let got = post_json(&hf.url("/mcp"), note).await;
    assert_eq!(got.status, 502);
    assert_eq!(upstream.count("notifications/"), 1);
}

#[tokio::test]
async fn a_tool_without_a_safe_annotation_is_never_sent_twice() {
    let upstream = Scripted::start(dies_on(&[("charge", 1), ("plain", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    // The server announced `charge` as destructive and `plain` with no hints at all.
    let listed = post_json(&hf.url("/mcp"), &request(1, "tools/list", "{}")).await;
    assert_eq!(listed.status, 200);
    for (id, tool) in [(2, "charge"), (3, "plain")] {
        let got = post_json(&hf.url("/mcp"), &tool_call(id, tool)).await;
        assert_eq!(got.status, 502, "{tool}: {}", got.text());
        assert_eq!(upstream.count(tool), 1, "{tool} sent once only");
    }
    assert_eq!(resets(&hf).await, 2.0);
    for kind in ["read_only_method", "annotated_tool", "configured_tool"] {
        assert_eq!(retries(&hf, kind).await, 0.0, "{kind}");
    }
}

#[tokio::test]
async fn tools_announced_read_only_or_idempotent_go_once_more() {
    let upstream = Scripted::start(dies_on(&[("\"lookup\"", 1), ("\"put\"", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let listed = post_json(&hf.url("/mcp"), &request(1, "tools/list", "{}")).await;
    assert_eq!(listed.status, 200);
    assert!(listed.text().contains("lookup"), "{}", listed.text());
    for (id, tool) in [(2, "lookup"), (3, "put")] {
        let got = post_json(&hf.url("/mcp"), &tool_call(id, tool)).await;
        assert_eq!(got.status, 200, "{tool}: {}", got.text());
    }
    assert_eq!(upstream.count("\"lookup\""), 2);
    assert_eq!(upstream.count("\"put\""), 2);
    assert_eq!(retries(&hf, "annotated_tool").await, 2.0);
    assert_eq!(resets(&hf).await, 0.0);
}

#[tokio::test]
async fn an_unlearned_tool_is_not_sent_twice() {
    let upstream = Scripted::start(dies_on(&[("lookup", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    // No tools/list has passed: nothing is known about `lookup`, so its failure is a 502.
    let got = post_json(&hf.url("/mcp"), &tool_call(1, "lookup")).await;
    assert_eq!(got.status, 502);
    assert_eq!(upstream.count("lookup"), 1);
    assert_eq!(retries(&hf, "annotated_tool").await, 0.0);
}

#[tokio::test]
async fn the_2026_headers_name_the_call() {
    let upstream = Scripted::start(dies_on(&[("\"put\"", 1)])).await;
    let hf = holdfast(&upstream, |_| {}).await;
    let listed = post_json(&hf.url("/mcp"), &request(1, "tools/list", "{}")).await;
    assert_eq!(listed.status, 200);
    let got = crate::support::http::call(
        http::Request::post(hf.url("/mcp"))
            .header("host", crate::support::http::host_of(&hf.url("/mcp")))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "put")
            .body(http_body_util::Full::new(bytes::Bytes::from(tool_call(
                2, "put",
            ))))
            .unwrap(),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(upstream.count("\"put\""), 2);
    assert_eq!(retries(&hf, "annotated_tool").await, 1.0);
}

#[tokio::test]
async fn configuration_adds_a_tool_and_vetoes_another() {
    let upstream = Scripted::start(dies_on(&[("\"plain\"", 1), ("\"lookup\"", 1)])).await;
    let hf = holdfast(&upstream, |raw| {
        raw.retry.idempotent_tools = vec!["plain".into()];
        raw.retry.never_tools = vec!["lookup".into()];
    })
    .await;
    let listed = post_json(&hf.url("/mcp"), &request(1, "tools/list", "{}")).await;
    assert_eq!(listed.status, 200);
    let plain = post_json(&hf.url("/mcp"), &tool_call(2, "plain")).await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(retries(&hf, "configured_tool").await, 1.0);
    // Announced read-only, but the configuration says never.
    let lookup = post_json(&hf.url("/mcp"), &tool_call(3, "lookup")).await;
    assert_eq!(lookup.status, 502);
    assert_eq!(upstream.count("\"lookup\""), 1);
}

#[tokio::test]
async fn retry_off_sends_nothing_twice() {
    let upstream = Scripted::start(dies_on(&[("ping", 1)])).await;
    let hf = holdfast(&upstream, |raw| raw.retry.enabled = false).await;
    let got = post_json(&hf.url("/mcp"), &request(1, "ping", "{}")).await;
    assert_eq!(got.status, 502);
    assert_eq!(upstream.count("ping"), 1);
}

/// A `tools/list` answered on an event stream that stays open after its answer (a server may
/// keep the POST's stream for notifications): holdfast learns the annotations from the answer's
/// event, before it reaches the client, so a call the client makes at once is known safe. (It
/// was learned only when the stream ended: never, here.)
#[tokio::test]
async fn tools_are_learned_from_an_event_stream_that_stays_open() {
    use http_body::Frame;
    use tokio::sync::mpsc;

    use crate::support::http::{ChannelBody, Seen, TestBody};

    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Senders kept alive so the tools/list stream never ends.
    let open: Arc<Mutex<Vec<mpsc::Sender<_>>>> = Arc::default();
    let upstream = {
        let (calls, open) = (calls.clone(), open.clone());
        crate::support::http::Upstream::start(move |seen: Seen| {
            let (calls, open) = (calls.clone(), open.clone());
            async move {
                let body = String::from_utf8_lossy(&seen.body).to_string();
                let request: serde_json::Value = serde_json::from_str(&body).unwrap();
                let id = request["id"].as_u64().unwrap();
                let (tx, rx) = mpsc::channel(4);
                let mut resp = http::Response::new(TestBody::new(ChannelBody(rx)));
                resp.headers_mut()
                    .insert("content-type", "text/event-stream".parse().unwrap());
                if request["method"] == "tools/list" {
                    let event = format!(
                        "event: message\ndata: {}\n\n",
                        result(id, &TOOLS.replace('\n', ""))
                    );
                    tx.send(Ok(Frame::data(event.into()))).await.unwrap();
                    open.lock().unwrap().push(tx);
                } else if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    // The first call: the stream breaks before its first event.
                    tx.send(Err("the server died".into())).await.unwrap();
                } else {
                    let event = format!("data: {}\n\n", result(id, r#"{"content":[]}"#));
                    tx.send(Ok(Frame::data(event.into()))).await.unwrap();
                }
                resp
            }
        })
        .await
    };
    let mut raw = raw_config(&upstream.url());
    raw.routes.endpoints = vec!["/".into()];
    let hf = Holdfast::start_with(raw).await;

    // The client reads the answer's event; the stream stays open.
    let list = request(1, "tools/list", "{}");
    let resp = crate::support::http::send(
        http::Request::post(hf.url("/mcp"))
            .header("host", crate::support::http::host_of(&hf.url("/mcp")))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(http_body_util::Full::new(bytes::Bytes::from(list)))
            .unwrap(),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = within(http_body_util::BodyExt::frame(&mut body)).await;
    let first = first
        .expect("a frame")
        .expect("not an error")
        .into_data()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("lookup"),
        "the answer's event arrives: {first:?}"
    );

    // At once, a call of a tool the answer announced read-only: it breaks, and goes once more.
    let got = post_json(&hf.url("/mcp"), &tool_call(2, "lookup")).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(retries(&hf, "annotated_tool").await, 1.0);
    drop(body);
}
