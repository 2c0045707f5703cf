//! `holdfast demo`: shows in a few seconds what holdfast does, with nothing to set up.
//!
//! One process runs:
//! - an embedded MCP-speaking backend (JSON responses, sessions, a `count` tool) behind an
//!   embedded "router" that, like Traefik during a container recreation, first answers its exact
//!   `404 page not found` and then refuses connections altogether, before the backend comes back
//!   with its sessions gone;
//! - holdfast in front of it, with its default configuration;
//! - two small MCP clients calling the tool in a loop, one straight to the backend and one
//!   through holdfast. Both behave like the official TypeScript SDK client, the one most desktop
//!   tools use: they open one session and never re-initialize, so a 404 fails the call.
//!
//! A line per second shows each path's successful and failed calls and holdfast's interceptions,
//! holds and re-established sessions (read from its own `/metrics`), and a summary closes the
//! run: straight to the backend every call after the first restart fails; through holdfast the
//! one session lives through every restart.
//!
//! A phase ([`planned`]) shows a planned recreation with `holdfast pause`: a slow call in
//! flight completes, the calls made while the backend is recreated wait, and each runs once.
//! The last ([`replaced`]) replaces holdfast together with its backend, as a rollout replaces a
//! pod: a call held at the leaving pod goes to its peer, and the client's session lives on
//! through a holdfast that never saw it.

mod planned;
pub mod replaced;
mod summary;

pub use planned::{Planned, DURING};
pub use replaced::Replaced;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{Config, RawConfig};

/// How long a demo runs and how often the backend is recreated.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// Total run time.
    pub duration: Duration,
    /// One recreation cycle: half up, a quarter route-missing 404, a quarter refused.
    pub period: Duration,
}

/// What the run saw, for the summary (and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Successful calls straight to the backend.
    pub direct_ok: u64,
    /// Failed calls straight to the backend.
    pub direct_failed: u64,
    /// Successful calls through holdfast.
    pub holdfast_ok: u64,
    /// Failed calls through holdfast.
    pub holdfast_failed: u64,
    /// Tool calls the backend executed.
    pub executed: u64,
    /// Sessions the client through holdfast opened (one: it never re-initializes).
    pub holdfast_sessions: u64,
    /// Times holdfast re-established that session after a restart.
    pub resumed: u64,
    /// Times the backend was recreated.
    pub restarts: u64,
    /// The planned recreation with `holdfast pause`.
    pub planned: planned::Planned,
    /// The pod replacement.
    pub replaced: replaced::Replaced,
}

/// The backend's phase in its recreation cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Up = 0,
    RouteMissing = 1,
    Refused = 2,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Up => "up",
            Phase::RouteMissing => "router 404",
            Phase::Refused => "refused",
        }
    }
}

/// The embedded backend and its router.
struct Backend {
    phase: AtomicU8,
    sessions: Mutex<std::collections::HashSet<String>>,
    next_session: AtomicU64,
    calls: AtomicU64,
}

/// Runs the demo, printing to stdout. Returns the tally.
pub async fn run(opts: DemoOptions) -> std::io::Result<Tally> {
    let (backend, backend_addr, serving) = Backend::start().await?;
    let mut serving = Some(serving);
    let holdfast = start_holdfast(backend_addr).await?;
    let (proxy_addr, admin_addr) = (holdfast.addr, holdfast.admin);
    summary::intro(&opts, backend_addr, proxy_addr);

    let direct = Arc::new(Counts::default());
    let through = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = JoinSet::new();
    for (url, counts) in [(backend_addr, &direct), (proxy_addr, &through)] {
        clients.spawn(client_loop(
            format!("http://{url}/mcp"),
            counts.clone(),
            stop.clone(),
        ));
    }
    let mut restarts = 0;
    let mut cycle = Cycle {
        backend: &backend,
        serving: &mut serving,
        backend_addr,
        admin_addr,
        counts: (&direct, &through),
    };
    restarts += cycle.run(&opts).await?;
    // The run ends with the backend up, and every call the clients started gets its answer:
    // a call cut off here would be executed and counted nowhere.
    if backend
        .switch(Phase::Up, &mut serving, backend_addr)
        .await?
    {
        restarts += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let finish = async { while clients.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(30), finish)
        .await
        .is_err()
    {
        clients.shutdown().await;
    }
    let planned =
        planned::run(&backend, &mut serving, backend_addr, proxy_addr, admin_addr).await?;
    let resumed = scrape(admin_addr).await.resumed as u64;
    holdfast.shutdown().await?;
    let replaced = replaced::run(&backend, &mut serving, backend_addr).await?;
    if let Some(task) = serving.take() {
        task.abort();
    }

    let tally = Tally {
        direct_ok: direct.ok.load(Ordering::Relaxed),
        direct_failed: direct.failed.load(Ordering::Relaxed),
        holdfast_ok: through.ok.load(Ordering::Relaxed),
        holdfast_failed: through.failed.load(Ordering::Relaxed),
        executed: backend.calls.load(Ordering::Relaxed) + replaced.peer_executed,
        holdfast_sessions: through.sessions.load(Ordering::Relaxed),
        resumed,
        restarts: restarts + planned.restarts,
        planned,
        replaced,
    };
    summary::print(&opts, &tally);
    Ok(tally)
}

/// holdfast with its defaults, in front of the backend, which plays a router too (its
/// route-missing phase answers Traefik's 404): said so, since it listens on loopback.
async fn start_holdfast(backend_addr: SocketAddr) -> std::io::Result<crate::server::Spawned> {
    let mut raw = RawConfig {
        upstream: format!("http://{backend_addr}"),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    };
    raw.routes.behind_router = Some(true);
    let config = Config::from_raw(&raw, &|_| "demo".into()).map_err(std::io::Error::other)?;
    crate::server::spawn(config).await
}

/// The unplanned part of the run: the backend goes through its cycle (up, a router's 404,
/// refused) every period while the clients call, and a line of counts is printed every second.
struct Cycle<'a> {
    backend: &'a Arc<Backend>,
    serving: &'a mut Option<tokio::task::JoinHandle<()>>,
    backend_addr: SocketAddr,
    admin_addr: SocketAddr,
    /// Straight to the backend, and through holdfast.
    counts: (&'a Counts, &'a Counts),
}

impl Cycle<'_> {
    /// Runs for `opts.duration`; the number of times the backend was recreated.
    async fn run(&mut self, opts: &DemoOptions) -> std::io::Result<u64> {
        let start = Instant::now();
        let mut next_tick = start + Duration::from_secs(1);
        let mut restarts = 0;
        let half = opts.period / 2;
        let quarter = opts.period / 4;
        loop {
            let now = Instant::now();
            if now >= start + opts.duration {
                return Ok(restarts);
            }
            // Where in its cycle is the backend now?
            let into_cycle = Duration::from_nanos(
                ((now - start).as_nanos() % opts.period.as_nanos().max(1)) as u64,
            );
            let want = if into_cycle < half {
                Phase::Up
            } else if into_cycle < half + quarter {
                Phase::RouteMissing
            } else {
                Phase::Refused
            };
            if self
                .backend
                .switch(want, self.serving, self.backend_addr)
                .await?
            {
                restarts += 1;
            }
            if now >= next_tick {
                let m = scrape(self.admin_addr).await;
                summary::tick(now - start, self.backend.phase(), self.counts, &m);
                next_tick += Duration::from_secs(1);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Backend {
    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Up,
            1 => Phase::RouteMissing,
            _ => Phase::Refused,
        }
    }

    fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    /// Moves the backend to `want`; true when that recreated it (a new container, same address,
    /// no sessions).
    async fn switch(
        self: &Arc<Self>,
        want: Phase,
        serving: &mut Option<tokio::task::JoinHandle<()>>,
        addr: SocketAddr,
    ) -> std::io::Result<bool> {
        if want == self.phase() {
            return Ok(false);
        }
        match want {
            Phase::Refused => {
                // The container is gone: nothing listens on its port.
                self.set_phase(Phase::Refused);
                if let Some(task) = serving.take() {
                    task.abort();
                    let _ = task.await;
                }
                Ok(false)
            }
            Phase::Up => {
                let recreated = serving.is_none();
                if recreated {
                    self.sessions.lock().expect("sessions").clear();
                    *serving = Some(tokio::spawn(serve_backend(rebind(addr)?, self.clone())));
                }
                self.set_phase(Phase::Up);
                Ok(recreated)
            }
            Phase::RouteMissing => {
                self.set_phase(Phase::RouteMissing);
                Ok(false)
            }
        }
    }
}

/// Binds the backend's address again (SO_REUSEADDR: the old sockets may be in TIME_WAIT).
fn rebind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn serve_backend(listener: TcpListener, backend: Arc<Backend>) {
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let backend = backend.clone();
        conns.spawn(async move {
            let svc = service_fn(move |req| {
                let backend = backend.clone();
                async move { Ok::<_, std::convert::Infallible>(backend.answer(req).await) }
            });
            // No keep-alive: a recreated container's old connections are simply gone, and a
            // demo should not depend on a pool racing the shutdown.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

type DemoBody = Full<Bytes>;

fn reply(
    status: StatusCode,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<DemoBody> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    for (k, v) in headers {
        r.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("static header name"),
            http::HeaderValue::from_str(v).expect("static header value"),
        );
    }
    r
}

impl Backend {
    /// A backend serving on a free port of loopback: it, its address, its serving task.
    async fn start() -> std::io::Result<(Arc<Backend>, SocketAddr, tokio::task::JoinHandle<()>)> {
        let backend = Arc::new(Backend {
            phase: AtomicU8::new(Phase::Up as u8),
            sessions: Mutex::new(Default::default()),
            next_session: AtomicU64::new(1),
            calls: AtomicU64::new(0),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let serving = tokio::spawn(serve_backend(listener, backend.clone()));
        Ok((backend, addr, serving))
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<DemoBody> {
        if self.phase() == Phase::RouteMissing {
            // Traefik's exact answer when no router matches (Go's http.NotFound).
            return reply(
                StatusCode::NOT_FOUND,
                &[
                    ("content-type", "text/plain; charset=utf-8"),
                    ("x-content-type-options", "nosniff"),
                ],
                "404 page not found\n",
            );
        }
        let session = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let Ok(body) = req.into_body().collect().await else {
            return reply(StatusCode::BAD_REQUEST, &[], "bad body");
        };
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(&body.to_bytes()) else {
            return reply(StatusCode::BAD_REQUEST, &[], "not JSON-RPC");
        };
        let method = msg["method"].as_str().unwrap_or_default();
        let id = msg["id"].clone();
        let json = [("content-type", "application/json")];
        if method == "initialize" {
            let sid = format!("demo-{}", self.next_session.fetch_add(1, Ordering::Relaxed));
            self.sessions.lock().expect("sessions").insert(sid.clone());
            let result = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "holdfast-demo-backend", "version": "1"}}});
            return reply(
                StatusCode::OK,
                &[
                    ("content-type", "application/json"),
                    ("mcp-session-id", &sid),
                ],
                result.to_string(),
            );
        }
        let known = session
            .as_deref()
            .is_some_and(|s| self.sessions.lock().expect("sessions").contains(s));
        if !known {
            // The MCP server's own 404: this session does not exist (any more).
            let err = serde_json::json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32001, "message": "Session not found"}});
            return reply(StatusCode::NOT_FOUND, &json, err.to_string());
        }
        match method {
            "notifications/initialized" => reply(StatusCode::ACCEPTED, &[], ""),
            "tools/call" => {
                if msg["params"]["name"] == "slow" {
                    // A long tool call: in flight when a planned recreation begins.
                    tokio::time::sleep(planned::SLOW).await;
                }
                let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
                let result = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {
                    "content": [{"type": "text", "text": n.to_string()}]}});
                reply(StatusCode::OK, &json, result.to_string())
            }
            _ => {
                let err = serde_json::json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32601, "message": "Method not found"}});
                reply(StatusCode::OK, &json, err.to_string())
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Sessions opened (initialize answered).
    sessions: AtomicU64,
}

type DemoClient = HyperClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// What one JSON-RPC POST came back as.
enum Posted {
    Ok(Response<Bytes>),
    /// Any other answer (a 404 for a forgotten session included), or none.
    Failed,
}

async fn post(client: &DemoClient, url: &str, session: Option<&str>, body: String) -> Posted {
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .expect("valid request");
    let resp = match tokio::time::timeout(Duration::from_secs(30), client.request(req)).await {
        Ok(Ok(r)) => r,
        _ => return Posted::Failed,
    };
    let (parts, body) = resp.into_parts();
    let Ok(body) = body.collect().await else {
        return Posted::Failed;
    };
    match parts.status {
        s if s.is_success() => Posted::Ok(Response::from_parts(parts, body.to_bytes())),
        _ => Posted::Failed,
    }
}

/// initialize + notifications/initialized; the new session id.
async fn initialize(client: &DemoClient, url: &str) -> Option<String> {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "holdfast-demo-client", "version": "1"}}});
    let Posted::Ok(resp) = post(client, url, None, init.to_string()).await else {
        return None;
    };
    let sid = resp
        .headers()
        .get("mcp-session-id")?
        .to_str()
        .ok()?
        .to_owned();
    let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    match post(client, url, Some(&sid), note.to_string()).await {
        Posted::Ok(_) => Some(sid),
        _ => None,
    }
}

/// Calls `count` in a loop like the official TypeScript SDK client: one session, opened once;
/// a 404 ("session not found") fails the call, and the client carries on with the same session,
/// never re-initializing (measured: `../shared/mcp-notes.md`).
async fn client_loop(url: String, counts: Arc<Counts>, stop: Arc<AtomicBool>) {
    let client: DemoClient = HyperClient::builder(TokioExecutor::new()).build_http();
    let mut session: Option<String> = None;
    let mut id = 1u64;
    while !stop.load(Ordering::Relaxed) {
        if session.is_none() {
            // Only until the first session is open (the backend may be down at the start).
            session = initialize(&client, &url).await;
            if session.is_some() {
                counts.sessions.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut ok = false;
        if session.is_some() {
            id += 1;
            let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "count", "arguments": {}}});
            ok = matches!(
                post(&client, &url, session.as_deref(), call.to_string()).await,
                Posted::Ok(_)
            );
        }
        if ok {
            counts.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Default)]
struct Scraped {
    /// Backend-missing answers kept from the clients (held or answered 503).
    rewrites: f64,
    held: f64,
    released: f64,
    resumed: f64,
    /// Sessions re-established that this holdfast opened from their token.
    reestablished_elsewhere: f64,
}

/// Reads holdfast's own numbers from its admin port.
async fn scrape(admin: SocketAddr) -> Scraped {
    let client: HyperClient<_, Full<Bytes>> =
        HyperClient::builder(TokioExecutor::new()).build_http();
    let Ok(uri) = format!("http://{admin}/metrics").parse::<http::Uri>() else {
        return Scraped::default();
    };
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(1), client.get(uri)).await else {
        return Scraped::default();
    };
    let Ok(body) = resp.into_body().collect().await else {
        return Scraped::default();
    };
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let mut s = Scraped::default();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        if series.starts_with("holdfast_rewrites_total{") {
            s.rewrites += value;
        } else if series == "holdfast_held_requests" {
            s.held = value;
        } else if series == "holdfast_holds_total{outcome=\"released\"}" {
            s.released = value;
        } else if series == "holdfast_session_resumes_total{outcome=\"resumed\"}" {
            s.resumed = value;
        } else if series
            == "holdfast_session_reestablished_total{cause=\"unknown_to_this_replica\"}"
        {
            s.reestablished_elsewhere = value;
        }
    }
    s
}
