//! What a terminating holdfast holds goes to a peer (`[peers]`), not to a 503.
//!
//! In a rollout the balancer keeps sending to a terminating pod for a moment, and a call can
//! arrive there after its server went away: held, it never reached any server. At the drain, a
//! holdfast with peers sends each such request to another replica instead, and streams that
//! replica's answer back; the session token it carries lets the peer carry the session.
//! Exactly once does not change: only what provably never reached a server moves, and:
//! - a request handed off carries `holdfast-handoff: <sender>`: the receiving holdfast never
//!   hands it on again (at its own shutdown it gets the 503), and strips the header before its
//!   upstream sees it;
//! - a holdfast that receives its own hand-off (the peer list is the same for every replica, so
//!   it names itself) answers `421` with `holdfast-reason: handoff_self`, and the sender tries
//!   the next peer;
//! - a peer that cannot be reached (refused, a connection closed before it read the request) is
//!   skipped for the next; one that failed after it may have read the request ends the hand-off
//!   with a 502, as any such failure does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::HeaderValue;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;

use super::body::{ProxyBody, Timed};
use super::Note;
use crate::config::{Config, Peers as PeersConfig};
use crate::metrics::{Handoff, Metrics};
use crate::replay::BodyHandle;
use crate::respond::{HANDOFF_SELF, REASON_HEADER};
use crate::upstream::{Client, FailedSend};

/// The header a hand-off carries: the sender's instance id.
pub const HANDOFF: &str = "holdfast-handoff";

/// This holdfast's peers, and who it is among them.
pub struct Peers {
    settings: PeersConfig,
    /// This process's id, random: how it knows itself in a hand-off.
    me: HeaderValue,
    /// One client per peer, made on first use.
    clients: Mutex<HashMap<Uri, Arc<Client>>>,
    connect_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Peers {
    /// The peers of `cfg`, this process being `me` (kept over a reload).
    pub fn new(cfg: &Config, me: HeaderValue, metrics: Arc<Metrics>) -> Peers {
        Peers {
            settings: cfg.peers.clone(),
            me,
            clients: Mutex::new(HashMap::new()),
            connect_timeout: cfg.connect_timeout,
            metrics,
        }
    }

    /// A fresh instance id.
    pub fn new_id() -> HeaderValue {
        HeaderValue::from_str(&format!("{:016x}", fastrand::u64(..))).expect("hex is a value")
    }

    /// This process's id.
    pub fn me(&self) -> &HeaderValue {
        &self.me
    }

    /// Whether any peer is named.
    pub fn any(&self) -> bool {
        self.settings.any()
    }

    /// The peers to try, in order: the named URLs, then the DNS name's addresses now.
    pub(super) async fn candidates(&self) -> Vec<Uri> {
        let mut all = self.settings.urls.clone();
        if let Some((host, port)) = &self.settings.dns {
            match tokio::net::lookup_host((host.as_str(), *port)).await {
                Ok(addrs) => all.extend(addrs.filter_map(|a| format!("http://{a}").parse().ok())),
                Err(e) => tracing::warn!(peers = %host, error = %e, "peers.dns does not resolve"),
            }
        }
        all
    }

    pub(super) fn client(&self, base: &Uri) -> Arc<Client> {
        let mut clients = self.clients.lock().expect("peer clients lock");
        clients
            .entry(base.clone())
            .or_insert_with(|| {
                Arc::new(Client::new(
                    base.clone(),
                    self.connect_timeout,
                    Duration::from_secs(10),
                    None,
                    self.metrics.upstream_closed.clone(),
                    crate::upstream::ResponseLimits {
                        max_headers: 128,
                        max_head_bytes: 64 * 1024,
                    },
                    // A peer is not the upstream: its connections are not counted as those.
                    prometheus_client::metrics::gauge::Gauge::default(),
                ))
            })
            .clone()
    }
}

/// What a request handed off is, as the attempt loop knows it.
pub(super) struct Handing<'a> {
    pub(super) method: &'a http::Method,
    /// The client's request target (path and query).
    pub(super) client: &'a Uri,
    /// The headers as they would go upstream, the client's session id restored.
    pub(super) headers: http::HeaderMap,
    pub(super) handle: &'a BodyHandle,
}

impl Peers {
    /// Sends a request that never reached a server to a peer, and its answer back; `None` when
    /// no peer took it (the caller answers 503 then). The answer's body streams under `idle`
    /// (`streams.idle_timeout_secs`).
    pub(super) async fn hand_off(
        &self,
        req: Handing<'_>,
        idle: Duration,
    ) -> Option<(Response<ProxyBody>, Note)> {
        if !self.any() || !req.handle.is_replayable() {
            return None;
        }
        for peer in self.candidates().await {
            let Some(body) = req.handle.attempt() else {
                break;
            };
            let mut headers = req.headers.clone();
            headers.insert(HANDOFF, self.me().clone());
            let target = req.client.path_and_query().map_or("/", |p| p.as_str());
            let mut outgoing = Request::new(body);
            *outgoing.method_mut() = req.method.clone();
            *outgoing.uri_mut() = match format!("{peer}{}", target.trim_start_matches('/')).parse()
            {
                Ok(uri) => uri,
                Err(_) => continue,
            };
            *outgoing.headers_mut() = headers;
            match self.client(&peer).request(outgoing).await {
                Ok(resp) if is_self(&resp) => {
                    req.handle.supersede();
                    continue;
                }
                Ok(resp) => {
                    self.count_handoff(Handoff::answered);
                    tracing::info!(peer = %peer, status = resp.status().as_u16(), "handed a request that never reached a server to a peer");
                    let (mut head, body) = resp.into_parts();
                    super::headers::strip_hop_by_hop(&mut head.headers);
                    let body = Timed::new(None, body, idle).boxed_unsync();
                    let note = Note {
                        upstream_status: Some(head.status),
                        action: super::Action::HandedOff,
                    };
                    return Some((Response::from_parts(head, body), note));
                }
                Err(e) => match e.failed() {
                    FailedSend::NotConnected(_) | FailedSend::NeverRead => {
                        req.handle.supersede();
                        tracing::debug!(peer = %peer, "a peer cannot take a hand-off: the next one");
                    }
                    _ => {
                        self.count_handoff(Handoff::failed);
                        tracing::warn!(peer = %peer, "a hand-off failed after the peer may have read it");
                        let resp = crate::respond::bad_gateway(
                            crate::classify::FailReason::UpstreamReset,
                            http::Version::HTTP_11,
                        );
                        let note = Note {
                            upstream_status: None,
                            action: super::Action::HandedOff,
                        };
                        return Some((resp, note));
                    }
                },
            }
        }
        self.count_handoff(Handoff::no_peer);
        tracing::warn!("no peer took a request that never reached a server: answered 503");
        None
    }

    fn count_handoff(&self, outcome: Handoff) {
        self.metrics.handoffs.get_or_create(&outcome.into()).inc();
    }
}

/// Whether a peer's answer says the hand-off went to the sender itself.
fn is_self(resp: &Response<crate::upstream::UpstreamBody>) -> bool {
    resp.status() == StatusCode::MISDIRECTED_REQUEST
        && resp
            .headers()
            .get(REASON_HEADER)
            .is_some_and(|r| r == HANDOFF_SELF)
}
