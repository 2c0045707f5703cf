//! Requests holdfast refuses with a 400, as nginx and HAProxy do (issue 11), with the exact
//! bytes the adversarial run sent: ambiguous body framing, a missing, doubled or malformed
//! Host, dot segments. None of them reaches the upstream.

use crate::support::http::{response, Upstream};
use crate::support::mcp::raw_http;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

async fn upstream() -> Upstream {
    Upstream::start(|_| async { response(200, &[("content-type", "application/json")], "{}") })
        .await
}

async fn status(hf: &Holdfast, request: &str) -> String {
    within(raw_http(hf.addr, request.as_bytes()))
        .await
        .expect("an answer")
        .status_line
}

#[tokio::test]
async fn ambiguous_requests_are_400_and_never_forwarded() {
    let up = upstream().await;
    let hf = Holdfast::start(&up.url()).await;
    let body = "5\r\nhello\r\n0\r\n\r\n";
    for request in [
        format!("POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n{body}"),
        format!("POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nTransfer-Encoding: chunked, chunked\r\n\r\n{body}"),
        "GET /mcp HTTP/1.1\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.1\r\nHost: mcp.example\r\nHost: mcp.example\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.1\r\nHost: mcp.example\r\nHost: other.example\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.1\r\nHost: evil example\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.1\r\nHost: evil.example/../x\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.1\r\nHost: user@evil.example\r\n\r\n".to_string(),
        "GET /mcp/../admin HTTP/1.1\r\nHost: mcp.example\r\n\r\n".to_string(),
        "GET /mcp/%2e%2e/admin HTTP/1.1\r\nHost: mcp.example\r\n\r\n".to_string(),
        // Issue 25 class 5: a tunnel, an authority-form target (both went upstream as `/`), and
        // an absolute-form target naming another host than Host.
        "CONNECT mcp.example:443 HTTP/1.1\r\nHost: mcp.example:443\r\n\r\n".to_string(),
        "GET mcp.example:443 HTTP/1.1\r\nHost: mcp.example:443\r\n\r\n".to_string(),
        "GET http://other.example/mcp HTTP/1.1\r\nHost: mcp.example\r\n\r\n".to_string(),
    ] {
        assert_eq!(
            status(&hf, &request).await,
            "HTTP/1.1 400 Bad Request",
            "{request:?}"
        );
    }
    assert!(
        up.seen().is_empty(),
        "nothing reached the upstream: {:?}",
        up.seen().len()
    );
    // The controls: the same requests, well formed, pass.
    for request in [
        format!("POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{body}"),
        "GET /mcp HTTP/1.1\r\nHost: mcp.example:8080\r\nConnection: close\r\n\r\n".to_string(),
        "GET /mcp HTTP/1.0\r\n\r\n".to_string(),
        "GET http://MCP.example/mcp HTTP/1.1\r\nHost: mcp.example\r\nConnection: close\r\n\r\n".to_string(),
    ] {
        let line = status(&hf, &request).await;
        assert!(line.ends_with(" 200 OK"), "{request:?}: {line}");
    }
    assert_eq!(up.seen().len(), 4);
    assert_eq!(up.seen()[3].uri, "/mcp");
}

#[tokio::test]
async fn a_dot_segment_cannot_leave_the_upstream_prefix() {
    let up = upstream().await;
    let mut raw = raw_config(&format!("{}/api", up.url()));
    raw.routes.endpoints = vec!["/".into()];
    let hf = Holdfast::start_with(raw).await;
    let escape = "GET /../admin HTTP/1.1\r\nHost: mcp.example\r\n\r\n";
    assert_eq!(status(&hf, escape).await, "HTTP/1.1 400 Bad Request");
    assert!(up.seen().is_empty());
    let fine = "GET /mcp HTTP/1.1\r\nHost: mcp.example\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&hf, fine).await, "HTTP/1.1 200 OK");
    assert_eq!(up.seen()[0].uri, "/api/mcp");
}

/// An upstream on a raw socket that answers every request with `answer`, bytes as given.
async fn raw_upstream(answer: &'static [u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    url
}

/// Content-Length and Transfer-Encoding both: the chunks win, and the client gets every byte
/// (RFC 9112 §6.3), whatever the stale length said.
#[tokio::test]
async fn transfer_encoding_wins_over_a_stale_content_length() {
    for length in ["3", "0", "100"] {
        let answer: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {length}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        let hf = Holdfast::start(&raw_upstream(answer).await).await;
        let got = crate::support::http::get(&hf.url("/mcp")).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.text(), "hello", "Content-Length: {length}");
    }
}

/// A 101 to a request that asked for no upgrade is the upstream's protocol error: a 502, never
/// a bare 101 handed to the client.
#[tokio::test]
async fn an_unsolicited_101_is_a_502() {
    let hf =
        Holdfast::start(&raw_upstream(b"HTTP/1.1 101 Switching Protocols\r\n\r\n").await).await;
    let got = crate::support::http::post_json(
        &hf.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("upstream_protocol"));
}

/// An upstream on a raw socket that answers its `n`th request (over all connections, from 0)
/// with `answers[n]` and keeps each connection open; it counts the connections it accepted.
async fn scripted_upstream(
    answers: &'static [&'static [u8]],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let accepted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                loop {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                    if head.ends_with(b"\r\n\r\n") {
                        head.clear();
                        let n = requests.fetch_add(1, Ordering::SeqCst);
                        let answer = answers[n.min(answers.len() - 1)];
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, connections)
}

/// Issue 25 class 6: a connection that answered 101, or answered HTTP/1.0 with
/// Transfer-Encoding (faulty framing, RFC 9112 §6.1), never carries another request.
#[tokio::test]
async fn a_connection_after_a_101_or_an_http_1_0_chunked_answer_is_not_used_again() {
    use std::sync::atomic::Ordering;
    for first in [
        &b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n"[..],
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ] {
        let answers: &'static [&'static [u8]] = Box::leak(Box::new([
            first,
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ]));
        let (url, connections) = scripted_upstream(answers).await;
        let hf = Holdfast::start(&url).await;
        let _ = crate::support::http::get(&hf.url("/mcp")).await;
        let second = crate::support::http::get(&hf.url("/mcp")).await;
        assert_eq!(second.status, 200);
        assert_eq!(
            connections.load(Ordering::SeqCst),
            2,
            "after {:?} the pooled connection was used again",
            String::from_utf8_lossy(first)
        );
    }
    // The control: an ordinary keep-alive answer's connection is used again.
    let (url, connections) =
        scripted_upstream(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]).await;
    let hf = Holdfast::start(&url).await;
    for _ in 0..2 {
        assert_eq!(crate::support::http::get(&hf.url("/mcp")).await.status, 200);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

/// Issue 25 class 6: a 204's Content-Length does not reach the client, and a transfer coding
/// that is not chunked (which could not be passed on) is a 502, not coded bytes nobody declared.
#[tokio::test]
async fn a_204_loses_its_length_and_a_bare_transfer_coding_is_a_502() {
    let hf = Holdfast::start(
        &raw_upstream(b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n").await,
    )
    .await;
    let request = "GET /mcp HTTP/1.1\r\nHost: mcp.example\r\nConnection: close\r\n\r\n";
    let got = within(raw_http(hf.addr, request.as_bytes())).await.unwrap();
    assert_eq!(got.status_line, "HTTP/1.1 204 No Content");
    assert_eq!(got.header("content-length"), None, "{:?}", got.headers);

    let hf = Holdfast::start(
        &raw_upstream(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n\x1f\x8b\x08\x00").await,
    )
    .await;
    let got = crate::support::http::get(&hf.url("/mcp")).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("holdfast-reason"), Some("upstream_protocol"));
}

/// Issue 43: `Transfer-Encoding: gzip, chunked` had its chunked coding undone and its gzip one
/// forgotten (the header is hop-by-hop), so the client got gzip bytes nothing declared. Any
/// transfer coding but one `chunked` is a 502, as `gzip` alone already was and as HAProxy
/// answers both.
#[tokio::test]
async fn a_transfer_coding_beside_chunked_is_a_502_not_undeclared_bytes() {
    // "ok" gzipped, in one chunk.
    for answer in [
        &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ] {
        let hf = Holdfast::start(&raw_upstream(answer).await).await;
        let got = crate::support::http::get(&hf.url("/mcp")).await;
        let what = String::from_utf8_lossy(answer);
        assert_eq!(got.status, 502, "{what:?}: {got:?}");
        assert_eq!(
            got.header("holdfast-reason"),
            Some("upstream_protocol"),
            "{what:?}"
        );
    }
    // The control: chunked alone, in any case, passes.
    let hf = Holdfast::start(
        &raw_upstream(b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            .await,
    )
    .await;
    let got = crate::support::http::get(&hf.url("/mcp")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "ok");
}
