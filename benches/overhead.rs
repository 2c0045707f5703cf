//! Per-request overhead of holdfast against a direct connection.
//!
//! `cargo bench --bench overhead` starts, in one process, an HTTP/1.1 upstream shaped like an MCP
//! server (a JSON-RPC tool call answered as JSON, and an SSE stream) and holdfast in front of it,
//! then sends the same traffic to each and prints a Markdown table of the difference. The results
//! and how to read them are in `benches/RESULTS.md`.
//!
//! Self-timed with [`Instant`] rather than criterion: the question is "how much does one hop
//! through holdfast add", and a latency distribution over many keep-alive requests answers it
//! without extra dependencies.
//!
//! Counts scale with environment variables (defaults in brackets):
//! - `HOLDFAST_BENCH_N` [20000]: sequential requests per target; the warm-up is a tenth of it and
//!   the concurrent phase sends 2.5 times as many.
//! - `HOLDFAST_BENCH_CONNS` [16]: concurrent client connections.
//! - `HOLDFAST_BENCH_SSE_EVENTS` [10000]: events per SSE stream.
//! - `HOLDFAST_BENCH_SSE_RUNS` [20]: SSE streams timed per target (the median is reported).
//! - `HOLDFAST_BENCH_PACED_EVENTS` [20000]: events of the paced SSE stream, sent at
//!   `HOLDFAST_BENCH_PACED_RATE` [10000] events per second; each event's latency from the
//!   upstream's write to the client's parse is measured, and every event must arrive once, whole,
//!   in order.
//!
//! `cargo test --all-targets` also runs this binary, without `--bench`; it then uses tiny counts
//! so that it serves as a quick smoke test of the whole path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use holdfast::config::{Config, RawConfig};

/// The JSON-RPC request every POST carries: a small MCP `tools/call`.
const TOOL_CALL: &[u8] = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}"#;

/// The upstream's answer to [`TOOL_CALL`], sent as `application/json` (no SSE).
const TOOL_RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hello"}],"isError":false}}"#;

/// A session id header, as an MCP client sends after `initialize`; holdfast forwards it untouched.
const SESSION_ID: &str = "3f2a9c1e-bench-session";

/// How many counts to use; see the crate doc for the variables.
struct Settings {
    /// Sequential requests measured per target.
    sequential: usize,
    /// Requests sent before measuring, per target and phase (connections, pools, caches).
    warmup: usize,
    /// Requests in the concurrent phase, per target.
    concurrent: usize,
    /// Client connections in the concurrent phase.
    connections: usize,
    /// Events per SSE stream.
    sse_events: usize,
    /// SSE streams timed per target.
    sse_runs: usize,
    /// Events of the paced stream.
    paced_events: usize,
    /// Its events per second.
    paced_rate: usize,
}

impl Settings {
    /// Full counts under `cargo bench` (which passes `--bench`), tiny ones otherwise.
    fn from_env(bench: bool) -> Settings {
        let (n, conns, events, runs, paced) = if bench {
            (20_000, 16, 10_000, 20, 20_000)
        } else {
            (200, 4, 100, 2, 200)
        };
        // Whole rounds only, so every count printed is a count sent.
        let n = env_count("HOLDFAST_BENCH_N", n).div_ceil(ROUNDS) * ROUNDS;
        Settings {
            sequential: n,
            warmup: (n / 10).max(1),
            concurrent: (n * 5 / 2).div_ceil(ROUNDS) * ROUNDS,
            connections: env_count("HOLDFAST_BENCH_CONNS", conns),
            sse_events: env_count("HOLDFAST_BENCH_SSE_EVENTS", events),
            sse_runs: env_count("HOLDFAST_BENCH_SSE_RUNS", runs),
            paced_events: env_count("HOLDFAST_BENCH_PACED_EVENTS", paced),
            paced_rate: env_count("HOLDFAST_BENCH_PACED_RATE", 10_000),
        }
    }
}

/// A positive count from the environment, or `default` when unset.
fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => panic!("{name} must be a positive integer, got {v:?}"),
        },
        Err(_) => default,
    }
}

fn main() {
    let settings = Settings::from_env(std::env::args().any(|a| a == "--bench"));
    // Two workers shared by the client, holdfast and the upstream: on a two-core machine this is
    // what a sidecar next to its backend gets, and the proxy's CPU cost shows up in the numbers.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let table = runtime.block_on(run(&settings));
    println!("{table}");
}

/// Each phase runs in rounds that alternate direct and via holdfast, so that drift in the
/// machine's speed (frequency scaling, other tenants) falls on both alike.
const ROUNDS: usize = 5;

/// One side of the comparison: where requests go, and what was measured there.
struct Side {
    /// The upstream itself, or holdfast in front of it.
    addr: SocketAddr,
    /// The keep-alive connection for the sequential and SSE phases.
    conn: SendRequest<Full<Bytes>>,
    /// What was measured.
    m: Measured,
}

/// The samples of one side.
#[derive(Default)]
struct Measured {
    /// Sequential tool-call latencies.
    sequential: Vec<Duration>,
    /// The concurrent phase, all rounds together.
    load: Load,
    /// Per SSE stream: time to the last byte.
    sse_whole: Vec<Duration>,
    /// Per event of the paced stream: from the upstream's write to the client's parse.
    paced: Vec<Duration>,
}

impl Side {
    /// Connects to `addr`.
    async fn new(addr: SocketAddr) -> Side {
        Side {
            addr,
            conn: connect(addr).await,
            m: Measured::default(),
        }
    }

    /// Closes the connection and returns the samples, sorted for [`percentile`].
    fn finish(self) -> Measured {
        let mut m = self.m;
        m.sequential.sort_unstable();
        m.load.latencies.sort_unstable();
        m.sse_whole.sort_unstable();
        m.paced.sort_unstable();
        m
    }
}

/// Runs every case against the upstream directly and through holdfast; returns the table.
async fn run(s: &Settings) -> String {
    let upstream = start_upstream(s.sse_events, s.paced_rate).await;
    let proxy = start_holdfast(upstream).await;
    let mut sides = [Side::new(upstream).await, Side::new(proxy.addr).await];
    let c = s.connections;

    // Sequential: one keep-alive connection, one request at a time. This is the latency an MCP
    // client sees on each tool call.
    for side in &mut sides {
        calls(&mut side.conn, side.addr, s.warmup).await;
    }
    for _ in 0..ROUNDS {
        for side in &mut sides {
            let round = calls(&mut side.conn, side.addr, s.sequential / ROUNDS).await;
            side.m.sequential.extend(round);
        }
    }

    // Concurrent: every connection keeps one request in flight until the round's count is
    // spent. Throughput here is bounded by CPU, so the difference is holdfast's CPU time per
    // request.
    for side in &mut sides {
        concurrent(side.addr, c, s.warmup).await;
    }
    for _ in 0..ROUNDS {
        for side in &mut sides {
            let round = concurrent(side.addr, c, s.concurrent / ROUNDS).await;
            side.m.load.add(round);
        }
    }

    // SSE: time to receive a whole stream of small events, i.e. the per-frame forwarding cost.
    // Two streams each warm up.
    for side in &mut sides {
        for _ in 0..2 {
            sse(&mut side.conn, side.addr, s.sse_events).await;
        }
    }
    for _ in 0..s.sse_runs {
        for side in &mut sides {
            let whole = sse(&mut side.conn, side.addr, s.sse_events).await;
            side.m.sse_whole.push(whole);
        }
    }

    // Paced SSE: events at a steady rate, as a busy server's notifications come; the latency each
    // event gains on the way, and none lost, merged or reordered. One stream per side, in turn.
    for side in &mut sides {
        let latencies = paced(&mut side.conn, side.addr, s.paced_events).await;
        side.m.paced = latencies;
    }

    // Close the bench's connections first, so holdfast's drain has nothing to wait for.
    let [direct, via] = sides.map(Side::finish);
    proxy.shutdown().await.expect("holdfast run");

    let mut rows = Vec::new();
    for (label, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0)] {
        rows.push(latency_row(
            format!("sequential POST, {label}"),
            percentile(&direct.sequential, p),
            percentile(&via.sequential, p),
        ));
    }
    rows.push(throughput_row(
        format!("{c} connections, throughput"),
        &direct.load,
        &via.load,
    ));
    for (label, p) in [("p50", 50.0), ("p99", 99.0)] {
        rows.push(latency_row(
            format!("{c} connections, {label}"),
            percentile(&direct.load.latencies, p),
            percentile(&via.load.latencies, p),
        ));
    }
    let events = s.sse_events;
    let (whole_direct, whole_via) = (
        percentile(&direct.sse_whole, 50.0),
        percentile(&via.sse_whole, 50.0),
    );
    rows.push(latency_row(
        format!("SSE, {events} events, whole stream"),
        whole_direct,
        whole_via,
    ));
    rows.push(latency_row(
        "SSE, per event".into(),
        whole_direct.div_f64(events as f64),
        whole_via.div_f64(events as f64),
    ));

    for (label, p) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
        rows.push(latency_row(
            format!(
                "SSE at {} events/s, per-event latency {label}",
                s.paced_rate
            ),
            percentile(&direct.paced, p),
            percentile(&via.paced, p),
        ));
    }

    let mut out = format!(
        "sequential: {} requests after {} warm-up, one keep-alive connection\n\
         concurrent: {} requests over {c} keep-alive connections\n\
         SSE: {events} events per stream, medians of {} streams\n\
         paced SSE: {} events at {} events/s, each one arrived once, whole and in order\n\
         each phase alternates direct and via holdfast in rounds (paced SSE: one stream each)\n\n",
        direct.sequential.len(),
        s.warmup,
        direct.load.requests,
        s.sse_runs,
        s.paced_events,
        s.paced_rate,
    );
    out.push_str("| case | direct | via holdfast | added overhead |\n");
    out.push_str("|---|---:|---:|---:|\n");
    for [case, d, v, added] in rows {
        out.push_str(&format!("| {case} | {d} | {v} | {added} |\n"));
    }
    out
}

// --- The upstream -------------------------------------------------------------------------------

/// Starts an HTTP/1.1 upstream on 127.0.0.1:0: `POST` gets [`TOOL_RESULT`], `GET` gets an SSE
/// stream of `sse_events` events, and `GET ?paced=N` a stream of N events at `rate` per second.
async fn start_upstream(sse_events: usize, rate: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            // Small messages: do not let Nagle hold them back, as a real server would not.
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(move |req| answer(req, sse_events, rate));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The upstream's handler.
async fn answer(
    req: Request<Incoming>,
    sse_events: usize,
    rate: usize,
) -> Result<Response<Either<Full<Bytes>, Either<SseBody, PacedBody>>>, Infallible> {
    if req.method() == Method::GET {
        let paced = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("paced="))
            .map(|n| n.parse().expect("a paced event count"));
        let body = match paced {
            Some(events) => Either::Right(PacedBody::start(events, rate)),
            None => Either::Left(SseBody {
                next: 0,
                total: sse_events,
            }),
        };
        let resp = Response::builder()
            .header(CONTENT_TYPE, "text/event-stream")
            .header(CACHE_CONTROL, "no-cache")
            .body(Either::Right(body))
            .expect("valid response");
        return Ok(resp);
    }
    // An MCP server reads the whole JSON-RPC message before it can act on it.
    let _ = req.into_body().collect().await;
    let resp = Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(Either::Left(Full::new(Bytes::from_static(TOOL_RESULT))))
        .expect("valid response");
    Ok(resp)
}

/// An SSE body of `total` events, one frame each. Every frame is ready at once, so the stream
/// goes as fast as the connection takes it: the bench measures forwarding cost, not a producer.
struct SseBody {
    /// Index of the next event.
    next: usize,
    /// Events in the stream.
    total: usize,
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.next == self.total {
            return Poll::Ready(None);
        }
        let event = sse_event(self.next);
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(event))))
    }

    fn is_end_stream(&self) -> bool {
        self.next == self.total
    }
}

/// Event `i` of the stream: an MCP progress notification.
fn sse_event(i: usize) -> Bytes {
    format!(
        "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\
         \"params\":{{\"progressToken\":7,\"progress\":{i}}}}}\n\n"
    )
    .into()
}

/// The clock both ends of the paced stream read: an event carries the nanoseconds since this
/// instant at which the upstream wrote it.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// An SSE body fed at a steady rate by a thread of its own: tokio's timer ticks every
/// millisecond, too coarse for an event every 100 µs, so the pacer sleeps to absolute deadlines
/// on a plain thread (late ones are sent at once, keeping the average rate).
struct PacedBody {
    events: tokio::sync::mpsc::Receiver<Bytes>,
}

impl PacedBody {
    fn start(total: usize, rate: usize) -> PacedBody {
        let (tx, events) = tokio::sync::mpsc::channel(1024);
        let interval = Duration::from_secs(1).div_f64(rate as f64);
        std::thread::spawn(move || {
            let start = Instant::now();
            for i in 0..total {
                let due = start + interval.mul_f64(i as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let sent = epoch().elapsed().as_nanos();
                let event = format!(
                    "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\
                     \"params\":{{\"progressToken\":7,\"progress\":{i},\"sent\":{sent}}}}}\n\n"
                );
                if tx.blocking_send(event.into()).is_err() {
                    return;
                }
            }
        });
        PacedBody { events }
    }
}

impl Body for PacedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.events
            .poll_recv(cx)
            .map(|event| event.map(|e| Ok(Frame::data(e))))
    }
}

// --- holdfast ----------------------------------------------------------------------------------

/// Starts holdfast with its default settings in front of `upstream`, on port 0.
async fn start_holdfast(upstream: SocketAddr) -> holdfast::server::Spawned {
    let mut raw = RawConfig {
        upstream: format!("http://{upstream}"),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    // The bench closes its connections before stopping; a long drain would only hide a hang.
    raw.shutdown.drain_timeout_secs = 1.0;
    let config = Config::from_raw(&raw, &|_| "bench".into()).expect("valid bench config");
    holdfast::server::spawn(config)
        .await
        .expect("holdfast starts")
}

// --- The client --------------------------------------------------------------------------------

/// Opens one keep-alive HTTP/1.1 connection to `addr`.
async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// A tool call as an MCP client sends it over streamable HTTP.
fn tool_call(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream")
        .header("mcp-session-id", SESSION_ID)
        .body(Full::new(Bytes::from_static(TOOL_CALL)))
        .expect("valid request")
}

/// Sends one tool call and reads the whole answer; returns the time from send to last byte.
async fn call(sender: &mut SendRequest<Full<Bytes>>, addr: SocketAddr) -> Duration {
    // Built before the clock starts: only the exchange is measured.
    let req = tool_call(addr);
    let start = Instant::now();
    sender.ready().await.expect("connection ready");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let elapsed = start.elapsed();
    assert_eq!(body.as_ref(), TOOL_RESULT);
    elapsed
}

/// `n` sequential tool calls on `conn`; their latencies.
async fn calls(conn: &mut SendRequest<Full<Bytes>>, addr: SocketAddr, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        latencies.push(call(conn, addr).await);
    }
    latencies
}

/// What the concurrent phase measured.
#[derive(Default)]
struct Load {
    /// Requests sent.
    requests: usize,
    /// Wall time from the first request to the last answer, summed over rounds.
    wall: Duration,
    /// Every request's latency.
    latencies: Vec<Duration>,
}

impl Load {
    /// Adds another round.
    fn add(&mut self, round: Load) {
        self.requests += round.requests;
        self.wall += round.wall;
        self.latencies.extend(round.latencies);
    }
}

/// `total` tool calls over `conns` connections, each keeping one request in flight.
async fn concurrent(addr: SocketAddr, conns: usize, total: usize) -> Load {
    // Connections are opened before the clock starts: the bench is about requests, not handshakes.
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(addr).await);
    }
    // A shared counter rather than a fixed share per connection, so a slow connection cannot
    // leave the others idle at the end.
    let claimed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut clients = JoinSet::new();
    for mut sender in senders {
        let claimed = claimed.clone();
        clients.spawn(async move {
            let mut latencies = Vec::new();
            while claimed.fetch_add(1, Ordering::Relaxed) < total {
                latencies.push(call(&mut sender, addr).await);
            }
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(total);
    while let Some(done) = clients.join_next().await {
        latencies.extend(done.expect("client task"));
    }
    let wall = start.elapsed();
    Load {
        requests: total,
        wall,
        latencies,
    }
}

/// Streams one SSE response of `events` events on `conn`; returns the time from send to the last
/// byte.
async fn sse(conn: &mut SendRequest<Full<Bytes>>, addr: SocketAddr, events: usize) -> Duration {
    let expected: usize = (0..events).map(|i| sse_event(i).len()).sum();
    let req = Request::get("/mcp")
        .header(HOST, addr.to_string())
        .header(ACCEPT, "text/event-stream")
        .header("mcp-session-id", SESSION_ID)
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let start = Instant::now();
    conn.ready().await.expect("connection ready");
    let resp = conn.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    // Frame by frame, as an SSE client reads: never collected into one buffer.
    let mut body = resp.into_body();
    let mut received = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("SSE frame").into_data() {
            received += data.len();
        }
    }
    let whole = start.elapsed();
    assert_eq!(received, expected, "every event arrived");
    whole
}

/// Reads one paced stream of `events` events on `conn`; each event's latency, from the
/// upstream's write to the moment the client has parsed it. Fails unless every event arrives
/// exactly once, whole, and in order.
async fn paced(
    conn: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    events: usize,
) -> Vec<Duration> {
    let req = Request::get(format!("/mcp?paced={events}"))
        .header(HOST, addr.to_string())
        .header(ACCEPT, "text/event-stream")
        .header("mcp-session-id", SESSION_ID)
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    conn.ready().await.expect("connection ready");
    let resp = conn.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut pending = Vec::new();
    let mut latencies = Vec::with_capacity(events);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("SSE frame").into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        // Complete events only: one split across frames waits for its end.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let now = epoch().elapsed();
            let event = std::str::from_utf8(&pending[..end]).expect("UTF-8 event");
            let number = |key: &str| -> u128 {
                let at = event.find(key).expect("the field") + key.len();
                let digits = event[at..].split(|c: char| !c.is_ascii_digit()).next();
                digits.and_then(|d| d.parse().ok()).expect("a number")
            };
            assert!(
                event.starts_with("event: message\ndata: {"),
                "an event whole, not merged with another: {event:?}"
            );
            assert_eq!(
                number("\"progress\":"),
                latencies.len() as u128,
                "in order, none lost"
            );
            let sent = Duration::from_nanos(number("\"sent\":") as u64);
            latencies.push(now.saturating_sub(sent));
            pending.drain(..end + 2);
        }
    }
    assert!(pending.is_empty(), "a cut event at the end: {pending:?}");
    assert_eq!(latencies.len(), events, "every event arrived");
    latencies
}

// --- Statistics and formatting -----------------------------------------------------------------

/// Nearest-rank percentile `p` (0..=100) of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A row comparing two times; the overhead is the difference, absolute and relative.
fn latency_row(case: String, direct: Duration, via: Duration) -> [String; 4] {
    let added = via.as_secs_f64() - direct.as_secs_f64();
    [
        case,
        fmt_time(direct.as_secs_f64()),
        fmt_time(via.as_secs_f64()),
        format!(
            "{}{} ({} %)",
            sign(added),
            fmt_time(added.abs()),
            fmt_signed(added / direct.as_secs_f64() * 100.0)
        ),
    ]
}

/// A row comparing throughput. The overhead is shown as CPU-bound time added per request
/// (the difference of the inverse throughputs) and as the relative loss of requests per second.
fn throughput_row(case: String, direct: &Load, via: &Load) -> [String; 4] {
    let rate = |l: &Load| l.requests as f64 / l.wall.as_secs_f64();
    let (d, v) = (rate(direct), rate(via));
    let added = 1.0 / v - 1.0 / d;
    [
        case,
        format!("{d:.0} req/s"),
        format!("{v:.0} req/s"),
        format!(
            "{}{}/req ({} % req/s)",
            sign(added),
            fmt_time(added.abs()),
            fmt_signed((v / d - 1.0) * 100.0)
        ),
    ]
}

/// Seconds as µs below a millisecond, ms above.
fn fmt_time(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.1} µs", secs * 1e6)
    } else {
        format!("{:.2} ms", secs * 1e3)
    }
}

/// `+` or a typographic minus, matching how the table writes negative numbers.
fn sign(x: f64) -> &'static str {
    if x < 0.0 {
        "−"
    } else {
        "+"
    }
}

/// A whole number with its sign.
fn fmt_signed(x: f64) -> String {
    format!("{}{:.0}", sign(x), x.abs())
}
