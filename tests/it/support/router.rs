//! A router between holdfast and an MCP server, as Traefik is in front of a container, that can
//! lose its route: it then answers Traefik's route-missing 404 by itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Traefik's answer when no router matches (Go's `http.NotFound`), byte for byte.
pub const TRAEFIK_404: &[u8] = b"404 page not found\n";

/// One request as the fake router saw it.
#[derive(Clone, Debug)]
pub struct Routed {
    /// Request method.
    pub method: Method,
    /// Request path (without the query).
    pub path: String,
    /// `Mcp-Session-Id`.
    pub session: Option<String>,
    /// `Last-Event-ID`.
    pub last_event_id: Option<String>,
    /// The request body.
    pub body: Bytes,
    /// Answered with Traefik's 404 instead of forwarded.
    pub answered_404: bool,
    /// Why the request body broke off (then it was not forwarded, and `body` is empty).
    pub body_error: Option<String>,
    /// The backend's status, once its answer's head arrived (none for what the router answered
    /// itself).
    pub status: Option<StatusCode>,
}

impl Routed {
    /// What identifies one request: a replay is equal to the original in all of this.
    pub fn key(&self) -> (Method, Option<String>, Option<String>, Bytes) {
        (
            self.method.clone(),
            self.session.clone(),
            self.last_event_id.clone(),
            self.body.clone(),
        )
    }

    /// The JSON-RPC method of the body.
    pub fn rpc_method(&self) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json.get("method")?.as_str().map(str::to_owned)
    }
}

type RouterBody = BoxBody<Bytes, hyper::Error>;

/// A router between holdfast and the MCP server, as Traefik is in front of a container: it
/// forwards every request (streaming the response, SSE included), except while `missing` is on,
/// when it answers Traefik's route-missing 404 itself, as Traefik does while the container's
/// router is gone.
pub struct FakeRouter {
    /// Where it listens.
    pub addr: SocketAddr,
    /// While true, every request gets Traefik's 404 instead of being forwarded.
    pub missing: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Routed>>>,
    /// The accept loop; aborting it drops every connection.
    _tasks: JoinSet<()>,
}

impl FakeRouter {
    /// Routes every request to `backend`.
    pub async fn start(backend: SocketAddr) -> FakeRouter {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let missing = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let client: HyperClient<_, Full<Bytes>> =
            HyperClient::builder(TokioExecutor::new()).build_http();
        let mut tasks = JoinSet::new();
        let (missing2, log2) = (missing.clone(), log.clone());
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (missing, log, client) = (missing2.clone(), log2.clone(), client.clone());
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        route(req, backend, missing.clone(), log.clone(), client.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeRouter {
            addr,
            missing,
            log,
            _tasks: tasks,
        }
    }

    /// Every request seen, in order: fails the test if a request's body broke off, which a
    /// log with an empty body in its place would hide.
    pub fn log(&self) -> Vec<Routed> {
        let log = self.log.lock().unwrap().clone();
        let broken: Vec<_> = log.iter().filter(|r| r.body_error.is_some()).collect();
        assert!(
            broken.is_empty(),
            "the router saw request bodies break off: {broken:#?}"
        );
        log
    }
}

async fn route(
    req: Request<Incoming>,
    backend: SocketAddr,
    missing: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Routed>>>,
    client: HyperClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
) -> Result<Response<RouterBody>, Infallible> {
    let (mut parts, body) = req.into_parts();
    // Request bodies here are small JSON-RPC messages: read whole, so the log can show them.
    let (body, body_error) = match body.collect().await {
        Ok(collected) => (collected.to_bytes(), None),
        Err(e) => (Bytes::new(), Some(e.to_string())),
    };
    let header =
        |h: &HeaderMap, name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let answered_404 = missing.load(Ordering::SeqCst);
    let entry = {
        let mut entries = log.lock().unwrap();
        entries.push(Routed {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            session: header(&parts.headers, "mcp-session-id"),
            last_event_id: header(&parts.headers, "last-event-id"),
            body: body.clone(),
            answered_404,
            body_error: body_error.clone(),
            status: None,
        });
        entries.len() - 1
    };
    if body_error.is_some() {
        // Not forwarded: a router would not send a cut request on either.
        let resp = Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(
                Full::new(Bytes::from_static(b"broken request body"))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap();
        return Ok(resp);
    }
    if answered_404 {
        let resp = Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "text/plain; charset=utf-8")
            .header("x-content-type-options", "nosniff")
            .body(
                Full::new(Bytes::from_static(TRAEFIK_404))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap();
        return Ok(resp);
    }
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = format!("http://{backend}{pq}").parse().unwrap();
    // The body is re-framed from its length.
    parts.headers.remove("transfer-encoding");
    parts.headers.remove("content-length");
    match client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        // Streamed straight back, frame by frame: SSE stays live.
        Ok(resp) => {
            log.lock().unwrap()[entry].status = Some(resp.status());
            Ok(resp.map(BodyExt::boxed))
        }
        Err(_) => Ok(Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(
                Full::new(Bytes::from_static(b"Bad Gateway"))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()),
    }
}
