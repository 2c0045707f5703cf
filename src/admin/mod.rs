//! The admin listener: `/metrics` (OpenMetrics text), `/healthz` (the process serves),
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

/// OpenMetrics content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

async fn answer(admin: &Admin, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &admin.registry) {
                Ok(()) => respond::ok_text(OPENMETRICS, out),
                // Encoding into a String only fails on a broken metric implementation.
                Err(e) => {
                    tracing::error!(error = %e, "encoding metrics failed");
                    respond::not_ready()
                }
            }
        }
        (&Method::GET, "/healthz") => respond::ok_text("text/plain; charset=utf-8", "ok\n".into()),
        (&Method::GET, "/readyz") if admin.ready.get() => {
            respond::ok_text("text/plain; charset=utf-8", "ready\n".into())
        }
        (&Method::GET, "/readyz") => respond::not_ready(),
        (&Method::GET, "/status") => admin.control.status(),
        (&Method::POST, "/pause") => admin.control.pause(&req, peer).await,
        (&Method::POST, "/resume") => admin.control.resume(&req, peer),
        _ => respond::admin_not_found(),
    }
}
