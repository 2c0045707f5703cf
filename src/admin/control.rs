//! Pause and resume on the admin listener, and who may call them.
//!
//! A pause stops traffic to the upstream, so the endpoints that change state answer only what
//! the operator allows: with `admin_token_file` set, a request that carries the token as
//! `Authorization: Bearer <token>` (from any peer, loopback included); without it, a loopback
//! peer only. Reads (`/metrics`, `/healthz`, `/readyz`, `/status`) stay open.
//!
//! `POST /pause[?drain_timeout_secs=N]` answers once nothing is in flight or the drain timeout
//! passes, with the state as JSON; `holdfast pause` turns that into its exit status.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{Request, Response, StatusCode};
use serde_json::json;
use tokio::time::Instant;

use crate::config::AdminToken;
use crate::hold::PauseStart;
use crate::metrics::PauseOutcome;
use crate::proxy::body::ProxyBody;
use crate::proxy::current::Current;
use crate::proxy::Proxy;
use crate::respond;

/// Drain timeout of a `POST /pause` that names none.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest drain a `POST /pause` may ask for.
const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);

/// Requests in flight named in a report, oldest first.
const REPORTED: usize = 10;

/// Pause, resume and status.
pub struct Control {
    /// The proxy now: a reload replaces it (its pause and in-flight state are carried over).
    current: Arc<Current>,
    token: Option<AdminToken>,
}

impl Control {
    /// The proxy now.
    fn proxy(&self) -> Arc<Proxy> {
        self.current.get()
    }

    /// Controls `proxy`; `token`: what callers of the endpoints that change state must present.
    pub fn new(current: Arc<Current>, token: Option<AdminToken>) -> Self {
        Self { current, token }
    }

    /// `GET /status`.
    pub fn status(&self) -> Response<ProxyBody> {
        respond::json(StatusCode::OK, &self.state())
    }

    /// `POST /pause`: pauses (or finds a pause in progress), then waits for the drain.
    pub async fn pause<B>(&self, req: &Request<B>, peer: SocketAddr) -> Response<ProxyBody> {
        if let Err(Refused(message)) = self.authorize(req, peer) {
            return refused(StatusCode::FORBIDDEN, message);
        }
        let drain = match drain_timeout(req.uri().query()) {
            Ok(d) => d,
            Err(message) => return refused(StatusCode::BAD_REQUEST, message),
        };
        let who = peer.to_string();
        let started = match self.proxy().pause(&who) {
            PauseStart::Started => true,
            PauseStart::Already => {
                tracing::info!(
                    peer = who,
                    "pause asked for while paused: reporting the state"
                );
                false
            }
            PauseStart::HoldDisabled => {
                return refused(
                    StatusCode::CONFLICT,
                    "hold.enabled is false: nothing can be held, so holdfast cannot pause".into(),
                )
            }
            PauseStart::ShuttingDown => {
                return refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "holdfast is shutting down".into(),
                )
            }
        };
        let drained = self
            .proxy()
            .in_flight()
            .drained(Instant::now() + drain)
            .await;
        if started {
            self.proxy().count_pause(if drained {
                PauseOutcome::drained
            } else {
                PauseOutcome::drain_timeout
            });
        }
        if !drained {
            tracing::warn!(
                peer = who,
                in_flight = self.proxy().in_flight().len(),
                drain_timeout_secs = drain.as_secs_f64(),
                "paused, but requests are still in flight after the drain timeout; they are not \
                 cut off"
            );
        }
        let mut state = self.state();
        state["started"] = json!(started);
        state["drained"] = json!(drained);
        state["drain_timeout_secs"] = json!(drain.as_secs_f64());
        respond::json(StatusCode::OK, &state)
    }

    /// `POST /resume`.
    pub fn resume<B>(&self, req: &Request<B>, peer: SocketAddr) -> Response<ProxyBody> {
        if let Err(Refused(message)) = self.authorize(req, peer) {
            return refused(StatusCode::FORBIDDEN, message);
        }
        let resumed = self.proxy().unpause(&peer.to_string());
        let mut state = self.state();
        state["resumed"] = json!(resumed);
        respond::json(StatusCode::OK, &state)
    }

    /// Whether the caller may change state: the token, or without one a loopback peer.
    fn authorize<B>(&self, req: &Request<B>, peer: SocketAddr) -> Result<(), Refused> {
        let path = req.uri().path();
        let allowed = match &self.token {
            Some(token) => req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                .is_some_and(|presented| token.matches(presented)),
            None => peer.ip().to_canonical().is_loopback(),
        };
        if allowed {
            return Ok(());
        }
        let message = if self.token.is_some() {
            format!(
                "{path} needs the admin token: `Authorization: Bearer <token>` (admin_token_file)"
            )
        } else {
            format!(
                "{path} is allowed from loopback only; set admin_token_file to allow it from \
                 elsewhere with a token"
            )
        };
        tracing::warn!(peer = %peer, path, "admin request refused");
        Err(Refused(message))
    }

    /// The pause, the hold and what is in flight, as JSON.
    fn state(&self) -> serde_json::Value {
        let proxy = self.proxy();
        let pause = proxy.pause_status();
        let in_flight = proxy.in_flight();
        let oldest: Vec<_> = in_flight
            .oldest(REPORTED)
            .into_iter()
            .map(|p| {
                json!({
                    "method": p.method.as_str(),
                    "age_secs": round_secs(p.age),
                    "stream": p.stream,
                })
            })
            .collect();
        let (url, outage) = proxy.upstream_status();
        json!({
            // This process, as its hand-offs name it (`holdfast-handoff`).
            "instance": proxy.instance(),
            // holdfast's view of the upstream: /readyz is holdfast's own readiness, this is
            // where an operator sees whether the backend is there.
            "upstream": {
                "url": url,
                "up": outage.is_none(),
                "outage_reason": outage.map(|(r, _)| r.as_str()),
                "outage_secs": outage.map(|(_, age)| round_secs(age)),
            },
            "paused": pause.is_some(),
            "paused_secs": pause.as_ref().map(|p| round_secs(p.age)),
            "resumes_in_secs": pause.as_ref().map(|p| round_secs(p.remaining)),
            "upstream_gone": pause.as_ref().map(|p| p.upstream_gone),
            "held": pause.as_ref().map_or(0, |p| p.held),
            "in_flight": in_flight.len(),
            "in_flight_calls": in_flight.calls(),
            "oldest_in_flight": oldest,
        })
    }
}

/// A caller that may not change state, and what it is told.
struct Refused(String);

/// Seconds to the millisecond: a report, not a measurement.
fn round_secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// `drain_timeout_secs` from a query, or the default.
fn drain_timeout(query: Option<&str>) -> Result<Duration, String> {
    let Some(value) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("drain_timeout_secs="))
    else {
        return Ok(DEFAULT_DRAIN_TIMEOUT);
    };
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => {
            Ok(Duration::from_secs_f64(secs).min(MAX_DRAIN_TIMEOUT))
        }
        _ => Err(format!(
            "drain_timeout_secs must be a number of seconds, got {value:?}"
        )),
    }
}

fn refused(status: StatusCode, message: String) -> Response<ProxyBody> {
    respond::json(status, &json!({ "error": message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_timeout_comes_from_the_query_and_is_bounded() {
        assert_eq!(drain_timeout(None), Ok(DEFAULT_DRAIN_TIMEOUT));
        assert_eq!(drain_timeout(Some("x=1")), Ok(DEFAULT_DRAIN_TIMEOUT));
        assert_eq!(
            drain_timeout(Some("x=1&drain_timeout_secs=2.5")),
            Ok(Duration::from_millis(2500))
        );
        assert_eq!(
            drain_timeout(Some("drain_timeout_secs=0")),
            Ok(Duration::ZERO)
        );
        assert_eq!(
            drain_timeout(Some("drain_timeout_secs=99999")),
            Ok(MAX_DRAIN_TIMEOUT)
        );
        assert!(drain_timeout(Some("drain_timeout_secs=-1")).is_err());
        assert!(drain_timeout(Some("drain_timeout_secs=soon")).is_err());
    }
}

#[cfg(test)]
mod access_tests {
    use super::*;
    use crate::config::{Config, RawConfig};
    use http_body_util::BodyExt;

    fn control(token: Option<&str>) -> Control {
        let raw = RawConfig {
            upstream: "http://127.0.0.1:9".into(),
            ..RawConfig::default()
        };
        let config = Config::from_raw(&raw, &|_| "test".into()).expect("valid");
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(crate::metrics::Metrics::register(&mut registry));
        let proxy = Proxy::new(&config, metrics).shared();
        Control::new(Current::new(proxy), token.map(AdminToken::for_tests))
    }

    fn post(path: &str, bearer: Option<&str>) -> Request<()> {
        let mut req = Request::post(path);
        if let Some(b) = bearer {
            req = req.header(AUTHORIZATION, format!("Bearer {b}"));
        }
        req.body(()).unwrap()
    }

    async fn text(resp: Response<ProxyBody>) -> String {
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    const LAN: &str = "10.1.2.3:40000";
    const LOOPBACK: &str = "127.0.0.1:40000";
    const TOKEN: &str = "s3cret-token-0123456789";

    #[tokio::test(start_paused = true)]
    async fn without_a_token_only_loopback_may_pause() {
        let c = control(None);
        let resp = c.pause(&post("/pause", None), LAN.parse().unwrap()).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(text(resp).await.contains("loopback only"));
        let resp = c.resume(&post("/resume", None), LAN.parse().unwrap());
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(c.proxy().pause_status().is_none(), "nothing changed");
        // IPv4 loopback, and IPv4 loopback as IPv6 sees it on a dual-stack listener.
        for peer in [LOOPBACK, "[::ffff:127.0.0.1]:40000"] {
            let q = post("/pause?drain_timeout_secs=0", None);
            assert_eq!(
                c.pause(&q, peer.parse().unwrap()).await.status(),
                StatusCode::OK
            );
            assert!(c.proxy().pause_status().is_some());
            let resp = c.resume(&post("/resume", None), peer.parse().unwrap());
            assert_eq!(resp.status(), StatusCode::OK);
            assert!(c.proxy().pause_status().is_none());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_token_every_peer_must_present_it() {
        let c = control(Some(TOKEN));
        for (peer, bearer) in [
            (LAN, None),
            (LOOPBACK, None),
            (LOOPBACK, Some("wrong-token-0123456789")),
        ] {
            let q = post("/pause?drain_timeout_secs=0", bearer);
            let resp = c.pause(&q, peer.parse().unwrap()).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{peer} {bearer:?}");
            assert!(text(resp).await.contains("needs the admin token"));
        }
        assert!(c.proxy().pause_status().is_none(), "nothing changed");
        let q = post("/pause?drain_timeout_secs=0", Some(TOKEN));
        assert_eq!(
            c.pause(&q, LAN.parse().unwrap()).await.status(),
            StatusCode::OK
        );
        assert!(c.proxy().pause_status().is_some());
        // Reads stay open.
        assert_eq!(c.status().status(), StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_drain_timeout_is_a_400_and_changes_nothing() {
        let c = control(None);
        let q = post("/pause?drain_timeout_secs=soon", None);
        let resp = c.pause(&q, LOOPBACK.parse().unwrap()).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert!(c.proxy().pause_status().is_none());
    }
}
