//! Graceful shutdown, as SIGTERM starts it: readiness goes false, new connections are refused,
//! in-flight requests finish within the drain timeout, and streams still open after it are cut
//! so that holdfast exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::sse::{event, open, push, sse_upstream, Client, EventSender, Events};
use crate::support::http::{collect, get, host_of, response, send, Got, Upstream};
use crate::support::process::{serving, signal, Running};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::{within, LIMIT};

/// An upstream whose `/slow` answers only once the test releases it, announcing each arrival;
/// every other path answers at once.
struct HeldUpstream {
    upstream: Upstream,
    /// One message per `/slow` request that reached the upstream.
    arrived: mpsc::UnboundedReceiver<()>,
    /// Closed to let every held request (present and future) answer.
    gate: Arc<Semaphore>,
}

impl HeldUpstream {
    async fn start() -> HeldUpstream {
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let held = gate.clone();
        let upstream = Upstream::start(move |seen| {
            let arrived_tx = arrived_tx.clone();
            let held = held.clone();
            async move {
                if seen.uri == "/slow" {
                    let _ = arrived_tx.send(());
                    // A closed semaphore fails every acquire: that is the release.
                    let _ = held.acquire().await;
                    response(200, &[("content-type", "text/plain")], "slow done")
                } else {
                    response(200, &[("content-type", "text/plain")], "fast")
                }
            }
        })
        .await;
        HeldUpstream {
            upstream,
            arrived,
            gate,
        }
    }

    fn release(&self) {
        self.gate.close();
    }
}

/// Starts a `/slow` request through holdfast and returns once the upstream holds it.
async fn in_flight(holdfast: &Holdfast, held: &mut HeldUpstream) -> tokio::task::JoinHandle<Got> {
    let url = holdfast.url("/slow");
    let req = Request::get(&url)
        .header("host", host_of(&url))
        .body(Full::default())
        .unwrap();
    let request = tokio::spawn(async move { collect(send(req).await).await });
    within(held.arrived.recv()).await.unwrap();
    request
}

/// `/readyz` on the admin port.
async fn readyz(holdfast: &Holdfast) -> StatusCode {
    within(get(&format!("http://{}/readyz", holdfast.admin)))
        .await
        .status
}

/// Polls `/readyz` until it answers `want`. Readiness flips in holdfast's own task after the
/// shutdown signal, with nothing the test could await: poll, within [`within`]'s bound.
async fn wait_for_readyz(holdfast: &Holdfast, want: StatusCode) {
    within(async {
        while readyz(holdfast).await != want {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// What happened to a new request.
#[derive(Debug, PartialEq)]
enum Attempt {
    /// The TCP connect failed.
    Refused,
    /// Connected, then closed without an answer.
    Closed,
    /// Answered with this status.
    Answered(StatusCode),
    /// Connected, and nothing happened for [`LIMIT`]: a client left waiting.
    Hung,
}

/// Tries one request on a fresh connection to `addr`.
async fn attempt(addr: SocketAddr) -> Attempt {
    let try_once = async {
        let Ok(stream) = TcpStream::connect(addr).await else {
            return Attempt::Refused;
        };
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
        else {
            return Attempt::Closed;
        };
        tokio::spawn(conn);
        let req = Request::get(format!("http://{addr}/fast"))
            .header("host", addr.to_string())
            .body(Full::default())
            .unwrap();
        match sender.send_request(req).await {
            Ok(resp) => Attempt::Answered(resp.status()),
            Err(_) => Attempt::Closed,
        }
    };
    tokio::time::timeout(LIMIT, try_once)
        .await
        .unwrap_or(Attempt::Hung)
}

#[tokio::test]
async fn healthz_and_readyz_answer_200_while_running() {
    let held = HeldUpstream::start().await;
    let holdfast = Holdfast::start(&held.upstream.url()).await;

    let health = within(get(&format!("http://{}/healthz", holdfast.admin))).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.text(), "ok\n");
    let ready = within(get(&format!("http://{}/readyz", holdfast.admin))).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.text(), "ready\n");

    // And the proxy they vouch for answers.
    assert_eq!(
        attempt(holdfast.addr).await,
        Attempt::Answered(StatusCode::OK)
    );
    within(holdfast.shutdown()).await;
}

#[tokio::test]
async fn an_in_flight_request_finishes_during_the_drain() {
    let mut held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.drain_timeout_secs = 10.0;
    let mut holdfast = Holdfast::start_with(raw).await;

    let request = in_flight(&holdfast, &mut held).await;
    holdfast.begin_shutdown();
    held.release();

    let got = within(request).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "slow done");
    within(holdfast.wait()).await;
}

#[tokio::test]
async fn readyz_is_503_while_draining() {
    let mut held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.drain_timeout_secs = 10.0;
    let mut holdfast = Holdfast::start_with(raw).await;

    let request = in_flight(&holdfast, &mut held).await;
    assert_eq!(readyz(&holdfast).await, 200);
    holdfast.begin_shutdown();

    // The request is still held, so holdfast is draining: the admin port still answers, and a
    // load balancer must read "not ready" from it.
    wait_for_readyz(&holdfast, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(!request.is_finished());

    held.release();
    let got = within(request).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "slow done");
    within(holdfast.wait()).await;
}

#[tokio::test]
async fn new_connections_are_refused_once_shutdown_begins() {
    let mut held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.drain_timeout_secs = 10.0;
    let mut holdfast = Holdfast::start_with(raw).await;

    let request = in_flight(&holdfast, &mut held).await;
    holdfast.begin_shutdown();

    // Until holdfast's accept loop sees the signal a new request may still be served; after it,
    // every new connection must fail (refused, or closed unanswered) so that the client goes
    // elsewhere, while the drain keeps the in-flight request alive. Only answers may come
    // before that: a connection left hanging is a failure at once.
    within(async {
        loop {
            match attempt(holdfast.addr).await {
                Attempt::Refused | Attempt::Closed => break,
                Attempt::Answered(status) => assert_eq!(status, 200),
                Attempt::Hung => panic!("a new connection during the drain was left hanging"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(!request.is_finished(), "the drain ended the held request");

    held.release();
    assert_eq!(within(request).await.unwrap().status, 200);
    within(holdfast.wait()).await;
}

/// A connection whose client chose holdfast before the drain began, and sends its request only
/// as it begins (a balancer that has not yet seen readiness turn false), is served, and then
/// closed: closed unread, its request would fail in a way nobody retries for a POST.
#[tokio::test]
async fn a_connection_opened_before_the_drain_gets_its_first_request_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.drain_timeout_secs = 10.0;
    let mut holdfast = Holdfast::start_with(raw).await;
    // The in-flight request keeps the drain going while the test looks.
    let request = in_flight(&holdfast, &mut held).await;
    let mut early = TcpStream::connect(holdfast.addr).await.unwrap();

    holdfast.begin_shutdown();
    // The listener closes and the drain begins in one step: once a new connection is
    // refused, the early one is draining.
    within(async {
        while TcpStream::connect(holdfast.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let host = holdfast.addr.to_string();
    early
        .write_all(
            format!("POST /fast HTTP/1.1\r\nhost: {host}\r\ncontent-length: 2\r\n\r\n{{}}")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    within(early.read_to_end(&mut answer)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer:?}"
    );

    held.release();
    assert_eq!(within(request).await.unwrap().status, 200);
    within(holdfast.wait()).await;
}

/// With `shutdown.accept_grace_secs`, SIGTERM turns readiness off at once while new
/// connections are still served; accepting stops when the grace ends.
#[tokio::test]
async fn during_the_accept_grace_readiness_fails_and_new_connections_are_served() {
    let held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.accept_grace_secs = 5.0;
    raw.shutdown.drain_timeout_secs = 10.0;
    let mut holdfast = Holdfast::start_with(raw).await;

    // The grace starts after this instant, so it cannot end before 5 s from it.
    let began = Instant::now();
    holdfast.begin_shutdown();
    wait_for_readyz(&holdfast, StatusCode::SERVICE_UNAVAILABLE).await;
    match attempt(holdfast.addr).await {
        Attempt::Answered(status) => assert_eq!(status, 200),
        other => panic!("a new connection during the grace: {other:?}"),
    }
    // Then accepting stops: new connections are refused, after the grace and not before.
    within(async {
        while !matches!(attempt(holdfast.addr).await, Attempt::Refused) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        began.elapsed() >= Duration::from_secs(5),
        "refused {:?} after SIGTERM, within the grace",
        began.elapsed()
    );
    within(holdfast.wait()).await;
}

/// Writes `request` on `conn` and reads its answer's head, lower-cased.
async fn head_of(conn: &mut TcpStream, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before an answer");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_ascii_lowercase()
}

/// During the accept grace, answers carry `Connection: close`: a kept-alive connection from
/// before the SIGTERM gets its next answer and is closed, so its client's next request opens a
/// connection the balancer sends elsewhere; so does a connection opened during the grace.
#[tokio::test]
async fn answers_during_the_accept_grace_close_their_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let held = HeldUpstream::start().await;
    let mut raw = raw_config(&held.upstream.url());
    raw.shutdown.accept_grace_secs = 5.0;
    let mut holdfast = Holdfast::start_with(raw).await;
    let request = format!("GET /fast HTTP/1.1\r\nhost: {}\r\n\r\n", holdfast.addr);
    let mut kept = TcpStream::connect(holdfast.addr).await.unwrap();
    let before = within(head_of(&mut kept, &request)).await;
    assert!(!before.contains("connection: close"), "{before}");

    holdfast.begin_shutdown();
    wait_for_readyz(&holdfast, StatusCode::SERVICE_UNAVAILABLE).await;
    let mut fresh = TcpStream::connect(holdfast.addr).await.unwrap();
    let during = within(head_of(&mut fresh, &request)).await;
    assert!(during.starts_with("http/1.1 200"), "{during}");
    assert!(during.contains("connection: close"), "{during}");
    // The kept-alive one: closed while idle, or answered once more with Connection: close.
    let _ = kept.write_all(request.as_bytes()).await;
    let mut rest = Vec::new();
    let _ = within(kept.read_to_end(&mut rest)).await;
    let rest = String::from_utf8_lossy(&rest).to_ascii_lowercase();
    assert!(
        rest.is_empty() || rest.contains("connection: close"),
        "the kept-alive connection ends: {rest}"
    );
    within(holdfast.wait()).await;
}

/// A client's standalone event stream (a GET) ends cleanly as the drain begins: it never ends by
/// itself, so it would hold the shutdown for the whole drain timeout (60 s here) and then be cut
/// without its final chunk. Ended cleanly, its client reconnects elsewhere at once.
async fn a_standalone_stream_ends_cleanly_when_the_drain_begins(client: Client) {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = raw_config(&upstream.url());
    raw.shutdown.drain_timeout_secs = 60.0;
    let mut holdfast = Holdfast::start_with(raw).await;

    let mut events = Events::new(open(&holdfast, client).await);
    let tx: EventSender = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));

    holdfast.begin_shutdown();
    events
        .end()
        .await
        .expect("a clean end, its final chunk written");
    // Well within the drain timeout: `within` gives up after 30 s.
    within(holdfast.wait()).await;
    within(tx.closed()).await;
}

#[tokio::test]
async fn a_standalone_stream_ends_cleanly_when_the_drain_begins_h1() {
    a_standalone_stream_ends_cleanly_when_the_drain_begins(Client::H1).await;
}

#[tokio::test]
async fn a_standalone_stream_ends_cleanly_when_the_drain_begins_h2() {
    a_standalone_stream_ends_cleanly_when_the_drain_begins(Client::H2).await;
}

/// A call's event stream (a POST) keeps flowing through the drain, and ends cleanly when the
/// drain timeout expires; then holdfast exits.
async fn a_calls_stream_flows_through_the_drain_and_ends_cleanly_at_its_end(client: Client) {
    const DRAIN: Duration = Duration::from_secs(1);
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = raw_config(&upstream.url());
    raw.shutdown.drain_timeout_secs = DRAIN.as_secs_f64();
    let mut holdfast = Holdfast::start_with(raw).await;

    let mut events = Events::new(post_stream(&holdfast, client).await);
    let tx: EventSender = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));

    let begun = Instant::now();
    holdfast.begin_shutdown();
    push(&tx, 2).await;
    assert_eq!(events.next().await, event(2), "it flows during the drain");
    events.end().await.expect("a clean end at the drain's end");
    let ended = begun.elapsed();
    within(holdfast.wait()).await;
    assert!(
        ended >= DRAIN - Duration::from_millis(100),
        "the stream ended after {ended:?}, before the {DRAIN:?} drain timeout"
    );
    within(tx.closed()).await;
}

/// Opens a call answered by an event stream, as an MCP client's POST does.
async fn post_stream(
    holdfast: &Holdfast,
    client: Client,
) -> hyper::Response<hyper::body::Incoming> {
    let url = holdfast.url("/mcp");
    let req = hyper::Request::post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    let body = http_body_util::Full::new(bytes::Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#,
    ));
    let resp = match client {
        Client::H1 => {
            let req = req.header("host", crate::support::http::host_of(&url));
            within(crate::support::http::send(req.body(body).unwrap())).await
        }
        Client::H2 => within(crate::support::http::send_h2(req.body(body).unwrap())).await,
    };
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn a_calls_stream_ends_cleanly_at_the_drains_end_h1() {
    a_calls_stream_flows_through_the_drain_and_ends_cleanly_at_its_end(Client::H1).await;
}

#[tokio::test]
async fn a_calls_stream_ends_cleanly_at_the_drains_end_h2() {
    a_calls_stream_flows_through_the_drain_and_ends_cleanly_at_its_end(Client::H2).await;
}

/// The binary: a call still waiting for its answer when the drain ends is cut by holdfast, and
/// logged and counted so (`shutdown`, 503), never as its client's 499.
#[tokio::test]
async fn a_call_cut_by_the_drains_end_is_logged_as_shutdown_not_as_the_clients() {
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let upstream = crate::support::http::Upstream::start(move |_| {
        let arrived_tx = arrived_tx.clone();
        async move {
            let _ = arrived_tx.send(());
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut proxy = Running::start(
        serving(&upstream.url(), &["--access-log"])
            .env("HOLDFAST_SHUTDOWN__DRAIN_TIMEOUT_SECS", "0.5"),
    );
    let (listen, _) = proxy.addresses();
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {listen}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{call}",
        call.len()
    );
    let waiting =
        tokio::spawn(
            async move { crate::support::mcp::raw_http(listen, request.as_bytes()).await },
        );
    within(arrived.recv())
        .await
        .expect("the call reached the upstream");
    let (status, lines) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let _ = waiting.await;
    let access: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("holdfast::access"))
        .collect();
    assert_eq!(access.len(), 1, "{lines:#?}");
    assert!(
        access[0].contains(r#""action":"shutdown""#),
        "{}",
        access[0]
    );
    assert!(access[0].contains(r#""status":503"#), "{}", access[0]);
}

/// The real binary: on SIGTERM a request in flight finishes (the drain), then holdfast exits 0.
#[tokio::test]
async fn sigterm_lets_the_request_in_flight_finish_then_exits_0() {
    let mut held = HeldUpstream::start().await;
    let mut proxy = Running::start(&mut serving(&held.upstream.url(), &[]));
    let (listen, _) = proxy.addresses();
    let url = format!("http://{listen}/slow");
    let req = Request::get(&url)
        .header("host", host_of(&url))
        .body(Full::default())
        .unwrap();
    let request = tokio::spawn(async move { collect(send(req).await).await });
    within(held.arrived.recv()).await.unwrap();

    signal(proxy.pid(), "TERM");
    proxy.wait_for_line("shutting down: draining in-flight requests");
    assert!(!request.is_finished(), "the drain waits for the request");
    held.release();
    let got = within(request).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "slow done");
    let (status, lines) = proxy.wait_for_exit();
    assert_eq!(status.code(), Some(0), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("holdfast stopped")),
        "{lines:#?}"
    );
}

/// The real binary: SIGINT (Ctrl-C in a terminal) stops it as cleanly as SIGTERM.
#[tokio::test]
async fn sigint_stops_holdfast_cleanly() {
    let held = HeldUpstream::start().await;
    let mut proxy = Running::start(&mut serving(&held.upstream.url(), &[]));
    let (listen, _) = proxy.addresses();
    assert_eq!(attempt(listen).await, Attempt::Answered(StatusCode::OK));
    signal(proxy.pid(), "INT");
    let (status, lines) = proxy.wait_for_exit();
    assert_eq!(status.code(), Some(0), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("holdfast stopped")),
        "{lines:#?}"
    );
}
