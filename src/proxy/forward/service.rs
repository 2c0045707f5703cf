//! The proxy as a service: one client request in, its answer out, counted and logged once.

use std::net::SocketAddr;

use http::{Request, Response};
use tokio::time::Instant;

use super::Proxy;
use crate::proxy::body::ProxyBody;
use crate::proxy::{
    Note, CANCELLED, CLIENT_CLOSED_REQUEST, CLIENT_GONE, SHUTDOWN, SHUTDOWN_STATUS,
};
use crate::replay::ClientBody;

/// A request not yet counted and logged. Every request is, exactly once: when its answer is
/// ready ([`Unfinished::finish`]), or, if its client goes away first and its future is dropped,
/// when this is dropped.
struct Unfinished<'a> {
    proxy: &'a Proxy,
    start: Instant,
    method: http::Method,
    path: Option<String>,
    done: bool,
}

impl Unfinished<'_> {
    /// Counts and logs the request, answered with `status`.
    fn finish(&mut self, status: u16, note: &Note) {
        self.done = true;
        // A client that went away while held got no answer at all: counted as nginx logs it,
        // 499 "client closed request", not as the 400 its closed connection was handed.
        let status = if note.action == CANCELLED {
            CLIENT_CLOSED_REQUEST
        } else {
            status
        };
        let path = self.path.as_deref();
        self.proxy
            .record(self.start, &self.method, path, status, note);
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Dropped at the drain's end: holdfast cut it, not its client.
            let (status, action) = if self.proxy.ending.is_over() {
                self.proxy.metrics.shutdown_cut.inc();
                (SHUTDOWN_STATUS, SHUTDOWN)
            } else {
                (CLIENT_CLOSED_REQUEST, CLIENT_GONE)
            };
            let note = Note {
                upstream_status: None,
                action,
            };
            let path = self.path.as_deref();
            self.proxy
                .record(self.start, &self.method, path, status, &note);
        }
    }
}

impl Proxy {
    /// Answers one client request. Never fails. What can be done with the request before
    /// anything is awaited is done here, outside the future: only what lives across its awaits
    /// is in it (this future lives as long as the request, for a held one as long as the hold).
    pub fn handle(
        &self,
        req: Request<ClientBody>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + Send + '_ {
        let mut unfinished = Unfinished {
            proxy: self,
            start: Instant::now(),
            method: req.method().clone(),
            // Copied only for the access log: the hot path needs no second copy of the path.
            path: self.access_log.then(|| req.uri().path().to_owned()),
            done: false,
        };
        let mut begun = self.begin(req, peer);
        async move {
            // The exchange is used where it lies (moved into a local it would take room twice).
            let (resp, note) = match &mut begun {
                Ok(ex) => self.forward(ex).await,
                Err((Some(why), version)) => (
                    crate::respond::bad_request(why, *version),
                    Note {
                        upstream_status: None,
                        action: "bad_request",
                    },
                ),
                // A hand-off of this holdfast's own: its sender tries the next peer.
                Err((None, _)) => (
                    crate::respond::handoff_to_self(),
                    Note {
                        upstream_status: None,
                        action: "handoff_self",
                    },
                ),
            };
            unfinished.finish(resp.status().as_u16(), &note);
            resp
        }
    }

    /// Counts and logs one request: answered with `status`, or (499) given up by its client.
    fn record(
        &self,
        start: Instant,
        method: &http::Method,
        path: Option<&str>,
        status: u16,
        note: &Note,
    ) {
        let elapsed = start.elapsed();
        self.metrics.requests.inc(method.into(), status);
        self.metrics.request_duration.observe(elapsed.as_secs_f64());
        if self.access_log {
            // Path only: a query may carry tokens. Never headers or bodies.
            tracing::info!(
                target: "holdfast::access",
                method = %method,
                path = path.unwrap_or_default(),
                status,
                upstream_status = note.upstream_status.map(|s| s.as_u16()),
                action = note.action,
                // Microsecond resolution is all a log reader needs: 1.009, not 1.0088169999.
                duration_ms = (elapsed.as_secs_f64() * 1e6).round() / 1e3,
            );
        }
    }
}
