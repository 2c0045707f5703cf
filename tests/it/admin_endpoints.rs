//! The admin listener's methods (issue 43): a known path asked with a method it does not take
//! is a 405 naming those it does, not the 404 of a path that does not exist; `HEAD` on the
//! read-only endpoints answers as `GET` does, without the body (load balancers' and uptime
//! checkers' health checks send `HEAD`).

use crate::support::http::Upstream;
use crate::support::mcp::{raw_http, RawResponse};
use crate::support::proxy::Holdfast;
use crate::support::within;

async fn ask(hf: &Holdfast, method: &str, path: &str) -> RawResponse {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    within(raw_http(hf.admin, request.as_bytes()))
        .await
        .expect("an answer")
}

#[tokio::test]
async fn a_known_path_with_another_method_is_405_and_head_answers_as_get() {
    let up = Upstream::start(|_| async { crate::support::http::response(200, &[], "ok") }).await;
    let hf = Holdfast::start(&up.url()).await;

    for (method, path, allow) in [
        ("GET", "/pause", "POST"),
        ("GET", "/resume", "POST"),
        ("PUT", "/pause", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("DELETE", "/metrics", "GET, HEAD"),
    ] {
        let got = ask(&hf, method, path).await;
        assert!(
            got.status_line.starts_with("HTTP/1.1 405"),
            "{method} {path}: {got:?}"
        );
        assert_eq!(got.header("allow"), Some(allow), "{method} {path}");
    }
    // A GET on /pause must not have paused anything.
    assert_eq!(hf.metric("holdfast_paused").await, 0.0);

    for path in ["/healthz", "/readyz", "/status", "/metrics"] {
        let get = ask(&hf, "GET", path).await;
        let head = ask(&hf, "HEAD", path).await;
        assert!(
            get.status_line.starts_with("HTTP/1.1 200"),
            "{path}: {get:?}"
        );
        assert_eq!(head.status_line, get.status_line, "HEAD {path}");
        assert_eq!(head.header("content-type"), get.header("content-type"));
        assert!(head.body.is_empty(), "HEAD {path}: {head:?}");
    }
    let healthz = ask(&hf, "HEAD", "/healthz").await;
    assert_eq!(healthz.header("content-length"), Some("3"), "{healthz:?}");

    // A path that does not exist is still a 404.
    let got = ask(&hf, "GET", "/nope").await;
    assert!(got.status_line.starts_with("HTTP/1.1 404"), "{got:?}");
}
