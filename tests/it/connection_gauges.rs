//! The gauges of open connections: `holdfast_client_connections{protocol,transport}` while a
//! client's connection is open (HTTP/1.1 and h2c here; TLS's series in the unit tests), and
//! `holdfast_upstream_connections` while a pooled connection to the upstream lives.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::http::{echo, Upstream};
use crate::support::proxy::{raw_config, Holdfast};

const H1: &str = r#"holdfast_client_connections{protocol="http1",transport="plain"}"#;
const H2: &str = r#"holdfast_client_connections{protocol="http2",transport="plain"}"#;
const UPSTREAM: &str = "holdfast_upstream_connections";

#[tokio::test]
async fn client_and_upstream_connections_count_while_they_are_open() {
    let up = Upstream::start(echo).await;
    let mut raw = raw_config(&up.url());
    // Short: the pooled connection's close is what the last wait sees.
    raw.client.pool_idle_timeout_secs = 0.5;
    let hf = Holdfast::start_with(raw).await;
    assert_eq!(hf.metric(H1).await, 0.0);
    assert_eq!(hf.metric(H2).await, 0.0);
    assert_eq!(hf.metric(UPSTREAM).await, 0.0);

    // An HTTP/1.1 connection kept alive after its answer.
    let mut h1 = TcpStream::connect(hf.addr).await.unwrap();
    let get = format!("GET /mcp HTTP/1.1\r\nhost: {}\r\n\r\n", hf.addr);
    h1.write_all(get.as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    assert!(h1.read(&mut buf).await.unwrap() > 0);
    assert!(buf.starts_with(b"HTTP/1.1 200"));
    assert_eq!(hf.metric(H1).await, 1.0);
    // The upstream connection that answered waits in the pool.
    assert_eq!(hf.metric(UPSTREAM).await, 1.0);

    // An h2c connection with prior knowledge, open while its sender lives.
    let tcp = TcpStream::connect(hf.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post(hf.url("/mcp"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    assert_eq!(hf.metric(H2).await, 1.0);
    assert_eq!(
        hf.metric(H1).await,
        1.0,
        "the other connection still counts"
    );

    drop(h1);
    hf.metric_until(H1, |v| v == 0.0).await;
    drop(sender);
    conn.await.unwrap().unwrap();
    hf.metric_until(H2, |v| v == 0.0).await;
    // Idle past client.pool_idle_timeout_secs: closed, and no longer counted.
    hf.metric_until(UPSTREAM, |v| v == 0.0).await;
    hf.shutdown().await;
    up.stop().await;
}
