//! The accept loops, connection limits and graceful shutdown.
//!
//! [`run`] takes already-bound listeners (so tests bind port 0 and read the address) and a
//! shutdown future. On shutdown: readiness goes false, accepting stops, in-flight requests get
//! `drain_timeout` to finish, then every remaining connection (long SSE streams) is closed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::admin;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::Proxy;

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

/// Serves the proxy on `listener` and the admin endpoints on `admin_listener` until `shutdown`
/// completes, then drains.
pub async fn run(
    config: Config,
    listener: TcpListener,
    admin_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let proxy = Arc::new(Proxy::new(&config, metrics));
    let ready = Arc::new(Readiness::default());

    let admin_addr = admin_listener.local_addr()?;
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        Arc::new(registry),
        ready.clone(),
        async move {
            let _ = admin_stop_rx.await;
        },
    ));

    tracing::info!(
        listen = %listener.local_addr()?,
        admin = %admin_addr,
        upstream = %config.upstream.original,
        "holdfast proxying"
    );
    ready.set(true);
    serve_proxy(&config, listener, proxy, &ready, shutdown).await;

    let _ = admin_stop_tx.send(());
    let _ = admin_task.await;
    tracing::info!("holdfast stopped");
    Ok(())
}

/// The proxy's accept loop and drain.
async fn serve_proxy(
    config: &Config,
    listener: TcpListener,
    proxy: Arc<Proxy>,
    ready: &Readiness,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Slowloris guard: a client must finish its request head within this time.
        .header_read_timeout(config.header_read_timeout)
        .max_buf_size(config.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);

    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    // Past the limit, accepting pauses (connections wait in the kernel's backlog) rather than
    // being accepted and dropped.
    let permits = Arc::new(Semaphore::new(config.max_connections));
    tokio::pin!(shutdown);

    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Per-connection errors (e.g. reset before accept, out of fds): keep going.
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
            async move { Ok::<_, std::convert::Infallible>(proxy.handle(req, peer).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "client connection ended with an error");
            }
            drop(permit);
        });
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
    }

    // Not ready from the moment accepting stops, so load balancers move away during the drain.
    ready.set(false);
    // Held requests would wait for an upstream that may never come back before the drain ends:
    // they get their 503 now.
    proxy.begin_shutdown();
    drop(listener);
    tracing::info!(
        drain_timeout_secs = config.drain_timeout.as_secs_f64(),
        "shutting down: draining in-flight requests"
    );
    if tokio::time::timeout(config.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            remaining = connections.len(),
            "drain timeout reached; closing remaining connections"
        );
    }
    connections.shutdown().await;
}

/// Binds a listener, naming the address in the error.
pub async fn bind(addr: SocketAddr, what: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {addr} ({what}): {e}"))
    })
}
