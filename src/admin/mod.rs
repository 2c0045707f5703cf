//! The admin listener: `/metrics` (OpenMetrics text for a client that asks for it, as
//! Prometheus does; the Prometheus 0.0.4 text for everyone else), `/healthz` (the process serves),
//! `/readyz` (the proxy listener is up and not draining), `/status` (a pause, requests in
//! flight) and the endpoints that change state, `POST /pause` and `POST /resume` (see
//! [`control`]). Kept off the proxy port so none of it is reachable through the public route.
//!
//! # Layout
//! - here: the listener and the read-only endpoints.
//! - [`control`]: pause and resume, and who may call them.
//! - [`client`]: the other side, for `holdfast healthcheck`, `pause` and `resume`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::metrics::text;
use crate::proxy::body::ProxyBody;
use crate::respond;

pub mod client;
pub mod control;

pub use client::is_ready;
pub use control::Control;

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

/// What the admin endpoints read and act on.
pub struct Admin {
    /// The metrics registry.
    pub registry: Arc<Registry>,
    /// Readiness of the proxy listener.
    pub ready: Arc<Readiness>,
    /// Pause and resume.
    pub control: Control,
}

/// Serves admin requests until `shutdown`.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>, shutdown: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = crate::listener::accept(&listener, "admin") => accepted,
            () = &mut shutdown => break,
        };
        let admin = admin.clone();
        let service = service_fn(move |req| {
            let admin = admin.clone();
            async move { Ok::<_, std::convert::Infallible>(answer(&admin, req, peer).await) }
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
    // Admin requests are tiny (a pause's drain aside, which shutdown ends anyway); do not wait
    // for idle keep-alive connections.
    drop(graceful);
}

/// The admin endpoints, each with the methods it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Metrics,
    Healthz,
    Readyz,
    Status,
    Pause,
    Resume,
}

impl Endpoint {
    fn of(path: &str) -> Option<Endpoint> {
        Some(match path {
            "/metrics" => Endpoint::Metrics,
            "/healthz" => Endpoint::Healthz,
            "/readyz" => Endpoint::Readyz,
            "/status" => Endpoint::Status,
            "/pause" => Endpoint::Pause,
            "/resume" => Endpoint::Resume,
            _ => return None,
        })
    }

    /// The `Allow` header's value: the read-only endpoints answer HEAD as GET (load balancers'
    /// and uptime checkers' health checks send it), the ones that change state only POST.
    fn allow(self) -> &'static str {
        match self {
            Endpoint::Pause | Endpoint::Resume => "POST",
            _ => "GET, HEAD",
        }
    }

    fn allows(self, method: &Method) -> bool {
        match self {
            Endpoint::Pause | Endpoint::Resume => method == Method::POST,
            _ => method == Method::GET || method == Method::HEAD,
        }
    }
}

/// `/metrics`, in the format the client asks for: OpenMetrics when its `Accept` names it, else
/// the 0.0.4 text that `promtool check metrics` and older scrapers read.
fn metrics(admin: &Admin, req: &Request<Incoming>) -> Response<ProxyBody> {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &admin.registry) {
        // Encoding into a String only fails on a broken metric implementation.
        tracing::error!(error = %e, "encoding metrics failed");
        return respond::not_ready();
    }
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    if text::wants_openmetrics(accept) {
        respond::ok_text(text::OPENMETRICS, out)
    } else {
        respond::ok_text(text::PROMETHEUS_TEXT, text::to_prometheus_text(&out))
    }
}

/// One admin request: an unknown path is a 404, a known one with a method it does not take a
/// 405 naming those it does (RFC 9110 §15.5.6). A HEAD gets the GET's answer, whose body hyper
/// leaves out.
async fn answer(admin: &Admin, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
    let Some(endpoint) = Endpoint::of(req.uri().path()) else {
        return respond::admin_not_found();
    };
    if !endpoint.allows(req.method()) {
        return respond::admin_method_not_allowed(endpoint.allow());
    }
    match endpoint {
        Endpoint::Metrics => metrics(admin, &req),
        Endpoint::Healthz => respond::ok_text("text/plain; charset=utf-8", "ok\n".into()),
        Endpoint::Readyz if admin.ready.get() => {
            respond::ok_text("text/plain; charset=utf-8", "ready\n".into())
        }
        Endpoint::Readyz => respond::not_ready(),
        Endpoint::Status => admin.control.status(),
        Endpoint::Pause => admin.control.pause(&req, peer).await,
        Endpoint::Resume => admin.control.resume(&req, peer),
    }
}
