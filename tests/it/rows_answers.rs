//! The behaviour table, row by row, through a real holdfast in front of a scripted upstream:
//! other statuses pass, a router's unavailable 5xx becomes 503, an answer broken after the
//! request was sent is a 502 (never a 503), and a request target that cannot be forwarded is a
//! 400.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::http::{post_json, response, Upstream};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::rows::{immediate, CALL};
use crate::support::within;

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
