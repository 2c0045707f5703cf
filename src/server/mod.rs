//! The accept loops, TLS handshakes, connection limits and graceful shutdown.
//!
//! [`run`] takes already-bound listeners (so tests bind port 0 and read the address) and a
//! shutdown future. On shutdown: readiness goes false, accepting stops, in-flight requests get
//! `drain_timeout` to finish, then every remaining connection (long SSE streams) is closed.
//!
//! With `[tls]` the proxy listener speaks TLS: each accepted connection's handshake runs in its
//! own task (a slow client never holds up accepting), bounded by `limits.header_read_timeout_secs`
//! like a request head, and a failure is counted by reason. The admin listener stays plain HTTP
//! on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::AbortOnDropHandle;

use crate::admin;
use crate::admin::Readiness;
use crate::config::{Config, UpstreamVerify};
use crate::http1::socket::Socket;
use crate::listener;
pub use crate::listener::bind;
use crate::metrics::{HandshakeFailure, Metrics, ServerMetrics, TlsMetrics};
use crate::proxy::current::Current;
use crate::proxy::Proxy;
use crate::tls;

mod conn;
mod h1;
mod idle;
mod reload;
use conn::Served;
use idle::Idle;
use reload::Live;
pub use reload::{fixed_changes, Ask};

/// holdfast running on a task of the current runtime (the demo, tests and benchmarks run it so).
pub struct Spawned {
    /// The proxy listener's address.
    pub addr: SocketAddr,
    /// The admin listener's address.
    pub admin: SocketAddr,
    asks: tokio::sync::mpsc::UnboundedSender<Ask>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Binds `config.listen` and `config.admin` (port 0 picks a free port) and runs holdfast on a new
/// task until [`Spawned::begin_shutdown`] or drop.
pub async fn spawn(config: Config) -> std::io::Result<Spawned> {
    let listener = bind(config.listen, "proxy").await?;
    let admin_listener = bind(config.admin, "admin").await?;
    let addr = listener.local_addr()?;
    let admin = admin_listener.local_addr()?;
    let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(run(config, listener, admin_listener, asked));
    Ok(Spawned {
        addr,
        admin,
        asks,
        task: Some(task),
    })
}

impl Spawned {
    /// Starts shutting down (as SIGTERM does) without waiting.
    pub fn begin_shutdown(&mut self) {
        let _ = self.asks.send(Ask::Stop);
    }

    /// Ends a drain under way at once (as a second SIGTERM does).
    pub fn stop_now(&self) {
        let _ = self.asks.send(Ask::StopNow);
    }

    /// Takes `config` (as SIGHUP does with the configuration read again).
    pub fn reload(&self, config: Config) {
        let _ = self.asks.send(Ask::Reload(Ok(Box::new(config))));
    }

    /// Waits for a shutdown begun earlier to finish (at once if it already has).
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }

    /// Shuts down and waits until holdfast has stopped.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.begin_shutdown();
        self.wait().await
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.begin_shutdown();
    }
}

/// Serves the proxy on `listener` and the admin endpoints on `admin_listener`, doing what `asks`
/// asks (reload, stop), until asked to stop (or `asks` closes), then drains.
pub async fn run(
    config: Config,
    listener: TcpListener,
    admin_listener: TcpListener,
    asks: tokio::sync::mpsc::UnboundedReceiver<Ask>,
) -> std::io::Result<()> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let server_metrics = ServerMetrics::register(&mut registry);
    crate::metrics::process::register(&mut registry);
    let tls_metrics = config
        .tls
        .as_ref()
        .map(|_| TlsMetrics::register(&mut registry));
    let tls = config
        .tls
        .as_ref()
        .zip(tls_metrics.clone())
        .map(|(t, m)| listener_tls(t, config.header_read_timeout, m));
    if let Some(u) = &config.upstream_tls {
        if u.verify == UpstreamVerify::InsecureSkipVerify {
            tracing::warn!(
                upstream = %config.upstream.original,
                "client.insecure_skip_verify is on: the upstream's certificate is NOT verified, \
                 so anyone on the network path can impersonate it; use client.ca instead"
            );
        }
    }
    if let Some(warning) = &config.sessions.key_file_warning {
        tracing::warn!("sessions.key_file: {warning}");
    }
    let traces = start_tracing(&config.tracing, &metrics)?;
    let proxy = Proxy::new(&config, metrics).traced(traces.clone()).shared();
    let current = Current::new(proxy.clone());
    // The session keys' reloader, stopped with `run` like the certificate's.
    let key_reloader = key_reloader(&proxy);
    // The upstream checked without traffic (`hold.check_interval_secs`), stopped with `run`.
    let _checks_at_rest = AbortOnDropHandle::new(tokio::spawn(proxy.checks_at_rest()));
    // The era bridge's cancellations, sent by the proxy current when each comes.
    let _cancellations =
        AbortOnDropHandle::new(tokio::spawn(Proxy::bridge_cancellations(current.clone())));
    // And its calls whose 2025 clients are asked for a 2026 server's input, likewise.
    let _asks = AbortOnDropHandle::new(tokio::spawn(Proxy::bridge_asks(current.clone())));
    let ready = Arc::new(Readiness::default());

    let admin_addr = admin_listener.local_addr()?;
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin = Arc::new(admin::Admin {
        registry: Arc::new(registry),
        ready: ready.clone(),
        control: admin::Control::new(current.clone(), config.admin_token.clone()),
    });
    let admin_task = tokio::spawn(admin::serve(admin_listener, admin, async move {
        let _ = admin_stop_rx.await;
    }));

    tracing::info!(
        listen = %listener.local_addr()?,
        tls = config.tls.is_some(),
        client_certificates = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        admin = %admin_addr,
        upstream = %config.upstream.original,
        "holdfast proxying"
    );
    ready.set(true);
    let live = Live {
        permits: Arc::new(Semaphore::new(config.max_connections)),
        config,
        current,
        tls,
        tls_metrics,
        metrics: server_metrics,
        warned_at_cap: None,
    };
    // The certificate reloader stops when `live` goes (or on any early return): its guard is in
    // `live.tls`.
    serve_proxy(live, listener, &ready, asks).await;
    drop(key_reloader);
    let _ = admin_stop_tx.send(());
    let _ = admin_task.await;
    if let Some(traces) = traces {
        // The spans of the last requests, which would otherwise wait for a batch that never
        // goes.
        if !traces.flush(TRACE_FLUSH).await {
            tracing::warn!(
                within_secs = TRACE_FLUSH.as_secs_f64(),
                "the last spans were not exported in time; they are dropped"
            );
        }
    }
    tracing::info!("holdfast stopped");
    Ok(())
}

/// How long a stopping holdfast waits for its last spans' export.
const TRACE_FLUSH: Duration = Duration::from_secs(5);

/// Tracing, started when `[tracing] enabled`; a configuration that cannot start it stops
/// holdfast's start with the reason.
fn start_tracing(
    cfg: &crate::config::Tracing,
    metrics: &Metrics,
) -> std::io::Result<Option<Arc<crate::telemetry::trace::Tracing>>> {
    if !cfg.enabled {
        return Ok(None);
    }
    let counts = metrics.trace_spans.clone();
    let traces = crate::telemetry::trace::Tracing::start(cfg, counts).map_err(|e| {
        std::io::Error::other(format!("tracing: {}", crate::errors::ErrorChain(&e)))
    })?;
    tracing::info!(
        endpoint = %traces.endpoint(),
        sample_ratio = cfg.sample_ratio,
        "tracing: exporting spans over OTLP/HTTP"
    );
    Ok(Some(Arc::new(traces)))
}

/// The listener's TLS: the certificate store that new handshakes read, and the task that swaps
/// a changed certificate into it (stopped when dropped).
fn listener_tls(
    t: &crate::config::InboundTls,
    handshake_timeout: Duration,
    metrics: TlsMetrics,
) -> (ListenerTls, AbortOnDrop) {
    let store = tls::CertStore::new(&t.identity);
    let reloader = AbortOnDropHandle::new(tls::spawn_reloader(
        store.clone(),
        t.identity.clone(),
        tls::Reload {
            cert: t.cert.clone(),
            key: t.key.clone(),
            interval: t.reload_interval,
        },
        metrics.clone(),
    ));
    let listener_tls = ListenerTls {
        acceptor: TlsAcceptor::from(tls::server_config(
            store,
            t.client_verifier.clone(),
            t.session_resumption,
        )),
        metrics,
        handshake_timeout,
    };
    (listener_tls, reloader)
}

/// The session keys' reloader, when keys come from a file; says what a process-only key
/// means.
fn key_reloader(proxy: &Proxy) -> Option<AbortOnDrop> {
    proxy.session_keys().and_then(|keys| {
        if !keys.configured() {
            tracing::info!(
                "sessions.key_file is not set: session ids are sealed with a key of this process \
                 only, so sessions survive the backend's restarts but not holdfast's own, nor a \
                 move to another replica"
            );
        }
        crate::session::spawn_key_reloader(keys).map(AbortOnDropHandle::new)
    })
}

/// A background task aborted when dropped, so it ends with `run` however `run` ends.
pub(super) type AbortOnDrop = AbortOnDropHandle<()>;

/// The listener's TLS: how to shake hands, and where failures are counted.
#[derive(Clone)]
pub(super) struct ListenerTls {
    acceptor: TlsAcceptor,
    metrics: TlsMetrics,
    /// Slowloris guard for the handshake (`limits.header_read_timeout_secs`).
    handshake_timeout: Duration,
}

impl ListenerTls {
    /// The TLS stream, or `None` when the handshake failed (counted and logged at debug: port
    /// scanners and TCP health checks fail handshakes all day).
    async fn handshake(&self, stream: TcpStream, peer: SocketAddr) -> Option<TlsStream<Socket>> {
        let reason = match tokio::time::timeout(
            self.handshake_timeout,
            self.acceptor.accept(Socket::new(stream)),
        )
        .await
        {
            Ok(Ok(tls)) => return Some(tls),
            Ok(Err(e)) => {
                let reason = tls::handshake_failure(&e);
                tracing::debug!(%peer, error = %e, ?reason, "TLS handshake failed");
                reason
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                HandshakeFailure::timeout
            }
        };
        self.metrics.handshake_failed(reason);
        None
    }
}

/// Resolves the upstream's name and connects once (TCP only), and says what it found: the
/// address on success, a warning naming the host, the kind of failure and the OS error if not.
pub async fn try_upstream_once(upstream: crate::config::UpstreamUrl, connect_timeout: Duration) {
    use tower_service::Service;
    match crate::upstream::Connector::new(connect_timeout)
        .call(upstream.base_uri())
        .await
    {
        Ok(stream) => tracing::info!(
            upstream = %upstream.authority,
            address = %stream.inner().peer_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
            "the upstream accepts connections"
        ),
        Err(e) => tracing::warn!(
            upstream = %upstream.authority,
            error = %crate::errors::ErrorChain(&e),
            "the upstream cannot be reached now: requests will be held (then answered 503) until \
             it can; check the upstream URL if it should be up"
        ),
    }
}

/// What the accept loop hears: a connection, or an ask.
enum Event {
    Accepted(TcpStream, SocketAddr),
    Asked(Ask),
    /// The accept grace is over.
    GraceOver,
}

/// The proxy's accept loop and drain, doing what is asked meanwhile.
async fn serve_proxy(
    mut live: Live,
    listener: TcpListener,
    ready: &Readiness,
    mut asks: tokio::sync::mpsc::UnboundedReceiver<Ask>,
) {
    let (drain, draining) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    let idle = Idle::new();
    let mut spawner = Spawner {
        served: served(
            &live.config,
            live.current.clone(),
            draining,
            live.metrics.connections.clone(),
        ),
        tls: live.tls.as_ref().map(|(t, _)| t.clone()),
        idle: idle.clone(),
    };
    // A closed channel (its holder dropped it) is asked to stop.
    let mut next_ask = async move || asks.recv().await.unwrap_or(Ask::Stop);

    // After SIGTERM with `shutdown.accept_grace_secs`: when accepting stops. Until then
    // readiness fails but connections are still accepted and served, so a balancer that takes a
    // moment to notice (a Service's endpoints, Traefik's health check) sends nothing into a
    // closed port meanwhile.
    let mut grace_ends: Option<Instant> = None;
    let mut now = false;
    loop {
        let event = tokio::select! {
            (stream, peer) = listener::accept(&listener, "proxy") => Event::Accepted(stream, peer),
            ask = next_ask() => Event::Asked(ask),
            () = until(grace_ends) => Event::GraceOver,
        };
        let (stream, peer) = match event {
            Event::Accepted(stream, peer) => (stream, peer),
            Event::GraceOver => break,
            Event::Asked(Ask::Reload(read)) => {
                live.reload(read, &mut spawner);
                continue;
            }
            // A second TERM during the grace: stop now.
            Event::Asked(Ask::StopNow) | Event::Asked(Ask::Stop) if grace_ends.is_some() => {
                now = true;
                break;
            }
            Event::Asked(Ask::StopNow) => {
                now = true;
                break;
            }
            Event::Asked(Ask::Stop) => {
                let grace = live.config.accept_grace;
                if grace.is_zero() {
                    break;
                }
                ready.set(false);
                // Connections go on being served, but each answer from now on carries
                // `Connection: close` (HTTP/2: GOAWAY), and idle ones close: a client's next
                // request opens a connection the balancer sends elsewhere.
                let _ = drain.send(true);
                tracing::info!(
                    accept_grace_secs = grace.as_secs_f64(),
                    "shutting down: not ready, still accepting for shutdown.accept_grace_secs"
                );
                grace_ends = Some(Instant::now() + grace);
                continue;
            }
        };
        let permit = match live.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                live.at_cap(idle.make_room());
                let permit = tokio::select! {
                    permit = live.permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
                    () = until(grace_ends) => break,
                };
                idle.room_made();
                permit
            }
        };
        spawner.spawn(&mut connections, stream, peer, permit);
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
    }

    // Connections the kernel completed before accepting stopped: their clients have likely
    // sent a request already, and closing the listener over them would reset them (a request
    // lost that nothing retries). Each is served like any other (and the drain gives a new
    // connection a moment for its first request: h1.rs, FRESH_DRAIN_GRACE).
    if !now {
        spawner.accept_queued(&listener, &live.permits, &mut connections);
    }
    // Not ready from the moment accepting stops, so load balancers move away during the drain.
    ready.set(false);
    // Closed before anything is handed off: a hand-off this holdfast sends to its own address
    // (the peer list is every replica's) must be refused, not accepted into a backlog nobody
    // serves any more and then reset.
    drop(listener);
    // Held requests go to a peer now; standalone streams end.
    live.current.get().begin_shutdown();
    let timeout = if now {
        Duration::ZERO
    } else {
        live.config.drain_timeout
    };
    drain_all(connections, (drain, &live.current), timeout, next_ask).await;
}

/// Starts each accepted connection's task.
pub(super) struct Spawner {
    /// What each connection is served with (a reload replaces it for new connections).
    pub(super) served: Served,
    /// The listener's TLS (a reload replaces it for new connections).
    pub(super) tls: Option<ListenerTls>,
    idle: Arc<Idle>,
}

impl Spawner {
    /// One accepted connection's task; it gives `permit` back when it ends.
    fn spawn(
        &self,
        connections: &mut JoinSet<()>,
        stream: TcpStream,
        peer: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let registered = Arc::new(self.idle.register());
        let _ = stream.set_nodelay(true);
        let (served, tls) = (self.served.clone(), self.tls.clone());
        connections.spawn(async move {
            match tls {
                None => served.plain(stream, peer, registered).await,
                // Boxed: a TLS stream and its connection state are large, and the plain
                // connection's task (a sidecar's usual case) would otherwise be as large as
                // the TLS one for as long as it lives.
                Some(tls) => {
                    Box::pin(async move {
                        let handshake = tokio::select! {
                            stream = tls.handshake(stream, peer) => stream,
                            () = registered.closed() => None,
                        };
                        if let Some(stream) = handshake {
                            served.tls(stream, peer, registered).await
                        }
                    })
                    .await
                }
            }
            drop(permit);
        });
    }

    /// Serves the connections queued in the kernel now, while there are permits: each polled
    /// once, never awaited (what is queued now, and nothing more).
    fn accept_queued(
        &self,
        listener: &TcpListener,
        permits: &Arc<Semaphore>,
        connections: &mut JoinSet<()>,
    ) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while let std::task::Poll::Ready(Ok((stream, peer))) = listener.poll_accept(&mut cx) {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                break;
            };
            self.spawn(connections, stream, peer, permit);
        }
    }
}

/// Waits until `deadline`; for ever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What every connection is served with under `config`; `drain` turns true when a drain begins.
fn served(
    config: &Config,
    current: Arc<Current>,
    drain: tokio::sync::watch::Receiver<bool>,
    connections: crate::metrics::ClientConnections,
) -> Served {
    let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        // Pings find dead peers (a vanished client) so their connections free their slots
        // (`limits.h2_ping_interval_secs`; two thirds of it to answer: 30 s and 20 s by default).
        .keep_alive_interval(config.h2_ping_interval)
        .keep_alive_timeout(config.h2_ping_interval * 2 / 3)
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    Served {
        current,
        h2: Arc::new(h2),
        limits: h1::Limits {
            max_head_bytes: config.max_header_bytes,
            max_headers: config.max_headers,
            header_read_timeout: config.header_read_timeout,
        },
        drain,
        connections,
    }
}

/// The drain: idle connections close now, busy ones after their request (HTTP/2: GOAWAY, then
/// its open streams); whatever is left after `timeout` (long SSE streams) is closed.
/// A second SIGTERM or SIGINT (`Ask::StopNow`, or `Ask::Stop` again) ends it at once. Either
/// way, when it ends every event stream still open ends cleanly (its final chunk), given
/// [`FINAL_WRITES`] to go out, and what still waits for an answer is cut, as holdfast's doing.
async fn drain_all(
    mut connections: JoinSet<()>,
    (drain, current): (tokio::sync::watch::Sender<bool>, &Current),
    timeout: Duration,
    mut next_ask: impl AsyncFnMut() -> Ask,
) {
    tracing::info!(
        drain_timeout_secs = timeout.as_secs_f64(),
        "shutting down: draining in-flight requests"
    );
    let _ = drain.send(true);
    let asked_to_stop = async {
        loop {
            match next_ask().await {
                Ask::Stop | Ask::StopNow => return,
                // Too late to take a configuration: said, and left.
                Ask::Reload(_) => tracing::warn!("shutting down: the reload is ignored"),
            }
        }
    };
    tokio::select! {
        () = joined(&mut connections) => return,
        () = tokio::time::sleep(timeout) => tracing::info!(
            remaining = connections.len(),
            "drain timeout reached; ending open streams and closing remaining connections"
        ),
        () = asked_to_stop => tracing::info!(
            remaining = connections.len(),
            "asked again to stop: closing remaining connections now"
        ),
    }
    current.get().drain_over();
    let _ = tokio::time::timeout(FINAL_WRITES, joined(&mut connections)).await;
    connections.shutdown().await;
}

/// How long the streams ended at the drain's end get to write their last bytes.
const FINAL_WRITES: Duration = Duration::from_secs(1);

/// Until every connection task has ended.
async fn joined(connections: &mut JoinSet<()>) {
    while connections.join_next().await.is_some() {}
}
