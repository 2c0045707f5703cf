//! The rmcp server on a real socket ([`McpServer`]): rmcp's `StreamableHttpService` behind one
//! thin layer that routes only `/mcp`, records every request, and injects answers, deaths and
//! crashes when a test asks.

use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rmcp::transport::streamable_http_server::{
    session::{local::LocalSessionManager, SessionManager},
    StreamableHttpServerConfig, StreamableHttpService,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{oneshot, watch, Semaphore},
    task::{JoinHandle, JoinSet},
};

use super::tools::Tools;
use super::MCP_PATH;
use crate::support::http::Reserved;

/// How the server answers POSTs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// rmcp's default: sessions (`Mcp-Session-Id`), every request answered with an SSE stream
    /// (`text/event-stream`, a priming event first), a standalone GET stream, DELETE accepted.
    #[default]
    Stateful,
    /// rmcp's only JSON mode: `json_response` applies only with `legacy_session_mode` off, so
    /// there are no sessions, requests are answered `application/json`, GET and DELETE get 405.
    StatelessJson,
}

/// Everything that decides how an [`McpServer`] starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where to bind; `127.0.0.1:0` for a fresh port, a known address to restart on.
    pub addr: SocketAddr,
    /// The `count` tool's counter; shared so it survives a stop and restart.
    pub calls: Arc<AtomicU64>,
    /// Session and response mode.
    pub mode: Mode,
    /// Keep rmcp's DNS-rebinding `Host` check (loopback names only, any port) instead of
    /// accepting any `Host`. Off by default because a proxy in front preserves the client's Host.
    pub check_host: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            calls: Arc::new(AtomicU64::new(0)),
            mode: Mode::default(),
            check_host: false,
        }
    }
}

/// One request as the server saw it, recorded when the response head was ready.
#[derive(Clone, Debug)]
pub struct SeenRequest {
    /// HTTP method.
    pub method: Method,
    /// Request path (no query).
    pub path: String,
    /// Request headers as received.
    pub headers: HeaderMap,
    /// The JSON-RPC `method` of a POST body (`initialize`, `tools/call`, ...); `None` for GET,
    /// DELETE and JSON-RPC responses.
    pub rpc_method: Option<String>,
    /// Status the server answered.
    pub status: StatusCode,
    /// `Mcp-Session-Id` the server assigned in its response (an `initialize` in stateful mode).
    pub assigned_session: Option<String>,
    /// Whether the response was injected by [`McpServer::fail_next_posts`] instead of rmcp.
    pub injected: bool,
}

impl SeenRequest {
    /// The `Mcp-Session-Id` the request carried.
    pub fn session_id(&self) -> Option<&str> {
        header_str(&self.headers, "mcp-session-id")
    }

    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        header_str(&self.headers, name)
    }
}

/// Whether `request` is a `tools/call` POST.
pub fn tool_call(request: &SeenRequest) -> bool {
    request.method == Method::POST && request.rpc_method.as_deref() == Some("tools/call")
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// An injected answer for the next POST.
#[derive(Clone, Debug)]
struct Fault {
    status: StatusCode,
    retry_after: Option<HeaderValue>,
}

/// State that outlives one listener: kept across stop and restart.
struct Shared {
    /// The `count` tool's counter.
    calls: Arc<AtomicU64>,
    /// Permits for the `wait` tool: each finished `wait` call took one.
    gate: Arc<Semaphore>,
    /// Every `logging/setLevel` the server accepted, with the session it came on, in order.
    levels: Arc<Mutex<Vec<String>>>,
    /// Every request seen, in completion order; a watch so tests can await a request.
    seen: watch::Sender<Vec<SeenRequest>>,
    /// Answers to inject, one per POST, before rmcp sees the request.
    faults: Mutex<VecDeque<Fault>>,
    /// Every run of `record`, `lookup` and `put`, as `tool:id`, in order, across restarts.
    ledger: Arc<Mutex<Vec<String>>>,
    /// Armed by [`McpServer::die_on_next`]: the next POST whose body contains the text is read
    /// whole, reported, and never answered (the test then stops the server).
    die_on: Mutex<Option<(String, oneshot::Sender<()>)>>,
    /// Armed by [`McpServer::crash_on_next`]: that many of the next POSTs whose body contains
    /// the text are read whole and their connection closed without an answer, the server
    /// staying up (a worker crashing, a process dying while its listener still accepts).
    crash_on: Mutex<Option<(String, usize)>>,
}

/// What a request the server crashes on ends its connection with (hyper closes a connection
/// whose service fails, without an answer).
#[derive(Debug)]
struct Crash;

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpServer crashed on this request, as the test asked")
    }
}

impl std::error::Error for Crash {}

type RmcpService = StreamableHttpService<Tools, LocalSessionManager>;

/// Marks the response of a request the server crashes on: the connection's service turns it
/// into [`Crash`].
#[derive(Clone, Copy)]
struct Crashed;

/// Whether this request body is one the server was told to crash on (and counts it).
fn crashes(shared: &Shared, body: &[u8]) -> bool {
    let mut armed = shared.crash_on.lock().expect("crash_on lock");
    let Some((needle, left)) = armed.as_mut() else {
        return false;
    };
    if *left == 0 || !body.windows(needle.len()).any(|w| w == needle.as_bytes()) {
        return false;
    }
    *left -= 1;
    true
}

/// One listening period: what [`McpServer::stop`] tears down.
struct Running {
    /// The session store rmcp uses; replaced on restart, as a recreated container's would be.
    sessions: Arc<LocalSessionManager>,
    /// rmcp's service, kept to cancel its sessions on stop.
    service: Arc<RmcpService>,
    /// Tells the accept loop to stop.
    stop: oneshot::Sender<()>,
    /// The accept loop; it owns the listener and every connection task.
    accept: JoinHandle<()>,
}

/// An rmcp Streamable HTTP server on a real socket, with tools `count`, `echo` and `wait`, and
/// the ledger tools `record`, `lookup` (announced read-only) and `put` (announced idempotent).
pub struct McpServer {
    /// The address actually bound (the port is fixed after the first start).
    addr: SocketAddr,
    /// How to start again on [`McpServer::restart`].
    options: Options,
    shared: Arc<Shared>,
    running: Option<Running>,
    /// While stopped: the port, bound but not listening (connections are refused), so no other
    /// test takes it before [`McpServer::restart`].
    reserved: Option<Reserved>,
}

impl McpServer {
    /// Starts a stateful server on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// Starts a stateful server on `addr` with a fresh counter.
    pub async fn start_on(addr: SocketAddr) -> Self {
        Self::start_with(Options {
            addr,
            ..Options::default()
        })
        .await
    }

    /// Starts a server as `options` say.
    pub async fn start_with(options: Options) -> Self {
        let shared = Arc::new(Shared {
            calls: options.calls.clone(),
            gate: Arc::new(Semaphore::new(0)),
            levels: Arc::new(Mutex::new(Vec::new())),
            seen: watch::Sender::new(Vec::new()),
            faults: Mutex::new(VecDeque::new()),
            ledger: Arc::new(Mutex::new(Vec::new())),
            die_on: Mutex::new(None),
            crash_on: Mutex::new(None),
        });
        let listener = if options.addr.port() == 0 {
            // A port no other test's connection can take while this server is stopped.
            Reserved::new().listen()
        } else {
            TcpListener::bind(options.addr)
                .await
                .unwrap_or_else(|error| panic!("bind {}: {error}", options.addr))
        };
        let addr = listener.local_addr().expect("local_addr");
        let running = spawn(listener, &options, &shared);
        Self {
            addr,
            options: Options { addr, ..options },
            shared,
            running: Some(running),
            reserved: None,
        }
    }

    /// Starts again on the same address after [`McpServer::stop`], with the same counter, mode
    /// and request log but no sessions, like a recreated container.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = self
            .reserved
            .take()
            .expect("stop reserves the port")
            .listen();
        self.running = Some(spawn(listener, &self.options, &self.shared));
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.addr)
    }

    /// How many times `count` has run, across restarts.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::SeqCst)
    }

    /// Options that start an equal server on the same address, sharing the counter.
    pub fn options(&self) -> Options {
        self.options.clone()
    }

    /// How many sessions rmcp holds now (0 when stopped).
    pub async fn session_count(&self) -> usize {
        match &self.running {
            Some(running) => running.sessions.sessions.read().await.len(),
            None => 0,
        }
    }

    /// Forgets every session, so a request with an old `Mcp-Session-Id` gets rmcp's own 404.
    /// Returns once the sessions are gone from rmcp's store.
    pub async fn clear_sessions(&self) {
        let Some(running) = &self.running else {
            return;
        };
        let ids: Vec<_> = running
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .cloned()
            .collect();
        for id in ids {
            // Removes the session from the map, then tells its worker to close.
            let _ = running.sessions.close_session(&id).await;
        }
    }

    /// Answers the next `count` POSTs with `status` (and `Retry-After` if given) and a short
    /// text body, without passing them to rmcp: the tool does not run. GET and DELETE are not
    /// affected, so the client's background GET stream cannot use up the injection.
    pub fn fail_next_posts(&self, count: usize, status: StatusCode, retry_after: Option<&str>) {
        let retry_after = retry_after.map(|value| HeaderValue::from_str(value).expect("header"));
        let mut faults = self.shared.faults.lock().expect("faults lock");
        faults.extend((0..count).map(|_| Fault {
            status,
            retry_after: retry_after.clone(),
        }));
    }

    /// Every run of `record`, `lookup` and `put` (`tool:id`), across restarts, in order.
    pub fn ledger(&self) -> Vec<String> {
        self.shared.ledger.lock().expect("ledger lock").clone()
    }

    /// The next POST whose body contains `needle` is read whole and then never answered, as if
    /// the process died the instant it read it; the receiver hears when that happened (then the
    /// test stops the server, which closes the connection).
    pub fn die_on_next(&self, needle: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        *self.shared.die_on.lock().expect("die_on lock") = Some((needle.to_owned(), tx));
        rx
    }

    /// The next `n` POSTs whose body contains `needle` are read whole, then their connection
    /// closes without an answer; the server stays up and answers everything else.
    pub fn crash_on_next(&self, needle: &str, n: usize) {
        *self.shared.crash_on.lock().expect("crash_on lock") = Some((needle.to_owned(), n));
    }

    /// Runs of each `tool:id` in the ledger, across restarts.
    pub fn runs(&self) -> std::collections::HashMap<String, usize> {
        let mut runs = std::collections::HashMap::new();
        for entry in self.ledger() {
            *runs.entry(entry).or_default() += 1;
        }
        runs
    }

    /// Lets `count` pending and future `wait` calls return.
    pub fn release_waits(&self, count: usize) {
        self.shared.gate.add_permits(count);
    }

    /// Every `logging/setLevel` level the server accepted, across restarts, in order.
    pub fn levels(&self) -> Vec<String> {
        self.shared.levels.lock().expect("levels lock").clone()
    }

    /// Every request seen so far, in the order the responses were ready.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.shared.seen.borrow().clone()
    }

    /// Waits until a request matching `matches` has been seen, and returns the first such.
    pub async fn wait_for_request(&self, matches: impl Fn(&SeenRequest) -> bool) -> SeenRequest {
        let mut seen = self.shared.seen.subscribe();
        let log = seen
            .wait_for(|log| log.iter().any(&matches))
            .await
            .expect("the sender lives in self");
        log.iter()
            .find(|request| matches(request))
            .cloned()
            .expect("matched")
    }

    /// Closes the listener and every open connection (their tasks are aborted mid-response, as
    /// when a container dies), then ends rmcp's sessions. Returns once the listening socket is
    /// closed, so a connect is refused; the port stays reserved for [`McpServer::restart`].
    pub async fn stop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        let _ = running.stop.send(());
        running.accept.await.expect("accept loop panicked");
        // Only now, with every connection gone, let rmcp end its sessions: cancelling first would
        // close the SSE streams cleanly, which is not what a dying container does.
        running.service.config.cancellation_token.cancel();
        self.reserved = Some(Reserved::again(self.addr));
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            // Aborting the accept loop drops its JoinSet, which aborts every connection.
            running.accept.abort();
            running.service.config.cancellation_token.cancel();
        }
    }
}

fn spawn(listener: TcpListener, options: &Options, shared: &Arc<Shared>) -> Running {
    let sessions = Arc::new(LocalSessionManager::default());
    let mut config = StreamableHttpServerConfig::default();
    config = match options.mode {
        Mode::Stateful => config,
        Mode::StatelessJson => config
            .with_legacy_session_mode(false)
            .with_json_response(true),
    };
    if !options.check_host {
        // rmcp checks Host against `StreamableHttpServerConfig::allowed_hosts` (DNS-rebinding
        // protection), default ["localhost", "127.0.0.1", "::1"], any port, and answers 403
        // "Forbidden: Host header is not allowed" otherwise. `disable_allowed_hosts()` empties
        // the list, which rmcp reads as "allow any Host". Origin checks are off by default.
        config = config.disable_allowed_hosts();
    }
    let (calls, gate, levels, ledger) = (
        shared.calls.clone(),
        shared.gate.clone(),
        shared.levels.clone(),
        shared.ledger.clone(),
    );
    let service = Arc::new(StreamableHttpService::new(
        move || {
            Ok(Tools::new(
                calls.clone(),
                gate.clone(),
                levels.clone(),
                ledger.clone(),
            ))
        },
        sessions.clone(),
        config,
    ));
    let (stop, stopped) = oneshot::channel();
    let accept = tokio::spawn(accept_loop(
        listener,
        service.clone(),
        shared.clone(),
        stopped,
    ));
    Running {
        sessions,
        service,
        stop,
        accept,
    }
}

/// Accepts until told to stop, then drops the listener and aborts and awaits every connection.
async fn accept_loop(
    listener: TcpListener,
    service: Arc<RmcpService>,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, service.clone(), shared.clone()));
                }
                Err(error) => eprintln!("McpServer accept: {error}"),
            },
            // Reap finished connections so the set does not grow over a long test.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, service: Arc<RmcpService>, shared: Arc<Shared>) {
    let handler = service_fn(move |request: Request<Incoming>| {
        let service = service.clone();
        let shared = shared.clone();
        async move {
            let response = respond(&service, &shared, request).await;
            if response.extensions().get::<Crashed>().is_some() {
                return Err(Crash);
            }
            Ok(response)
        }
    });
    // HTTP/1.1 and h2c, as a real backend would offer.
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), handler)
        .await;
}

type Body = BoxBody<Bytes, Infallible>;

async fn respond(
    service: &RmcpService,
    shared: &Shared,
    request: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    // Buffered only to record the JSON-RPC method; a test server can afford it.
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return plain(StatusCode::BAD_REQUEST, "unreadable request body"),
    };
    let rpc_method = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value.get("method")?.as_str().map(str::to_owned));
    let mut seen = SeenRequest {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        rpc_method,
        status: StatusCode::OK,
        assigned_session: None,
        injected: false,
    };

    let dies = (parts.method == Method::POST)
        .then(|| {
            let mut armed = shared.die_on.lock().expect("die_on lock");
            let hit = armed.as_ref().is_some_and(|(needle, _)| {
                body.windows(needle.len()).any(|w| w == needle.as_bytes())
            });
            hit.then(|| armed.take()).flatten()
        })
        .flatten();
    if parts.method == Method::POST && crashes(shared, &body) {
        let mut response = plain(StatusCode::INTERNAL_SERVER_ERROR, "never sent");
        response.extensions_mut().insert(Crashed);
        return response;
    }
    if let Some((_, told)) = dies {
        let _ = told.send(());
        // Read, never run, never answered: the test stops the server under this request.
        return std::future::pending().await;
    }
    let fault = (parts.method == Method::POST)
        .then(|| shared.faults.lock().expect("faults lock").pop_front())
        .flatten();
    let response = if let Some(fault) = fault {
        seen.injected = true;
        let mut response = plain(fault.status, "injected by McpServer\n");
        if let Some(retry_after) = fault.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, retry_after);
        }
        response
    } else if parts.uri.path() != MCP_PATH {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()).boxed())
            .expect("static response")
    } else {
        service
            .handle(Request::from_parts(parts, Full::new(body)))
            .await
    };

    seen.status = response.status();
    seen.assigned_session = header_str(response.headers(), "mcp-session-id").map(str::to_owned);
    shared.seen.send_modify(|log| log.push(seen));
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(text.as_bytes())).boxed())
        .expect("static response")
}
