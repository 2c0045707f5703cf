//! The behaviour table, row by row, through a real holdfast in front of a scripted upstream: an
//! upstream that cannot be reached is a 503 at once, with its reason and a Retry-After.

use std::time::Duration;

use crate::support::http::{self, post_json, Reserved, Upstream};
use crate::support::proxy::Holdfast;
use crate::support::rows::{immediate, CALL};
use crate::support::within;

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
