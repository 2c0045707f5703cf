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

use crate::sse::{event, open, push, sse_upstream, Client, EventSender, Events, SSE_ACTIVE};
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

/// A stream that outlives the drain is cut when the drain timeout expires, and holdfast exits.
async fn a_stream_is_cut_after_the_drain_timeout(client: Client) {
    const DRAIN: Duration = Duration::from_secs(1);
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = raw_config(&upstream.url());
    raw.shutdown.drain_timeout_secs = DRAIN.as_secs_f64();
    let mut holdfast = Holdfast::start_with(raw).await;

    let mut events = Events::new(open(&holdfast, client).await);
    let tx: EventSender = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));
    assert_eq!(holdfast.metric(SSE_ACTIVE).await, 1.0);

    let begun = Instant::now();
    holdfast.begin_shutdown();
    // The stream keeps flowing during the drain.
    push(&tx, 2).await;
    assert_eq!(events.next().await, event(2));

    // Then it is cut (an error or an end: either way the client reconnects elsewhere) and
    // holdfast stops; the upstream stays connected, so nothing but the drain timeout ends it.
    let _ = events.end().await;
    let cut = begun.elapsed();
    within(holdfast.wait()).await;
    // Not before the drain timeout (after it: only the drain timeout ends this stream, and the
    // waits above are bounded).
    assert!(
        cut >= DRAIN - Duration::from_millis(100),
        "the stream was cut after {cut:?}, before the {DRAIN:?} drain timeout"
    );
    // Nothing of the stream outlives holdfast: the upstream's response is let go too.
    within(tx.closed()).await;
}

#[tokio::test]
async fn a_long_stream_is_cut_after_the_drain_timeout() {
    a_stream_is_cut_after_the_drain_timeout(Client::H1).await;
}

#[tokio::test]
async fn a_long_h2_stream_is_cut_after_the_drain_timeout() {
    a_stream_is_cut_after_the_drain_timeout(Client::H2).await;
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
