//! The admin listener: `/metrics` (OpenMetrics text), `/healthz` (the process serves) and
//! `/readyz` (the proxy listener is up and not draining). Kept off the proxy port so metrics are
//! never reachable through the public route.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::proxy::body::ProxyBody;
use crate::respond;

/// Whether the proxy listener is up and not draining (`/readyz`).
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    /// Marks ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// OpenMetrics content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves admin requests until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: Arc<Readiness>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let registry = registry.clone();
        let ready = ready.clone();
        let service = service_fn(move |req| {
            let resp = answer(&req, &registry, &ready);
            async move { Ok::<_, std::convert::Infallible>(resp) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(std::time::Duration::from_secs(10))
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    // Admin requests are tiny; do not wait for idle keep-alive connections.
    drop(graceful);
}

/// Asks `/readyz` on the admin listener at `addr` (an unspecified address such as `0.0.0.0`
/// means "this host": loopback is asked). True when it answers 200 within `timeout`.
pub async fn is_ready(addr: std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    let target = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    };
    let ask = async {
        let stream = tokio::net::TcpStream::connect(target).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        let req = Request::get("/readyz")
            .header(http::header::HOST, target.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        Some(resp.status() == http::StatusCode::OK)
    };
    matches!(tokio::time::timeout(timeout, ask).await, Ok(Some(true)))
}

fn answer(req: &Request<Incoming>, registry: &Registry, ready: &Readiness) -> Response<ProxyBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => respond::ok_text(OPENMETRICS, out),
                // Encoding into a String only fails on a broken metric implementation.
                Err(e) => {
                    tracing::error!(error = %e, "encoding metrics failed");
                    respond::not_ready()
                }
            }
        }
        (&Method::GET, "/healthz") => respond::ok_text("text/plain; charset=utf-8", "ok\n".into()),
        (&Method::GET, "/readyz") if ready.get() => {
            respond::ok_text("text/plain; charset=utf-8", "ready\n".into())
        }
        (&Method::GET, "/readyz") => respond::not_ready(),
        _ => respond::admin_not_found(),
    }
}
