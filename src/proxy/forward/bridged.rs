//! A 2026-07-28 client's request to a server of the 2025 revision, through the era bridge
//! (src/bridge, docs/design/era-bridge.md 3.4). Each request the bridge sends upstream (the
//! `server/discover` that learns the server's era, the `initialize` that opens a principal's
//! session, the client's request translated) goes through this proxy's own exchange, [`begin`]
//! and [`forward`], as a client's would: it is held through outages, sent again only when that
//! is safe, and its session re-established after the server's restart.
//!
//! [`begin`]: Proxy::begin
//! [`forward`]: Proxy::forward

use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::Proxy;
use crate::bridge::wire::{self, Envelope, Sent, ToLegacy, WireError};
use crate::bridge::{era, Cancel, CancelOnDrop, Direction, Era, Opened, Principal};
use crate::http1::names::{MCP_METHOD, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::metrics::BridgeOutcome;
use crate::proxy::body::ProxyBody;
use crate::proxy::bridged::{Park, Reading, Translated, MAX_EVENT};
use crate::proxy::Note;
use crate::replay::ClientBody;
use crate::respond;
use crate::session::rpc::{self, Reply};

/// What a bridged request comes to: the client's answer and what the access log says of it.
pub(super) type Answered = (Response<ProxyBody>, Note);

/// The access-log action of a request the bridge answered itself.
pub(super) const BRIDGED: crate::proxy::Action = crate::proxy::Action::Bridged;

impl Proxy {
    /// Answers a request [`Bridge::route`] gave the bridge, its body read whole first: a
    /// 2026-07-28 client's (passed as it is when the server speaks that revision, else
    /// translated onto its principal's 2025 session) or a 2025 client's (src/proxy/forward/modern.rs).
    pub(super) async fn bridged(
        &self,
        req: Request<ClientBody>,
        peer: SocketAddr,
        direction: Direction,
    ) -> Answered {
        let version = req.version();
        let (parts, body) = req.into_parts();
        let body = match self.whole_request(body).await {
            Ok(body) => body,
            Err(why) => {
                return (
                    respond::bad_request(why, version),
                    note(None, crate::proxy::Action::BadRequest),
                )
            }
        };
        let (answered, outcome) = match direction {
            Direction::ToLegacy => self.bridge_request(&parts, body, peer).await,
            Direction::ToModern(local) => self.bridge_to_modern(&parts, body, local, peer).await,
        };
        self.metrics.bridge.count(outcome);
        answered
    }

    /// [`Proxy::bridged`] once the body is in: the answer, and what the bridge did.
    async fn bridge_request(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
        peer: SocketAddr,
    ) -> (Answered, BridgeOutcome) {
        let bridge = &*self.bridge;
        let passed = |answered| (answered, BridgeOutcome::passed);
        if self.server_era(parts, peer).await != Era::Legacy {
            return passed(self.inner(head_of(parts), body, peer).await);
        }
        let mut legacy = match wire::request_to_legacy(&body, bridge.next_id()) {
            // Unless answered (`bridge.answer_discover`), `server/discover` gets the server's
            // refusal, and its client goes on in 2025.
            Ok(legacy) if legacy.method == "server/discover" && !bridge.answers_discover() => {
                return passed(self.inner(head_of(parts), body, peer).await)
            }
            Ok(legacy) => legacy,
            // A notification has nowhere to go: a 2026 server takes and drops it.
            Err(WireError::NotRequest) if is_notification(&body) => {
                let accepted = (respond::accepted(), note(None, BRIDGED));
                return (accepted, BridgeOutcome::accepted);
            }
            Err(_) => return passed(self.inner(head_of(parts), body, peer).await),
        };
        let principal = Principal::of(&parts.headers, legacy.envelope.capabilities.as_ref());
        if let Some(retry) = crate::bridge::rounds::retry_of(&body) {
            return self.resume_round(retry, &legacy, principal, peer).await;
        }
        let opened = match self.session_for(principal, parts, &legacy, peer).await {
            Ok(opened) => opened,
            Err(failed) => return (failed, BridgeOutcome::failed),
        };
        match legacy.method.as_str() {
            "server/discover" => {
                let result = wire::discover_result(&opened.server);
                let answer = wire::result_for(&legacy.client_id, result);
                let answered = (respond::json(StatusCode::OK, &answer), note(None, BRIDGED));
                return (answered, BridgeOutcome::translated);
            }
            "subscriptions/listen" => {
                return self
                    .listen_legacy(parts, &body, &legacy, &opened, peer)
                    .await
            }
            _ => {}
        }
        let on_session = || {
            let mut head = head_of(parts);
            wire::headers_to_legacy(head.headers_mut(), &opened.version, opened.session.clone());
            head
        };
        let head = on_session();
        // Armed until the answer is whole: a client that closes its stream first (2026
        // cancellation), or goes away, has the request cancelled on the session.
        let mut cancel = bridge.cancel_on_drop(Cancel {
            head: on_session(),
            upstream_id: legacy.upstream_id,
            peer,
        });
        let sent = Bytes::from(std::mem::take(&mut legacy.body));
        let (resp, note) = self.inner(head, sent, peer).await;
        if note.action == crate::proxy::Action::Resumed {
            // The server restarted: it may have been upgraded across it. The next request asks
            // again which revision it speaks.
            bridge.found(Era::Unknown);
        }
        let refused = matches!(
            resp.status(),
            StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST
        );
        if refused && self.session_refused(&principal, parts, peer).await {
            cancel.answered();
            return passed(self.inner(head_of(parts), body, peer).await);
        }
        let asked = Sent {
            upstream_id: legacy.upstream_id,
            client_id: legacy.client_id,
            method: legacy.method,
            log_level: legacy.envelope.log_level,
        };
        let park = Park {
            bridge: self.bridge.clone(),
            principal,
            head: on_session(),
            peer,
            wait: self.timeouts.stream_idle,
        };
        let translated = (to_modern(resp, asked, cancel, park).await, note);
        (translated, BridgeOutcome::translated)
    }

    /// The principal's session, opened by the first of its requests that needs one, its log
    /// level lowered first when this request opts in to a lower one.
    async fn session_for(
        &self,
        principal: Principal,
        parts: &http::request::Parts,
        legacy: &ToLegacy,
        peer: SocketAddr,
    ) -> Result<Opened, Answered> {
        let bridge = &*self.bridge;
        let slot = bridge.slot(principal);
        let opened = slot
            .get_or_try_init(|| self.open_session(parts, &legacy.envelope, peer))
            .await;
        let opened = match opened {
            Ok(opened) => opened.clone(),
            Err(failed) => {
                bridge.forget(&principal);
                return Err(Box::pin(as_the_clients(failed, &legacy.client_id)).await);
            }
        };
        let wanted = legacy.envelope.log_level.as_deref();
        if let Some(rank) = wanted.and_then(wire::level_rank) {
            if opened.needs_level(rank) {
                self.set_level(parts, &opened, rank, peer).await;
            }
        }
        Ok(opened)
    }

    /// After the server refused a translated request for its session (a 404 or 400 that
    /// holdfast could not answer by re-establishing it; a 2025 server answers a request it
    /// reads at all with 200, its errors inside): the server refused the session, not the call,
    /// which never ran. The principal's next request opens another session, and the server is
    /// asked its revision again: true when it now speaks 2026-07-28, and the request may go as
    /// the client sent it.
    async fn session_refused(
        &self,
        principal: &Principal,
        parts: &http::request::Parts,
        peer: SocketAddr,
    ) -> bool {
        let bridge = &*self.bridge;
        bridge.forget(principal);
        bridge.found(Era::Unknown);
        let era = self.server_era(parts, peer).await;
        if era.speaks_modern() {
            tracing::info!("bridge: the server now speaks 2026-07-28; passing requests through");
        }
        era.speaks_modern()
    }

    /// Sends the cancellations of bridged requests whose clients gave up on them, each with the
    /// proxy current when it comes, for as long as holdfast runs.
    pub async fn bridge_cancellations(current: std::sync::Arc<crate::proxy::current::Current>) {
        let Some(mut cancelled) = current.get().bridge.take_cancellations() else {
            return;
        };
        while let Some(cancel) = cancelled.recv().await {
            let proxy = current.get();
            // One task each: a cancellation held through an outage keeps no other waiting.
            tokio::spawn(async move { proxy.cancel_bridged(cancel).await });
        }
    }

    /// `notifications/cancelled` for `cancel`'s request, on its session.
    async fn cancel_bridged(&self, cancel: Cancel) {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": cancel.upstream_id, "reason": "the client closed its stream"},
        });
        let (resp, _) = self
            .inner(cancel.head, body.to_string().into(), cancel.peer)
            .await;
        tracing::debug!(status = %resp.status(), id = cancel.upstream_id, "bridge: a request cancelled");
        let _ = read_whole(resp.into_body()).await;
    }

    /// Lowers the session's log level to `rank` (`logging/setLevel`, which the session table
    /// records as the session's state, so a re-established session gets it again).
    async fn set_level(
        &self,
        parts: &http::request::Parts,
        opened: &Opened,
        rank: usize,
        peer: SocketAddr,
    ) {
        let level = wire::LEVELS[rank];
        let params = serde_json::json!({ "level": level });
        match self
            .on_session(parts, opened, "logging/setLevel", params, peer)
            .await
        {
            (status, Ok(Reply::Result(_))) if status.is_success() => opened.level_set(rank),
            (status, reply) => {
                tracing::warn!(%status, ?reply, level, "bridge: logging/setLevel refused");
            }
        }
    }

    /// A request of the bridge's own, `method` with `params`, on `opened`'s session with the
    /// client's credentials: the status and the JSON-RPC reply of its answer.
    pub(super) async fn on_session(
        &self,
        parts: &http::request::Parts,
        opened: &Opened,
        method: &str,
        params: serde_json::Value,
        peer: SocketAddr,
    ) -> (StatusCode, Result<Reply, ()>) {
        let mut head = own_head(parts);
        wire::headers_to_legacy(head.headers_mut(), &opened.version, opened.session.clone());
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.bridge.next_id(),
            "method": method,
            "params": params,
        });
        let (resp, _) = self.inner(head, body.to_string().into(), peer).await;
        let status = resp.status();
        (status, reply_of(resp).await)
    }

    /// What the server speaks: as known, or asked now when it is not (and recorded, with its
    /// DiscoverResult, when the answer was clear).
    pub(super) async fn server_era(&self, parts: &http::request::Parts, peer: SocketAddr) -> Era {
        let bridge = &*self.bridge;
        let known = bridge.era();
        if known != Era::Unknown {
            return known;
        }
        let era = self.ask_era(parts, peer, bridge.next_id()).await;
        if era != Era::Unknown {
            tracing::info!(?era, "bridge: the server's era found");
            bridge.found(era);
        }
        era
    }

    /// What the server speaks, asked with a `server/discover` of the 2026 revision.
    async fn ask_era(&self, parts: &http::request::Parts, peer: SocketAddr, id: u64) -> Era {
        let mut head = own_head(parts);
        let h = head.headers_mut();
        h.insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static(wire::MODERN));
        h.insert(MCP_METHOD, HeaderValue::from_static("server/discover"));
        let (resp, _) = self.inner(head, era::discover(id).into(), peer).await;
        let status = resp.status();
        let reply = reply_of(resp).await.unwrap_or(Reply::Nothing);
        let era = era::from_discover(status, &reply);
        if let (Era::Modern, Reply::Result(result)) = (era, reply) {
            self.bridge.discovered(result);
        }
        era
    }

    /// Opens a 2025 session for a principal: an `initialize` with its client's capabilities,
    /// then `notifications/initialized`. The session table records it as any client's, so the
    /// token the bridge keeps is holdfast's sealed one.
    async fn open_session(
        &self,
        parts: &http::request::Parts,
        envelope: &Envelope,
        peer: SocketAddr,
    ) -> Result<Opened, Answered> {
        let bridge = &*self.bridge;
        let head = own_head(parts);
        let body = wire::legacy_initialize(envelope, bridge.next_id());
        let (resp, note) = self.inner(head, body.into(), peer).await;
        if !resp.status().is_success() {
            // Holdfast's 503 of an outage, the server's refusal: the client gets it as it is.
            return Err((resp, note));
        }
        let Some(session) = resp.headers().get(MCP_SESSION_ID).cloned() else {
            let why = "its answer to initialize named no session (Mcp-Session-Id)";
            return Err((respond::bridge_failed(why), note));
        };
        let result = match reply_of(resp).await {
            Ok(Reply::Result(result)) => result,
            Ok(Reply::Error(code, message)) => {
                let why = format!("it answered initialize with JSON-RPC error {code} ({message})");
                return Err((respond::bridge_failed(&why), note));
            }
            Ok(Reply::Nothing) | Err(_) => {
                let why = "its answer to initialize held no JSON-RPC result";
                return Err((respond::bridge_failed(why), note));
            }
        };
        let version = result["protocolVersion"]
            .as_str()
            .unwrap_or(wire::LEGACY)
            .to_owned();
        let mut head = own_head(parts);
        wire::headers_to_legacy(head.headers_mut(), &version, session.clone());
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let (done, _) = self
            .inner(head, Bytes::from_static(initialized.as_bytes()), peer)
            .await;
        if !done.status().is_success() {
            tracing::warn!(status = %done.status(), "bridge: notifications/initialized refused");
        }
        tracing::info!(%version, "bridge: a 2025 session opened for 2026-07-28 clients");
        Ok(Opened {
            session,
            version,
            server: std::sync::Arc::new(result),
            level: Default::default(),
            subscribed: Default::default(),
            feed: Default::default(),
        })
    }

    /// One request through this proxy's own exchange, its body from memory.
    pub(super) async fn inner(&self, head: Request<()>, body: Bytes, peer: SocketAddr) -> Answered {
        let (mut parts, ()) = head.into_parts();
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        let version = parts.version;
        let req = Request::from_parts(parts, ClientBody::memory(body));
        match self.begin(req, peer) {
            Ok(mut ex) => self.forward(&mut ex).await,
            Err((Some(why), _)) => (
                respond::bad_request(why, version),
                note(None, crate::proxy::Action::BadRequest),
            ),
            Err((None, _)) => (
                respond::handoff_to_self(),
                note(None, crate::proxy::Action::HandoffSelf),
            ),
        }
    }

    /// The client's whole request body, within what a replay may keep.
    async fn whole_request(&self, body: ClientBody) -> Result<Bytes, &'static str> {
        let read = tokio::time::timeout(
            self.timeouts.stream_idle,
            whole(body, self.bodies.replay_cap),
        );
        match read.await {
            Ok(Some(body)) => Ok(body),
            Ok(None) => Err(
                "the body of a bridged request is unreadable or larger than hold.max_body_bytes",
            ),
            Err(_) => Err("the body of a bridged request stopped arriving"),
        }
    }
}

/// A body read whole, up to `max` bytes; `None` if it failed or was longer. (Not
/// `http_body_util::Limited`: its boxed error makes the request's future lose `Send`.)
async fn whole<B: http_body::Body<Data = Bytes> + Unpin>(mut body: B, max: usize) -> Option<Bytes> {
    let mut read = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if read.len() + data.len() > max {
                return None;
            }
            read.extend_from_slice(&data);
        }
    }
    Some(read.freeze())
}

/// The access-log note of an answer.
pub(super) fn note(upstream_status: Option<StatusCode>, action: crate::proxy::Action) -> Note {
    Note {
        upstream_status,
        action,
    }
}

/// A copy of a request head of the bridge's.
pub(super) fn copy(head: &Request<()>) -> Request<()> {
    let mut req = Request::new(());
    *req.method_mut() = head.method().clone();
    *req.uri_mut() = head.uri().clone();
    *req.version_mut() = head.version();
    *req.headers_mut() = head.headers().clone();
    req
}

/// A copy of the client's request head.
pub(super) fn head_of(parts: &http::request::Parts) -> Request<()> {
    let mut req = Request::new(());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req
}

/// The head of a request of the bridge's own, sent for the client: its credentials and its
/// client's headers, without what named the client's own message (the 2026 routing headers,
/// a session, the version).
pub(super) fn own_head(parts: &http::request::Parts) -> Request<()> {
    let mut req = head_of(parts);
    let h = req.headers_mut();
    let named: Vec<_> = h
        .keys()
        .filter(|n| n.as_str().starts_with("mcp-"))
        .cloned()
        .collect();
    for name in named {
        h.remove(name);
    }
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    req
}

/// Whether a body is one JSON-RPC notification (a method, no id).
pub(super) fn is_notification(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|m| m.get("method").is_some() && m.get("id").is_none())
}

/// The JSON-RPC response in an answer, read whole (bounded).
pub(super) async fn reply_of(resp: Response<ProxyBody>) -> Result<Reply, ()> {
    let is_sse = crate::proxy::headers::is_event_stream(resp.headers());
    let body = read_whole(resp.into_body()).await?;
    Ok(rpc::reply(is_sse, &body))
}

/// A body read whole, up to [`MAX_EVENT`].
/// An answer to a request of the bridge's own (its `initialize`), passed to the client whose
/// request it was for: a JSON-RPC body names the client's id, not the bridge's (which means
/// nothing to the client, and may be another request's of its own).
async fn as_the_clients(answered: Answered, client_id: &serde_json::Value) -> Answered {
    let (resp, note) = answered;
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = read_whole(body).await else {
        let why = "its refusal of the session could not be read";
        return (respond::bridge_failed(why), note);
    };
    let bytes = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(mut message) if message.get("id").is_some() => {
            message["id"] = client_id.clone();
            Bytes::from(message.to_string())
        }
        _ => bytes,
    };
    (respond::rewritten(parts, bytes), note)
}

pub(super) async fn read_whole(body: ProxyBody) -> Result<Bytes, ()> {
    let read = whole(body, MAX_EVENT).await;
    if read.is_none() {
        tracing::debug!("bridge: an answer could not be read whole");
    }
    read.ok_or(())
}

/// The server's answer as the 2026 client expects it: its id, the 2026 result fields, no
/// session of the bridge's. An event stream is translated as it flows; a JSON answer whole.
async fn to_modern(
    resp: Response<ProxyBody>,
    asked: Sent,
    mut cancel: CancelOnDrop,
    park: Park,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(MCP_SESSION_ID);
    if crate::proxy::headers::is_event_stream(&parts.headers) {
        parts.headers.remove(CONTENT_LENGTH);
        let translated = Translated::new(body, Reading::Answer(asked), Some(cancel)).parking(park);
        return Response::from_parts(parts, ProxyBody::new(translated));
    }
    // Whatever else comes is the whole answer (read below, or passed as it is).
    cancel.answered();
    let is_json = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("application/json"));
    if !is_json {
        return Response::from_parts(parts, body);
    }
    let Ok(bytes) = read_whole(body).await else {
        return respond::bad_gateway(crate::classify::FailReason::Protocol, parts.version);
    };
    let out = wire::answer_to_modern(&bytes, &asked.client_id, &asked.method)
        .map(Bytes::from)
        .unwrap_or(bytes);
    respond::rewritten(parts, out)
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_refusal_of_the_bridges_request_names_the_clients_id() {
        let refused =
            json!({"jsonrpc": "2.0", "id": 5, "error": {"code": -32600, "message": "no"}});
        let resp = respond::json(StatusCode::UNAUTHORIZED, &refused);
        let answered = (resp, note(None, crate::proxy::Action::Bridged));
        let (resp, _) = as_the_clients(answered, &json!("client-7")).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let message: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(message["id"], "client-7");
        assert_eq!(message["error"]["message"], "no");
        // A body that is no JSON-RPC message passes as it is.
        let plain = respond::ok_text("text/plain", "nope".into());
        let answered = (plain, note(None, crate::proxy::Action::Bridged));
        let (resp, _) = as_the_clients(answered, &json!(1)).await;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"nope");
    }
}
