//! holdfast's own HTTP/1 pool towards an `http://` upstream: reuse, and every way an upstream
//! ends a connection that a pool must survive without failing or repeating a request.
//!
//! The upstream here is raw: each connection is served by a script that writes exact bytes, so a
//! test controls keep-alive, `Connection: close`, HTTP/1.0 and closing right after a response.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::support::http;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// How the raw upstream answers each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Script {
    /// `200` with a body, keep-alive.
    KeepAlive,
    /// `202` without a body, keep-alive.
    NoBody,
    /// `200`, then the server closes the connection (no `Connection: close`): what a server
    /// does when its keep-alive timeout strikes right after a response.
    CloseAfter,
    /// `200` with `Connection: close`.
    ConnectionClose,
    /// An HTTP/1.0 answer (no keep-alive), then close.
    Http10,
    /// `200`, then, once the test says so ([`RawUpstream::reset`]), the server resets the
    /// connection (SO_LINGER 0): a backend killed between two requests, its pooled connection
    /// stale.
    ResetAfter,
    /// A head promising a large body, a little of it, then nothing (the test cuts it off).
    Stalls,
    /// `404` as soon as the request head is read, without waiting for the body (as an MCP SDK
    /// answers a forgotten session), then reading on.
    AnswersEarly,
    /// Traefik's own `502 Bad Gateway` as soon as the head is read (its dial failed), then
    /// reading on.
    Router502,
    /// `200`, chunked, with a chunk extension and a trailer, keep-alive.
    Chunked,
    /// `200` with neither length nor chunks: the body ends when the server closes.
    CloseDelimited,
    /// `200` whose head is larger than `limits.max_header_bytes`.
    HugeHead,
}

impl Script {
    fn response(self) -> std::borrow::Cow<'static, [u8]> {
        match self {
            Script::HugeHead => format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok",
                "a".repeat(70 * 1024)
            )
            .into_bytes()
            .into(),
            other => other.fixed().into(),
        }
    }

    fn fixed(self) -> &'static [u8] {
        match self {
            Script::KeepAlive => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Script::NoBody => b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            Script::CloseAfter | Script::ResetAfter => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            }
            Script::ConnectionClose => {
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
            }
            Script::Http10 => b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Script::Stalls => b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\nfirst bytes",
            Script::AnswersEarly => b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\ngone",
            Script::Router502 => {
                b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 11\r\n\r\nBad Gateway"
            }
            Script::Chunked => {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                  2;name=value\r\nok\r\n3\r\n!!!\r\n0\r\nx-checksum: 1\r\n\r\n"
            }
            Script::CloseDelimited => {
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil close"
            }
            Script::HugeHead => unreachable!("built in response()"),
        }
    }

    fn closes(self) -> bool {
        matches!(
            self,
            Script::CloseAfter | Script::ConnectionClose | Script::Http10 | Script::CloseDelimited
        )
    }
}

/// A raw upstream on 127.0.0.1:0.
struct RawUpstream {
    addr: SocketAddr,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Requests answered.
    answered: Arc<AtomicUsize>,
    /// Connections closed: by the peer (holdfast), as the upstream saw them, or reset by a
    /// [`Script::ResetAfter`] upstream.
    peer_closed: watch::Receiver<usize>,
    /// Permits for [`Script::ResetAfter`] connections to reset.
    reset: Arc<Semaphore>,
    _tasks: JoinSet<()>,
}

impl RawUpstream {
    async fn start(script: Script) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (closed_tx, peer_closed) = watch::channel(0);
        let closed_tx = Arc::new(closed_tx);
        let mut tasks = JoinSet::new();
        let (accepted2, answered2) = (accepted.clone(), answered.clone());
        let reset = Arc::new(Semaphore::new(0));
        let reset2 = reset.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted2.fetch_add(1, Ordering::SeqCst);
                let (answered, closed) = (answered2.clone(), closed_tx.clone());
                connections.spawn(serve(stream, script, answered, closed, reset2.clone()));
            }
        });
        RawUpstream {
            addr,
            accepted,
            answered,
            peer_closed,
            reset,
            _tasks: tasks,
        }
    }

    /// Lets a [`Script::ResetAfter`] connection reset (one per call).
    fn reset(&self) {
        self.reset.add_permits(1);
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves one connection: reads request heads (bodies are not sent by these tests' GETs) and
/// answers each by the script, until either side closes.
async fn serve(
    mut stream: TcpStream,
    script: Script,
    answered: Arc<AtomicUsize>,
    closed: Arc<watch::Sender<usize>>,
    reset: Arc<Semaphore>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    closed.send_modify(|n| *n += 1);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        buf.drain(..end);
        if stream.write_all(&script.response()).await.is_err() {
            return;
        }
        answered.fetch_add(1, Ordering::SeqCst);
        if script == Script::ResetAfter {
            // After holdfast has read the response (a reset could otherwise discard it).
            reset.acquire().await.unwrap().forget();
            // SO_LINGER 0: the close sends a RST. (Deprecated because a non-zero linger blocks
            // on drop; zero does not.)
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(std::time::Duration::ZERO));
            drop(stream);
            closed.send_modify(|n| *n += 1);
            return;
        }
        if script.closes() {
            return;
        }
        if matches!(
            script,
            Script::Stalls | Script::AnswersEarly | Script::Router502
        ) {
            // Hold the connection open, sending nothing more, until holdfast closes it.
            let _ = stream.read(&mut chunk).await;
            closed.send_modify(|n| *n += 1);
            return;
        }
    }
}

/// A client that sends the head of a 100-byte POST and a tenth of its body, then nothing. Returns
/// its open connection and what holdfast answered, read until `until` appears.
async fn slow_upload(holdfast: &Holdfast, until: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut slow = TcpStream::connect(holdfast.addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"jsonrpc\"",
        holdfast.addr
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(until.len()).any(|w| w == until) {
        let n = within(slow.read(&mut chunk)).await.unwrap();
        assert!(
            n > 0,
            "holdfast closed: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&chunk[..n]);
    }
    (slow, answer)
}

/// `holdfast_upstream_failures_total`, all reasons.
async fn failures(holdfast: &Holdfast) -> f64 {
    let text = holdfast.metrics().await;
    text.lines()
        .filter(|l| l.starts_with("holdfast_upstream_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn sequential_requests_share_one_connection_and_bodiless_answers_free_it_at_once() {
    for script in [Script::KeepAlive, Script::NoBody] {
        let upstream = RawUpstream::start(script).await;
        let holdfast = Holdfast::start(&upstream.url()).await;
        for _ in 0..5 {
            let got = http::get(&holdfast.url("/mcp")).await;
            assert!(got.status.is_success(), "{script:?}: {got:?}");
        }
        // A connection returns to the pool when its response has ended, before the client has
        // the whole answer: the next request always finds it.
        assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1, "{script:?}");
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 5, "{script:?}");
    }
}

#[tokio::test]
async fn upstreams_that_close_their_connections_cost_no_request() {
    for script in [Script::CloseAfter, Script::ConnectionClose, Script::Http10] {
        let upstream = RawUpstream::start(script).await;
        let holdfast = Holdfast::start(&upstream.url()).await;
        for n in 0..10 {
            let got = http::get(&holdfast.url("/mcp")).await;
            assert_eq!(got.status, 200, "{script:?}, request {n}: {got:?}");
        }
        assert_eq!(upstream.answered.load(Ordering::SeqCst), 10, "{script:?}");
        assert_eq!(
            upstream.accepted.load(Ordering::SeqCst),
            10,
            "{script:?}: a closed connection is never reused"
        );
        assert_eq!(failures(&holdfast).await, 0.0, "{script:?}");
    }
}

/// A backend killed between two requests leaves a pooled connection that is reset: the next
/// request takes a new connection and costs nothing. (Which layer notices first, hyper's
/// connection task or the pool's kernel check, is the runtime's choice; the kernel check alone
/// is pinned by the unit tests in `src/upstream/tests.rs`.)
#[tokio::test]
async fn a_pooled_connection_the_upstream_reset_costs_no_request() {
    let upstream = RawUpstream::start(Script::ResetAfter).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let mut resets = upstream.peer_closed.clone();
    for n in 0..5 {
        let got = within(http::get(&holdfast.url("/mcp"))).await;
        assert_eq!(got.status, 200, "request {n}: {got:?}");
        // The pooled connection is reset before the next request.
        upstream.reset();
        within(resets.wait_for(|&r| r > n)).await.unwrap();
    }
    assert_eq!(upstream.answered.load(Ordering::SeqCst), 5);
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 5);
    assert_eq!(failures(&holdfast).await, 0.0);
    let text = holdfast.metrics().await;
    for status in [502, 503] {
        assert_eq!(
            crate::support::proxy::requests_with_status(&text, status),
            0.0,
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_body_the_client_abandons_takes_its_connection_with_it() {
    let upstream = RawUpstream::start(Script::Stalls).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let response = within(http::send(
        ::http::Request::get(holdfast.url("/mcp"))
            .header("host", holdfast.addr.to_string())
            .body(http_body_util::Full::default())
            .unwrap(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    // The client goes away mid-body: holdfast drops the upstream response, and the connection,
    // whose state is unknown, closes instead of going back to the pool.
    drop(response);
    let mut closed = upstream.peer_closed.clone();
    within(closed.wait_for(|n| *n >= 1)).await.expect("watch");
    let next = within(http::send(
        ::http::Request::get(holdfast.url("/mcp"))
            .header("host", holdfast.addr.to_string())
            .body(http_body_util::Full::default())
            .unwrap(),
    ))
    .await;
    assert_eq!(
        next.status(),
        200,
        "the next request is served on a new connection"
    );
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn idle_connections_close_after_the_pool_idle_timeout() {
    let upstream = RawUpstream::start(Script::KeepAlive).await;
    let mut raw = raw_config(&upstream.url());
    raw.client.pool_idle_timeout_secs = 0.2;
    let holdfast = Holdfast::start_with(raw).await;
    assert_eq!(http::get(&holdfast.url("/mcp")).await.status, 200);
    // holdfast, not the upstream, ends the idle connection: the upstream sees it close.
    let mut closed = upstream.peer_closed.clone();
    within(closed.wait_for(|n| *n == 1)).await.expect("watch");
    // And the next request gets a new connection.
    assert_eq!(http::get(&holdfast.url("/mcp")).await.status, 200);
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_client_expecting_100_continue_gets_its_body_through() {
    let upstream = http::Upstream::start(|seen: http::Seen| {
        std::future::ready(http::response(200, &[], seen.body))
    })
    .await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count"}}"#;
    let got = within(http::call(
        ::http::Request::post(holdfast.url("/mcp"))
            .header("host", holdfast.addr.to_string())
            .header("content-type", "application/json")
            .header("expect", "100-continue")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap(),
    ))
    .await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        got.text(),
        body,
        "the body reached the upstream and came back"
    );
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn a_connection_still_uploading_a_slow_body_is_not_handed_to_the_next_request() {
    let upstream = RawUpstream::start(Script::AnswersEarly).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    // A client that sends a tenth of its body and then nothing: the upstream answers at once.
    let (slow, answer) = slow_upload(&holdfast, b"gone").await;
    assert!(
        answer.starts_with(b"HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // The upstream connection is still receiving that upload: the next request must not wait
    // behind it (it would until the slow client finished, or timed out), so it takes another.
    let next = within(http::get(&holdfast.url("/mcp"))).await;
    assert_eq!(next.status, 404);
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
    drop(slow);
}

#[tokio::test]
async fn a_router_answer_during_a_slow_upload_closes_the_abandoned_upstream_connection() {
    let upstream = RawUpstream::start(Script::Router502).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    // A client sends a tenth of its body and then nothing; the router answers 502 at once.
    let (slow, answer) = slow_upload(&holdfast, b"\r\n\r\n").await;
    // A router's 502 may follow a request the backend read: a 503 at once, never held.
    assert!(
        answer.starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // The attempt that met the router was stopped: its upstream connection closes while the
    // slow client is still there (it would wait out the 300 s body idle timeout otherwise).
    let mut closed = upstream.peer_closed.clone();
    within(closed.wait_for(|n| *n >= 1)).await.expect("watch");
    drop(slow);
}

#[tokio::test]
async fn chunked_and_close_delimited_answers_arrive_whole() {
    for (script, body, connections) in [
        (Script::Chunked, "ok!!!", 1),
        (Script::CloseDelimited, "until close", 3),
    ] {
        let upstream = RawUpstream::start(script).await;
        let holdfast = Holdfast::start(&upstream.url()).await;
        for n in 0..3 {
            let got = within(http::get(&holdfast.url("/mcp"))).await;
            assert_eq!(got.status, 200, "{script:?}, request {n}: {got:?}");
            assert_eq!(got.text(), body, "{script:?}, request {n}");
        }
        assert_eq!(
            upstream.accepted.load(Ordering::SeqCst),
            connections,
            "{script:?}: a chunked answer leaves its connection reusable, a close-delimited one cannot"
        );
        assert_eq!(failures(&holdfast).await, 0.0, "{script:?}");
    }
}

#[tokio::test]
async fn a_response_head_beyond_the_limit_is_a_protocol_error() {
    let upstream = RawUpstream::start(Script::HugeHead).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let got = within(http::get(&holdfast.url("/mcp"))).await;
    assert_eq!(got.status, 502, "{got:?}");
    assert_eq!(got.header("holdfast-reason"), Some("upstream_protocol"));
}

#[tokio::test]
async fn a_chunked_request_body_arrives_whole_and_chunked() {
    // A client that streams its body (no length): holdfast cannot know the length either, so
    // the upstream gets it chunked, byte for byte.
    let upstream = http::Upstream::start(|seen: http::Seen| {
        std::future::ready(http::response(200, &[], seen.body))
    })
    .await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let mut client = TcpStream::connect(holdfast.addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {}\r\ntransfer-encoding: chunked\r\n\r\n",
        holdfast.addr
    );
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(b"6\r\n{\"a\":1\r\n").await.unwrap();
    client.write_all(b"1\r\n}\r\n0\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"{\"a\":1}") {
        let n = within(client.read(&mut chunk)).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(&seen[0].body[..], b"{\"a\":1}");
    assert_eq!(
        seen[0]
            .headers
            .get("transfer-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("chunked"),
        "{:?}",
        seen[0].headers
    );
}
