//! The behaviour table, row by row, through a real holdfast in front of a scripted upstream.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::http::{self, post_json, response, traefik_404, Reserved, Upstream};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

use crate::support::http::TRAEFIK_404_HEADERS;
/// Response headers as (name, value) pairs.
type Headers = Vec<(&'static str, &'static str)>;

const CALL: &str = r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"count"}}"#;

/// A configuration with holding off: these rows pin what is answered *at once* (the hold tests
/// cover what happens instead while holding is on).
fn immediate(upstream: &str) -> holdfast::config::RawConfig {
    let mut raw = raw_config(upstream);
    raw.hold.enabled = false;
    raw
}

#[tokio::test]
async fn refused_is_503_with_retry_after_and_jsonrpc_id() {
    let port = Reserved::new();
    let hf = Holdfast::start_with(immediate(&port.url())).await;
    let got = post_json(&hf.url("/mcp"), CALL).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("retry-after"), Some("2"));
    assert_eq!(got.header("cache-control"), Some("no-store"));
    assert_eq!(got.header("holdfast-reason"), Some("connect_refused"));
    assert_eq!(got.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v["id"], 42);
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["error"]["code"], -32000);
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}")
            .await,
        1.0
    );
    assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
    assert_eq!(
        hf.metric("holdfast_requests_total{method=\"POST\",status=\"503\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn retry_after_is_configurable_and_get_gets_text() {
    let port = Reserved::new();
    let mut raw = immediate(&port.url());
    raw.retry_after_secs = 7;
    let hf = Holdfast::start_with(raw).await;
    let got = http::get(&hf.url("/mcp")).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("retry-after"), Some("7"));
    assert_eq!(
        got.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(got.text().contains("connect_refused"), "{}", got.text());
}

#[tokio::test]
async fn unresolvable_upstream_is_503_dns() {
    // `.invalid` never resolves (RFC 6761). The resolver's answer may be slow on some machines:
    // the connect timeout (which covers resolving) is raised so that it still ends in `dns`.
    let mut raw = immediate("http://holdfast-upstream.invalid:8000");
    raw.client.connect_timeout_secs = 25.0;
    let hf = Holdfast::start_with(raw).await;
    let got = within(http::get(&hf.url("/mcp"))).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("dns"));
}

/// Row 1's other connect failures, each named. What the kernel answers on any Linux host: a
/// listener whose accept queue is full drops further SYNs (the connect hangs: a timeout); a TCP
/// connect to a multicast address is refused with ENETUNREACH before a packet leaves; a
/// link-local IPv6 address without a scope is EINVAL (another connect error; without IPv6 the
/// socket itself fails, a connect error too).
#[tokio::test]
async fn every_connect_failure_is_503_with_its_reason() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.local_addr().unwrap();
    // Backlog 0: one connection fills the queue, and nothing ever accepts it.
    let _listener = socket.listen(0).unwrap();
    let _filler = tokio::net::TcpStream::connect(full).await.unwrap();

    for (upstream, reason) in [
        (format!("http://{full}"), "connect_timeout"),
        ("http://224.0.0.1:8000".to_string(), "unreachable"),
        ("http://[fe80::1]:8000".to_string(), "connect_error"),
    ] {
        let mut raw = immediate(&upstream);
        raw.client.connect_timeout_secs = 0.3;
        let hf = Holdfast::start_with(raw).await;
        let got = within(post_json(&hf.url("/mcp"), CALL)).await;
        assert_eq!(got.status, 503, "{upstream}");
        assert_eq!(got.header("holdfast-reason"), Some(reason), "{upstream}");
        assert!(got.header("retry-after").is_some(), "{upstream}");
        let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(v["id"], 42, "{upstream}");
        assert_eq!(
            hf.metric(&format!(
                "holdfast_rewrites_total{{reason=\"{reason}\",action=\"answered_503\"}}"
            ))
            .await,
            1.0,
            "{upstream}"
        );
    }
}

#[tokio::test]
async fn traefik_404_is_rewritten_with_the_callers_id() {
    let up = Upstream::route_missing().await;
    let hf = Holdfast::start_with(immediate(&up.url())).await;
    let got = post_json(&hf.url("/mcp"), CALL).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("route_missing_404"));
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(
        v["id"], 42,
        "the request body reached the router and was still echoed"
    );
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}")
            .await,
        1.0
    );
    // The request did reach the router: it is the router's answer that was replaced.
    assert_eq!(up.seen().len(), 1);
    assert_eq!(up.seen()[0].body, CALL.as_bytes());
}

#[tokio::test]
async fn route_missing_on_a_path_the_app_does_not_serve_is_a_real_404() {
    let up = Upstream::route_missing().await;
    let hf = Holdfast::start(&up.url()).await;
    let got = http::get(&hf.url("/.well-known/oauth-protected-resource")).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.body, "404 page not found\n");
    assert_eq!(got.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        hf.metric("holdfast_router_passthrough_total{reason=\"route_not_expected\"}")
            .await,
        1.0
    );
    assert_eq!(
        hf.metric("holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_path_the_app_answered_is_learned_and_then_masked() {
    // The app serves its OAuth metadata; then the container goes and the router says 404.
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = gone.clone();
    let up = Upstream::start(move |_| {
        let gone = g.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            if gone {
                traefik_404()
            } else {
                response(200, &[("content-type", "application/json")], "{}")
            }
        }
    })
    .await;
    let hf = Holdfast::start_with(immediate(&up.url())).await;
    let path = "/.well-known/oauth-protected-resource";
    assert_eq!(http::get(&hf.url(path)).await.status, 200);
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    let got = http::get(&hf.url(path)).await;
    assert_eq!(
        got.status, 503,
        "a learned path is expected: its router 404 means missing"
    );
    // A path never answered stays a real 404.
    assert_eq!(http::get(&hf.url("/.well-known/other")).await.status, 404);
}

#[tokio::test]
async fn learning_can_be_turned_off() {
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = gone.clone();
    let up = Upstream::start(move |_| {
        let gone = g.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            if gone {
                traefik_404()
            } else {
                response(200, &[], "ok")
            }
        }
    })
    .await;
    let mut raw = raw_config(&up.url());
    raw.routes.learn = false;
    let hf = Holdfast::start_with(raw).await;
    assert_eq!(http::get(&hf.url("/health")).await.status, 200);
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(http::get(&hf.url("/health")).await.status, 404);
}

#[tokio::test]
async fn servers_own_404s_pass_byte_identical() {
    let bodies: Vec<(Headers, &'static str)> = vec![
        // TypeScript SDK
        (
            vec![("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}"#,
        ),
        // 2026-07-28 method not found
        (
            vec![("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","id":42,"error":{"code":-32601,"message":"Method not found"}}"#,
        ),
        // rmcp: no content-type
        (vec![], "Not Found: Session not found"),
        // Python SDK legacy SSE transport
        (
            vec![("content-type", "text/plain; charset=utf-8")],
            "Could not find session",
        ),
    ];
    for (headers, body) in bodies {
        let h = headers.clone();
        let up = Upstream::start(move |_| {
            let h = h.clone();
            async move { response(404, &h, body) }
        })
        .await;
        let hf = Holdfast::start(&up.url()).await;
        let got = post_json(&hf.url("/mcp"), CALL).await;
        assert_eq!(got.status, 404, "{body}");
        assert_eq!(got.body, body.as_bytes());
        for (k, v) in &headers {
            assert_eq!(got.header(k), Some(*v));
        }
        if headers.is_empty() {
            assert_eq!(
                got.header("content-type"),
                None,
                "no Content-Type is invented"
            );
        }
        assert_eq!(hf.metric("holdfast_passthrough_404_total").await, 1.0);
        assert_eq!(
            hf.metric(
                "holdfast_rewrites_total{reason=\"route_missing_404\",action=\"answered_503\"}"
            )
            .await,
            0.0
        );
    }
}

#[tokio::test]
async fn other_statuses_pass_untouched() {
    // (status, headers, body)
    type Case = (u16, &'static [(&'static str, &'static str)], &'static str);
    let cases: &[Case] = &[
        (405, &[("allow", "POST")], "Method Not Allowed"),
        (410, &[], "gone"),
        (
            401,
            &[("www-authenticate", "Bearer resource_metadata=\"x\"")],
            "unauthorized",
        ),
        (400, &[], "Bad Request: Session ID is required"),
        (406, &[], "Not Acceptable"),
        (409, &[], "conflict"),
        (500, &[("content-type", "text/plain")], "app exploded"),
        // An application 503 with its own Retry-After is the application's.
        (503, &[("retry-after", "30")], "busy"),
    ];
    for (status, headers, body) in cases {
        let (status, headers, body) = (*status, *headers, *body);
        let up = Upstream::start(move |_| async move { response(status, headers, body) }).await;
        let hf = Holdfast::start(&up.url()).await;
        let got = post_json(&hf.url("/mcp"), CALL).await;
        assert_eq!(got.status, status);
        assert_eq!(got.body, body.as_bytes());
        for (k, v) in headers {
            assert_eq!(got.header(k), Some(*v), "{status} {k}");
        }
        assert_eq!(got.header("holdfast-reason"), None);
    }
}

#[tokio::test]
async fn router_unavailable_5xx_becomes_503_with_retry_after() {
    for (status, body) in [
        (503u16, "no available server\n"),
        (502, "Bad Gateway"),
        (504, "Gateway Timeout"),
    ] {
        let up = Upstream::start(move |_| async move { response(status, &[], body) }).await;
        let hf = Holdfast::start_with(immediate(&up.url())).await;
        let got = post_json(&hf.url("/mcp"), CALL).await;
        assert_eq!(got.status, 503, "{status}");
        assert_eq!(got.header("retry-after"), Some("2"));
        assert_eq!(got.header("holdfast-reason"), Some("router_unavailable"));
        assert_eq!(
            hf.metric(
                "holdfast_rewrites_total{reason=\"router_unavailable\",action=\"answered_503\"}"
            )
            .await,
            1.0
        );
    }
}

/// A large 404 that starts like Traefik's is streamed, not collected: the client has its head and
/// first bytes while the upstream still holds back the rest (a proxy that read it into memory
/// first would answer nothing yet), and then gets every byte.
#[tokio::test]
async fn a_large_404_is_not_read_into_memory_and_passes_intact() {
    use http_body::Frame;
    use http_body_util::BodyExt;
    let (feed, frames) = tokio::sync::mpsc::channel(4);
    let frames = std::sync::Mutex::new(Some(frames));
    let up = Upstream::start(move |_| {
        let frames = frames.lock().unwrap().take().expect("one request");
        async move {
            let mut resp = ::http::Response::new(http::TestBody::new(http::ChannelBody(frames)));
            *resp.status_mut() = ::http::StatusCode::NOT_FOUND;
            for (name, value) in TRAEFIK_404_HEADERS {
                resp.headers_mut().insert(*name, value.parse().unwrap());
            }
            resp
        }
    })
    .await;
    let hf = Holdfast::start(&up.url()).await;
    let mut first = b"404 page not found\n".to_vec();
    first.extend(std::iter::repeat_n(b'x', 10_000));
    feed.send(Ok(Frame::data(Bytes::from(first.clone()))))
        .await
        .unwrap();
    let resp = crate::support::within(http::send(
        ::http::Request::get(hf.url("/mcp"))
            .header("host", http::host_of(&hf.url("/mcp")))
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap(),
    ))
    .await;
    assert_eq!(resp.status(), 404, "the head came before the body ended");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while got.len() < first.len() {
        let frame = crate::support::within(body.frame()).await.unwrap().unwrap();
        got.extend_from_slice(&frame.into_data().unwrap());
    }
    assert_eq!(
        got, first,
        "the first bytes, while the rest is still held back"
    );
    let rest = vec![b'y'; 90_000];
    feed.send(Ok(Frame::data(Bytes::from(rest.clone()))))
        .await
        .unwrap();
    drop(feed);
    let tail = crate::support::within(body.collect())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(tail, rest);
}

#[tokio::test]
async fn a_404_slightly_over_the_peek_limit_without_length_passes_intact() {
    // Chunked (no Content-Length), so holdfast must stop reading at the limit and forward what
    // it read plus the rest.
    let mut raw = raw_config("");
    raw.routes.max_peek_bytes = 64;
    let body: String = "y".repeat(200);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let b = body.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        let head = "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        for chunk in b.as_bytes().chunks(50) {
            s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await
                .unwrap();
            s.write_all(chunk).await.unwrap();
            s.write_all(b"\r\n").await.unwrap();
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
        let _ = s.read(&mut buf).await;
    });
    raw.upstream = format!("http://{addr}");
    let hf = Holdfast::start_with(raw).await;
    let got = http::get(&hf.url("/mcp")).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.text(), body);
}

/// An upstream that reads the request head and then resets (or closes) without answering.
async fn reset_after_read(
    abortive: bool,
) -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            // Read until the end of the head, proving the request reached the "application".
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            tx.send(()).await.unwrap();
            if abortive {
                // SO_LINGER 0: close sends RST. (Deprecated because a non-zero linger blocks on
                // drop; zero does not.)
                #[allow(deprecated)]
                s.set_linger(Some(Duration::ZERO)).unwrap();
            }
            drop(s);
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn reset_after_send_is_502_and_never_503() {
    for abortive in [true, false] {
        let (addr, mut reached) = reset_after_read(abortive).await;
        let hf = Holdfast::start(&format!("http://{addr}")).await;
        let got = post_json(&hf.url("/mcp"), CALL).await;
        assert_eq!(got.status, 502, "abortive={abortive}");
        assert_eq!(got.header("holdfast-reason"), Some("upstream_reset"));
        assert_eq!(
            got.header("retry-after"),
            None,
            "a 502 does not invite a retry"
        );
        reached.recv().await.unwrap();
        assert!(reached.try_recv().is_err(), "sent exactly once");
        assert_eq!(
            hf.metric("holdfast_upstream_failures_total{reason=\"upstream_reset\"}")
                .await,
            1.0
        );
        assert_eq!(
            hf.metric(
                "holdfast_rewrites_total{reason=\"connect_refused\",action=\"answered_503\"}"
            )
            .await,
            0.0
        );
    }
}

/// Row 5: an upstream that is not an HTTP server (an SSH daemon on the port, say) answers
/// bytes hyper cannot parse: 502 `upstream_protocol`, whether it speaks first (as SSH does) or
/// only after reading the request.
#[tokio::test]
async fn a_non_http_answer_is_502_upstream_protocol() {
    for speaks_first in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let banner = b"SSH-2.0-OpenSSH_9.6\r\n";
                    if speaks_first {
                        let _ = s.write_all(banner).await;
                    }
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    if !speaks_first {
                        let _ = s.write_all(banner).await;
                    }
                    // An SSH server then waits for the client's banner.
                    let _ = s.read(&mut buf).await;
                });
            }
        });
        let hf = Holdfast::start(&format!("http://{addr}")).await;
        let got = within(post_json(&hf.url("/mcp"), CALL)).await;
        assert_eq!(got.status, 502, "speaks first: {speaks_first}");
        assert_eq!(
            got.header("holdfast-reason"),
            Some("upstream_protocol"),
            "speaks first: {speaks_first}"
        );
        assert_eq!(
            hf.metric("holdfast_upstream_failures_total{reason=\"upstream_protocol\"}")
                .await,
            1.0
        );
    }
}

#[tokio::test]
async fn no_response_head_in_time_is_502() {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let up = Upstream::start(move |_| {
        let tx = tx.clone();
        async move {
            tx.send(()).await.unwrap();
            // Never answers: the test ends first.
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut raw = raw_config(&up.url());
    raw.client.response_timeout_secs = 0.3;
    let hf = Holdfast::start_with(raw).await;
    let got = post_json(&hf.url("/mcp"), CALL).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("response_timeout"));
    rx.recv().await.unwrap();
}

#[tokio::test]
async fn horizon_unmasks_a_persistent_route_missing_404() {
    let up = Upstream::route_missing().await;
    let mut raw = immediate(&up.url());
    raw.routes.horizon_secs = 0.3;
    let hf = Holdfast::start_with(raw).await;
    // The horizon counts from the outage's first route-missing answer: this one is within it.
    let first = http::get(&hf.url("/mcp")).await;
    assert_eq!(first.status, 503);
    // The horizon is a time bound, so time has to pass; nothing else is being waited for.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let got = http::get(&hf.url("/mcp")).await;
    assert_eq!(
        got.status, 404,
        "past the horizon the router's 404 surfaces"
    );
    assert_eq!(got.body, "404 page not found\n");
    assert_eq!(
        hf.metric("holdfast_router_passthrough_total{reason=\"horizon_exceeded\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn user_signature_matches_a_custom_router() {
    let up = Upstream::start(|_| async {
        response(
            404,
            &[("x-edge", "gw-3"), ("content-type", "text/html")],
            "<h1>no such app</h1>",
        )
    })
    .await;
    let mut raw = raw_config(&up.url());
    let without = Holdfast::start_with(raw.clone()).await;
    assert_eq!(http::get(&without.url("/mcp")).await.status, 404);
    raw.routes.signatures.push(holdfast::config::RawSignature {
        name: "edge".into(),
        status: 404,
        body_contains: Some("no such app".into()),
        headers: vec![holdfast::config::RawHeaderMatch {
            name: "X-Edge".into(),
            value: None,
        }],
        ..Default::default()
    });
    raw.hold.enabled = false;
    let with = Holdfast::start_with(raw).await;
    let got = http::get(&with.url("/mcp")).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("route_missing_404"));
}

#[tokio::test]
async fn outage_ends_when_the_application_answers() {
    // The port stays ours while nothing listens on it: no other test can take it meanwhile.
    let port = http::Reserved::new();
    let hf = Holdfast::start_with(immediate(&port.url())).await;
    assert_eq!(http::get(&hf.url("/mcp")).await.status, 503);
    assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
    // The backend comes back on the same port.
    let up = Upstream::serve(port.listen(), |_| async { response(200, &[], "back") });
    let got = http::get(&hf.url("/mcp")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "back");
    assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
    up.stop().await;
}

#[tokio::test]
async fn a_request_target_that_cannot_be_forwarded_is_400() {
    let up = Upstream::start(|_| async { response(200, &[], "x") }).await;
    let hf = Holdfast::start(&up.url()).await;
    // `OPTIONS *` names no resource on the upstream: holdfast cannot map it to a path.
    let mut s = tokio::net::TcpStream::connect(hf.addr).await.unwrap();
    s.write_all(b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(up.seen().is_empty());
}

/// A HEAD's answer has no body, so a router's route-missing 404 to it cannot be told from the
/// application's: it passes, but it does not end the outage (issue 10).
#[tokio::test]
async fn a_head_answered_404_does_not_end_an_outage() {
    let up = Upstream::route_missing().await;
    let hf = Holdfast::start_with(immediate(&up.url())).await;
    assert_eq!(post_json(&hf.url("/mcp"), CALL).await.status, 503);
    assert_eq!(hf.metric("holdfast_upstream_up").await, 0.0);
    let head = http::call(
        ::http::Request::head(hf.url("/mcp"))
            .header("host", http::host_of(&hf.url("/mcp")))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(head.status, 404, "passed as it came");
    assert_eq!(
        hf.metric("holdfast_upstream_up").await,
        0.0,
        "the router is still answering for a missing backend"
    );
    assert_eq!(post_json(&hf.url("/mcp"), CALL).await.status, 503);
}

/// A Go MCP server's own 404 for an unknown path is `http.NotFound`, byte for byte Traefik's
/// route-missing answer. With no router in between (`routes.behind_router = false`, a sidecar),
/// it is the server's own answer and passes, and nothing counts as an outage (issue 10).
#[tokio::test]
async fn with_no_router_in_between_a_traefik_lookalike_404_is_the_servers_own() {
    let up = Upstream::route_missing().await;
    let mut raw = raw_config(&up.url());
    raw.routes.behind_router = Some(false);
    let hf = Holdfast::start_with(raw).await;
    let got = post_json(&hf.url("/mcp"), CALL).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.body, "404 page not found\n");
    assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
    assert_eq!(hf.metric("holdfast_outages_total").await, 0.0);
    assert_eq!(hf.metric("holdfast_passthrough_404_total").await, 1.0);
    // The control: behind a router (the default), the same answer is masked.
    let behind = Holdfast::start_with(immediate(&up.url())).await;
    assert_eq!(post_json(&behind.url("/mcp"), CALL).await.status, 503);
}

/// The horizon only un-masks route-missing 404s: once the router itself is gone (its port
/// refuses), the answer is the 503 of a missing backend again, past the horizon or not.
#[tokio::test]
async fn a_refused_connection_stays_503_past_the_horizon() {
    // (tokio's listener has SO_REUSEADDR, so its port can be taken again once it closed.)
    let router = Upstream::route_missing().await;
    let mut raw = immediate(&router.url());
    raw.routes.horizon_secs = 0.3;
    let hf = Holdfast::start_with(raw).await;
    assert_eq!(within(post_json(&hf.url("/mcp"), CALL)).await.status, 503);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let past = within(post_json(&hf.url("/mcp"), CALL)).await;
    assert_eq!(
        past.status, 404,
        "past the horizon the router's 404 surfaces"
    );

    let addr = router.addr;
    router.stop().await;
    let _refusing = Reserved::again(addr);
    let got = within(post_json(&hf.url("/mcp"), CALL)).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.header("holdfast-reason"), Some("connect_refused"));
    assert!(got.header("retry-after").is_some());
}
