//! The behaviour table, row by row, through a real holdfast in front of a scripted upstream: a
//! router's route-missing 404 is masked, the application's own 404 passes byte for byte, and
//! the horizon, learning and signatures decide which is which.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::http::TRAEFIK_404_HEADERS;
use crate::support::http::{self, post_json, response, traefik_404, Upstream};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::rows::{immediate, CALL};

/// Response headers as (name, value) pairs.
type Headers = Vec<(&'static str, &'static str)>;

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
