//! How fast held requests are released once the backend is back, and what holding costs in memory.
//!
//! `cargo bench --bench release` runs, in one process, holdfast in front of an upstream port that
//! refuses connections (a socket bound but not listening), sends N MCP tool calls (each on its own
//! connection, as N separate clients would), waits until holdfast holds all N, then starts
//! listening on the port and times:
//!
//! - **detection**: from the port listening again to the first answer (the prober's TCP connect
//!   plus the oldest held request sent as the probe; bounded by one backoff delay, ≤ 250 ms);
//! - **release**: from that first answer (it closes the outage) to the last held request's answer
//!   (the "all held requests complete within 50 ms" target);
//! - **memory**: the growth of the process's resident set while the N requests are held, per
//!   request (client, holdfast and their sockets share the process, so this is an upper bound).
//!
//! For N in 1, 100 and 1000 (`HOLDFAST_BENCH_HELD` overrides, comma-separated). Without `--bench`
//! (as `cargo test --all-targets` runs it), a single small round serves as a smoke test.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use holdfast::config::{Config, RawConfig};

const TOOL_CALL: &[u8] =
    br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{}}}"#;
const TOOL_RESULT: &[u8] =
    br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"1"}]}}"#;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("HOLDFAST_BENCH_HELD") {
        Ok(v) => v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) if bench => vec![1, 100, 1000],
        Err(_) => vec![10],
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("| held requests | detection (listen → first answer) | release (first → last answer) | RSS while held | per held request |");
    println!("|---:|---:|---:|---:|---:|");
    for n in sizes {
        let r = runtime.block_on(round(n));
        println!(
            "| {n} | {:.1} ms | {:.1} ms | {:.1} MiB | {:.1} KiB |",
            r.detection.as_secs_f64() * 1e3,
            r.release.as_secs_f64() * 1e3,
            r.rss_growth as f64 / (1024.0 * 1024.0),
            r.rss_growth as f64 / 1024.0 / n as f64,
        );
    }
}

struct RoundResult {
    detection: Duration,
    release: Duration,
    rss_growth: u64,
}

async fn round(n: usize) -> RoundResult {
    // The upstream's port: bound (reserved) but not listening, so connections are refused.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let upstream = socket.local_addr().unwrap();

    let mut raw = RawConfig {
        upstream: format!("http://{upstream}"),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    raw.hold.timeout_secs = 120.0;
    let config = Config::from_raw(&raw, &|_| "bench".into()).expect("config");
    let server = holdfast::server::spawn(config)
        .await
        .expect("holdfast starts");
    let (proxy, admin_addr) = (server.addr, server.admin);

    let rss_before = rss_bytes();
    let answered = Arc::new(AtomicUsize::new(0));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let mut clients = JoinSet::new();
    for _ in 0..n {
        let answered = answered.clone();
        let done = done_tx.clone();
        clients.spawn(async move {
            let status = call(proxy).await;
            assert_eq!(status, 200, "a held call must end in the upstream's answer");
            answered.fetch_add(1, Ordering::Relaxed);
            let _ = done.send(Instant::now());
        });
    }
    drop(done_tx);
    // Wait until holdfast holds every request (what the admin port reports).
    let deadline = Instant::now() + Duration::from_secs(60);
    while held(admin_addr).await < n as f64 {
        assert!(Instant::now() < deadline, "not all requests were held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rss_growth = rss_bytes().saturating_sub(rss_before);

    // The backend is back.
    let back = Instant::now();
    let listener = socket.listen(4096).unwrap();
    let upstream_task = tokio::spawn(serve(listener));
    let mut first = None;
    let mut last = back;
    while let Some(at) = done_rx.recv().await {
        first.get_or_insert(at);
        last = at;
    }
    while clients.join_next().await.is_some() {}
    assert_eq!(answered.load(Ordering::Relaxed), n);
    let first = first.expect("at least one answer");

    server.shutdown().await.expect("holdfast run");
    upstream_task.abort();
    RoundResult {
        detection: first - back,
        release: last - first,
        rss_growth,
    }
}

/// One POST through holdfast on its own connection; the status.
async fn call(proxy: SocketAddr) -> u16 {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("/mcp")
        .header("host", proxy.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(Bytes::from_static(TOOL_CALL)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// The upstream: answers every tool call at once.
async fn serve(listener: tokio::net::TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let svc = service_fn(|req: Request<Incoming>| async move {
                let _ = req.into_body().collect().await;
                let mut resp = Response::new(Full::new(Bytes::from_static(TOOL_RESULT)));
                resp.headers_mut()
                    .insert("content-type", "application/json".parse().unwrap());
                Ok::<_, std::convert::Infallible>(resp)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// `holdfast_held_requests` from the admin port.
async fn held(admin: SocketAddr) -> f64 {
    let Ok(stream) = TcpStream::connect(admin).await else {
        return 0.0;
    };
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return 0.0;
    };
    tokio::spawn(conn);
    let req = Request::get("/metrics")
        .header("host", admin.to_string())
        .body(Full::<Bytes>::default())
        .unwrap();
    let Ok(resp) = sender.send_request(req).await else {
        return 0.0;
    };
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_held_requests "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Resident set size of this process, from /proc (0 where unavailable).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
