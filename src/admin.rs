//! The admin listener: `/metrics` (OpenMetrics text), `/healthz` (the process serves) and
//! `/readyz` (the proxy listener is up and not draining). Kept off the proxy port so metrics are
//! never reachable through the public route.

use std::future::Future;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::body::ProxyBody;
use crate::respond;
use crate::server::Readiness;

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
