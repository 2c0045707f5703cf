//! What crosses the proxy unchanged and what is rewritten: paths, Host, hop-by-hop headers,
//! X-Forwarded-*, MCP headers, bodies, HTTP versions.

use bytes::Bytes;
use http_body_util::Full;

use crate::support::http::{self, echo, response, Upstream};
use crate::support::proxy::{raw_config, Holdfast};

#[tokio::test]
async fn path_query_and_prefix_are_preserved() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&format!("{}/api/", up.url())).await;
    let got = http::get(&hf.url("/mcp?x=1&y=%20")).await;
    assert_eq!(got.status, 200);
    assert_eq!(up.seen()[0].method, ::http::Method::GET);
    assert_eq!(up.seen()[0].uri, "/api/mcp?x=1&y=%20");
    let hf2 = Holdfast::start(&up.url()).await;
    assert_eq!(http::get(&hf2.url("/mcp/sub")).await.status, 200);
    assert_eq!(up.seen()[1].uri, "/mcp/sub");
}

#[tokio::test]
async fn headers_cross_as_a_proxy_should() {
    let up = Upstream::start(|_| async {
        response(
            200,
            &[
                ("mcp-session-id", "s-1"),
                ("www-authenticate", "Bearer realm=\"x\""),
                ("retry-after", "9"),
                ("connection", "x-internal"),
                ("x-internal", "secret"),
                ("keep-alive", "timeout=5"),
                ("proxy-authenticate", "Basic realm=\"proxy\""),
            ],
            "ok",
        )
    })
    .await;
    // The test client stands for a proxy in front (nginx, a TLS terminator): trusted.
    let mut raw = raw_config(&up.url());
    raw.forwarded.trusted_proxies = vec!["127.0.0.0/8".into()];
    let hf = Holdfast::start_with(raw).await;
    let req = ::http::Request::post(hf.url("/mcp"))
        .header("host", "mcp.example.com")
        .header("mcp-session-id", "abc")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "count")
        .header("last-event-id", "7")
        .header("authorization", "Bearer t0ken")
        .header("x-forwarded-for", "203.0.113.9")
        // What a proxy in front (nginx, a TLS terminator) says: holdfast appends its own.
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "public.example")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "drop me")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic eA==")
        .header("upgrade", "websocket")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let got = http::call(req).await;
    assert_eq!(got.status, 200);
    let h = &up.seen()[0].headers;
    for (k, v) in [
        ("host", "mcp.example.com"),
        ("mcp-session-id", "abc"),
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "count"),
        ("last-event-id", "7"),
        ("authorization", "Bearer t0ken"),
        ("x-forwarded-for", "203.0.113.9, 127.0.0.1"),
        ("x-forwarded-proto", "https, http"),
        ("x-forwarded-host", "public.example, mcp.example.com"),
    ] {
        assert_eq!(h.get(k).map(|v| v.to_str().unwrap()), Some(v), "{k}");
    }
    for k in ["x-hop", "te", "proxy-authorization", "upgrade"] {
        assert!(h.get(k).is_none(), "{k} must not reach the upstream");
    }
    // Response side.
    assert_eq!(got.header("mcp-session-id"), Some("s-1"));
    assert_eq!(got.header("www-authenticate"), Some("Bearer realm=\"x\""));
    assert_eq!(got.header("retry-after"), Some("9"));
    assert_eq!(got.header("x-internal"), None);
    assert_eq!(got.header("keep-alive"), None);
    assert_eq!(got.header("proxy-authenticate"), None);
}

#[tokio::test]
async fn x_forwarded_headers_are_set_when_the_client_sent_none() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&up.url()).await;
    let req = ::http::Request::get(hf.url("/mcp"))
        .header("host", "mcp.example.com")
        .body(Full::default())
        .unwrap();
    assert_eq!(http::call(req).await.status, 200);
    let seen = &up.seen()[0];
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(seen.header("x-forwarded-host"), Some("mcp.example.com"));
}

/// Issue 30: a client that reaches holdfast directly (not a trusted proxy) cannot claim another
/// address, Host or scheme: what it says in `X-Forwarded-*` and `Forwarded` is replaced by
/// holdfast's own. Before, holdfast appended to it, and the first entry, the one MCP servers read,
/// was the client's claim.
#[tokio::test]
async fn an_untrusted_peers_forwarded_headers_are_replaced() {
    let up = Upstream::start(echo).await;
    for trusted in [vec![], vec!["10.0.0.0/8".to_string(), "::1".to_string()]] {
        let mut raw = raw_config(&up.url());
        raw.forwarded.trusted_proxies = trusted;
        let hf = Holdfast::start_with(raw).await;
        let req = ::http::Request::get(hf.url("/mcp"))
            .header("host", "mcp.example.com")
            .header("x-forwarded-for", "203.0.113.9")
            .header("x-forwarded-for", "198.51.100.1")
            .header("x-forwarded-proto", "https")
            .header("x-forwarded-host", "admin.internal")
            .header("forwarded", "for=203.0.113.9;proto=https")
            .body(Full::default())
            .unwrap();
        assert_eq!(http::call(req).await.status, 200);
    }
    for seen in up.seen() {
        assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
        assert_eq!(seen.header("x-forwarded-host"), Some("mcp.example.com"));
        assert_eq!(seen.header("forwarded"), None);
    }
    assert_eq!(up.seen().len(), 2);
}

#[tokio::test]
async fn host_can_be_the_upstreams() {
    let up = Upstream::start(echo).await;
    let mut raw = raw_config(&up.url());
    raw.client.host_header = "upstream".into();
    let hf = Holdfast::start_with(raw).await;
    let req = ::http::Request::get(hf.url("/mcp"))
        .header("host", "mcp.example.com")
        .body(Full::default())
        .unwrap();
    assert_eq!(http::call(req).await.status, 200);
    let h = &up.seen()[0].headers;
    assert_eq!(h["host"], up.addr.to_string());
    assert_eq!(h["x-forwarded-host"], "mcp.example.com");
}

#[tokio::test]
async fn bodies_stream_both_ways_intact() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&up.url()).await;
    // Larger than the request copy cap, so the copy is dropped while the body still flows.
    let big: String = "z".repeat(300_000);
    let got = http::post_json(&hf.url("/mcp"), &big).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body.len(), big.len());
    assert_eq!(up.seen()[0].body.len(), big.len());
}

#[tokio::test]
async fn h2c_clients_are_served_over_http1_upstream() {
    let up = Upstream::start(echo).await;
    let hf = Holdfast::start(&up.url()).await;
    let req = ::http::Request::post(hf.url("/mcp"))
        .version(::http::Version::HTTP_2)
        .header("mcp-session-id", "h2")
        .body(Full::new(Bytes::from_static(b"{\"a\":1}")))
        .unwrap();
    let resp = http::send_h2(req).await;
    assert_eq!(resp.version(), ::http::Version::HTTP_2);
    let got = http::collect(resp).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "{\"a\":1}");
    let seen = &up.seen()[0];
    assert_eq!(seen.version, ::http::Version::HTTP_11);
    assert_eq!(seen.headers["mcp-session-id"], "h2");
    // The h2 :authority became the Host the upstream sees.
    assert_eq!(seen.headers["host"], hf.addr.to_string());
}

// Reusing pooled upstream connections: upstream_pool.rs.

/// A raw upstream: reads one request head and its `Content-Length` body, writes `answer`, and
/// closes when `close` (else keeps the connection until the peer goes).
async fn raw_upstream(answer: &'static [u8], close: bool) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then as many body bytes as it declares.
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = stream.write_all(answer).await;
                if !close {
                    let _ = stream.read(&mut chunk).await;
                }
            });
        }
    });
    addr
}

/// `100 Continue` and `103 Early Hints` from the upstream are read past: the client gets the
/// final answer alone (docs/forwarding.md).
#[tokio::test]
async fn informational_answers_from_the_upstream_are_read_past() {
    let upstream = raw_upstream(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n\
          HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        false,
    )
    .await;
    let hf = Holdfast::start(&format!("http://{upstream}")).await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mut conn = http::raw_post(hf.addr, ping, ping.len()).await;
    let head = http::read_head(&mut conn).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(!head.to_lowercase().contains("link:"), "{head}");
    assert!(!head.contains("103"), "{head}");
}

/// A 502 on HTTP/1.1 closes the client's connection: after a failure mid-request its state is
/// unknown (docs/holding.md).
#[tokio::test]
async fn a_502_closes_the_client_connection() {
    use tokio::io::AsyncReadExt;
    // Reads the whole request, then closes without a byte: "sent, then reset".
    let upstream = raw_upstream(b"", true).await;
    let hf = Holdfast::start(&format!("http://{upstream}")).await;
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"record"}}"#;
    let mut conn = http::raw_post(hf.addr, call, call.len()).await;
    let head = http::read_head(&mut conn).await;
    assert!(head.starts_with("HTTP/1.1 502 "), "{head}");
    assert!(head.to_lowercase().contains("connection: close"), "{head}");
    // The body, then the end of the connection.
    let mut rest = Vec::new();
    let read = crate::support::within(conn.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "{read:?}");
}
