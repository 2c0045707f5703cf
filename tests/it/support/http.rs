//! Plain HTTP peers: a scriptable upstream and a small client that keeps responses streaming.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Error type of the test upstream's bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body type of the test upstream's responses.
pub type TestBody = BoxBody<Bytes, BoxError>;

/// The headers of Traefik's route-missing 404 (Go's `http.NotFound`); its body is
/// [`super::router::TRAEFIK_404`].
pub const TRAEFIK_404_HEADERS: &[(&str, &str)] = &[
    ("content-type", "text/plain; charset=utf-8"),
    ("x-content-type-options", "nosniff"),
];

/// Traefik's answer for a route it does not have (Go's `http.NotFound`): what a router says
/// while the application behind it is gone.
pub fn traefik_404() -> Response<TestBody> {
    response(404, TRAEFIK_404_HEADERS, super::router::TRAEFIK_404)
}

/// The application of most tests: answers 200 with the request body, as JSON.
pub async fn echo(seen: Seen) -> Response<TestBody> {
    response(200, &[("content-type", "application/json")], seen.body)
}

/// A fixed body.
pub fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// A response with status, headers and body.
pub fn response(
    status: u16,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<TestBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        r.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_str(v).unwrap(),
        );
    }
    r
}

/// A response body the test feeds frame by frame through a channel: each `Ok` frame is sent as
/// it is pushed, an `Err` makes the upstream abort the response, and dropping the sender ends it
/// cleanly.
pub struct ChannelBody(pub mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx)
    }
}

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: http::Method,
    /// Path and query.
    pub uri: String,
    /// Version on the upstream connection.
    pub version: Version,
    /// Headers.
    pub headers: HeaderMap,
    /// Body: what arrived of it.
    pub body: Bytes,
    /// Why the body broke off before its end, if it did: [`Upstream::seen`] fails the test on
    /// it, so a broken body never passes as a short (or empty) one.
    pub body_error: Option<String>,
}

impl Seen {
    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// An HTTP/1.1 upstream on 127.0.0.1:0 answering with a closure.
pub struct Upstream {
    /// Address.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: JoinSet<()>,
    /// Tells the accept loop to stop ([`Upstream::stop`]).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Upstream {
    /// Serves `handler` for every request; the request body is read completely first.
    pub async fn start<F, Fut>(handler: F) -> Upstream
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Upstream::serve(listener, handler)
    }

    /// Serves on an existing listener (to come back on the same port).
    pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> Upstream
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler = Arc::new(handler);
        let mut tasks = JoinSet::new();
        let seen2 = seen.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let accepted = tokio::select! {
                    _ = &mut stopped => break,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else {
                    continue;
                };
                let handler = handler.clone();
                let seen = seen2.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        let seen = seen.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let (body, body_error) = read_body(body).await;
                            let s = Seen {
                                method: parts.method,
                                uri: parts.uri.to_string(),
                                version: parts.version,
                                headers: parts.headers,
                                body,
                                body_error,
                            };
                            seen.lock().unwrap().push(s.clone());
                            Ok::<_, Infallible>(handler(s).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            // As a stopped container: the port closes, then every connection, before `stop`
            // returns. Aborting the connections without waiting would leave them open until
            // the runtime gets to them, and a request sent meanwhile would be read and then
            // cut: no missing backend, but a server dying mid-request.
            drop(listener);
            conns.shutdown().await;
        });
        Upstream {
            addr,
            seen,
            tasks,
            stop: Some(stop),
        }
    }

    /// A router whose route to the application is gone: every request gets [`traefik_404`].
    pub async fn route_missing() -> Upstream {
        Upstream::start(|_| async { traefik_404() }).await
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests seen so far, each with its whole body: fails the test if a request's body broke
    /// off ([`Upstream::seen_even_broken`] is for the tests where that is the subject).
    pub fn seen(&self) -> Vec<Seen> {
        let seen = self.seen_even_broken();
        let broken: Vec<_> = seen.iter().filter(|s| s.body_error.is_some()).collect();
        assert!(
            broken.is_empty(),
            "the upstream saw request bodies break off: {broken:#?}"
        );
        seen
    }

    /// Requests seen so far, those whose body broke off included.
    pub fn seen_even_broken(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` requests have been seen, broken ones included: for a request
    /// whose end the upstream sees on its own time (a body that breaks off after the client
    /// already has its answer).
    pub async fn until_seen(&self, n: usize) -> Vec<Seen> {
        super::within(async {
            loop {
                let seen = self.seen_even_broken();
                if seen.len() >= n {
                    return seen;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
    }

    /// Stops listening and closes every connection; returns once the port and every
    /// connection are closed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Reads a request body to its end: what arrived, and the error that cut it short, if any.
async fn read_body(mut body: Incoming) -> (Bytes, Option<String>) {
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    read.extend_from_slice(data);
                }
            }
            Err(e) => return (read.into(), Some(e.to_string())),
        }
    }
    (read.into(), None)
}

/// A complete response as the client saw it.
#[derive(Debug)]
pub struct Got {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Got {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The body as text.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

/// Sends one request over a fresh HTTP/1.1 connection and returns the streaming response.
pub async fn send(mut req: Request<Full<Bytes>>) -> Response<Incoming> {
    let authority = req.uri().authority().unwrap().to_string();
    // Origin-form, as clients write it to an origin server (hyper's connection-level client
    // writes the URI as it is given, and holdfast refuses an absolute-form target whose host
    // is not the Host header's).
    *req.uri_mut() = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .parse()
        .unwrap();
    let stream = TcpStream::connect(authority).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

/// Sends one request over a fresh HTTP/2 prior-knowledge (h2c) connection.
pub async fn send_h2(req: Request<Full<Bytes>>) -> Response<Incoming> {
    let authority = req.uri().authority().unwrap().to_string();
    let stream = TcpStream::connect(authority).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

/// Sends and reads the whole body.
pub async fn call(req: Request<Full<Bytes>>) -> Got {
    collect(send(req).await).await
}

/// Reads a response completely.
pub async fn collect(resp: Response<Incoming>) -> Got {
    let (parts, body) = resp.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// GET `url`.
pub async fn get(url: &str) -> Got {
    call(
        Request::get(url)
            .header("host", host_of(url))
            .body(Full::default())
            .unwrap(),
    )
    .await
}

/// What Prometheus sends as `Accept` when it scrapes.
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// GET a `/metrics` at `url` as Prometheus scrapes it: OpenMetrics text, which the tests' readers
/// of metrics parse (without the `Accept`, holdfast answers the 0.0.4 text).
pub async fn get_metrics(url: &str) -> Got {
    call(
        Request::get(url)
            .header("host", host_of(url))
            .header("accept", PROMETHEUS_ACCEPT)
            .body(Full::default())
            .unwrap(),
    )
    .await
}

/// POST a JSON-RPC body to `url` as an MCP client would.
pub async fn post_json(url: &str, body: &str) -> Got {
    call(
        Request::post(url)
            .header("host", host_of(url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

/// Writes a POST to `/mcp` over a raw connection: its head (with the whole body's length) and
/// the first `send` bytes of `body`, the rest left for the test to send or withhold.
pub async fn raw_post(addr: SocketAddr, body: &str, send: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body.as_bytes()[..send]).await.unwrap();
    s
}

/// Reads a raw connection until a response head is complete, or the peer closes: what arrived
/// (so an empty string is a connection closed without an answer).
pub async fn read_head(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `host:port` of a URL.
pub fn host_of(url: &str) -> String {
    url.parse::<http::Uri>()
        .unwrap()
        .authority()
        .unwrap()
        .to_string()
}

/// A port where nothing listens yet (connections are refused) and that stays ours: a socket
/// bound on 127.0.0.1 that does not listen, so no other test can take the port meanwhile.
/// [`Reserved::listen`] is the upstream coming back on it.
pub struct Reserved {
    socket: TcpSocket,
    /// The reserved address.
    pub addr: SocketAddr,
}

impl Reserved {
    /// A fresh port, outside the ephemeral range ([`super::ports`]): once the server on it
    /// stops, no connection another test opens can take it before [`Reserved::again`].
    pub fn new() -> Reserved {
        super::ports::quiet_with(|addr| {
            let socket = TcpSocket::new_v4().unwrap();
            // So that `again` can bind the port after this listener's server-side connections
            // went to TIME_WAIT: Linux lets a bind pass them only when both sockets set it. It
            // never lets two listeners share the port.
            socket.set_reuseaddr(true).unwrap();
            socket.bind(addr).ok()?;
            Some(Reserved { socket, addr })
        })
    }

    /// `addr` again, once the server that listened there has stopped (its socket must have had
    /// `SO_REUSEADDR` too).
    pub fn again(addr: SocketAddr) -> Reserved {
        let socket = TcpSocket::new_v4().unwrap();
        // The port's previous connections may linger in TIME_WAIT.
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(addr)
            .unwrap_or_else(|e| panic!("rebind {addr} for the restart: {e}"));
        Reserved { socket, addr }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The upstream comes back on the reserved port.
    pub fn listen(self) -> TcpListener {
        self.socket.listen(1024).unwrap()
    }
}
