//! A 2025 client's request to a server that speaks only 2026-07-28, through the era bridge
//! (src/bridge/modern.rs, docs/design/era-bridge.md 3.6). Its `initialize` is answered here
//! from the server's `server/discover`, with a session token of holdfast's that carries the
//! client's `initialize` (so any holdfast with the key serves it, after a restart or on another
//! replica); each of its requests goes with the 2026 envelope built from it; what the revision
//! dropped (ping, log levels, notifications, DELETE) is answered here.

use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use http::{Method, Response, StatusCode};
use serde_json::{json, Value};

use super::bridged::{copy, head_of, note, read_whole, reply_of, Answered, BRIDGED};
use super::Proxy;
use crate::bridge::modern::{self, Local};
use crate::bridge::Era;
use crate::metrics::BridgeOutcome;
use crate::proxy::asking::{Cancellable, Relayed, Start};
use crate::proxy::body::ProxyBody;
use crate::proxy::bridged::{Reading, Translated};
use crate::respond;
use crate::session::rpc::{self, Reply};
use crate::session::token::Contents;
use crate::session::{LAST_EVENT_ID, MCP_SESSION_ID};

impl Proxy {
    /// The contents of a session token of holdfast's that no server keeps, while it is valid.
    pub(super) fn open_token(&self, token: &[u8]) -> Option<Contents> {
        self.keeper.sessions.open_untracked(token)
    }

    /// [`Proxy::bridged`] for a 2025 client: `local` is its session's token, when it names one
    /// holdfast answered itself.
    pub(super) async fn bridge_to_modern(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
        local: Option<Box<Contents>>,
        peer: SocketAddr,
    ) -> (Answered, BridgeOutcome) {
        let bridge = &*self.bridge;
        let accepted = |resp| ((resp, note(None, BRIDGED)), BridgeOutcome::accepted);
        if local.is_some() && parts.method == Method::DELETE {
            // Nothing stands behind the session upstream: ending it is refusing its token from
            // now on, as for any session the client ended.
            if let Some(token) = parts.headers.get(MCP_SESSION_ID) {
                self.keeper.sessions.end(token);
                bridge.forget_local(token.as_bytes());
            }
            return accepted(respond::empty(StatusCode::OK));
        }
        if local.is_some() && parts.method == Method::GET {
            let initialize = local.as_ref().map(|c| &c.initialize[..]);
            return match self.listen(parts, initialize, peer).await {
                Some(listening) => (listening, BridgeOutcome::translated),
                // Nothing to listen for: the 405 a 2025 server may give, which clients take as
                // "no stream".
                None => {
                    let mut resp = respond::empty(StatusCode::METHOD_NOT_ALLOWED);
                    resp.headers_mut()
                        .insert(ALLOW, HeaderValue::from_static("POST, DELETE"));
                    accepted(resp)
                }
            };
        }
        let passed = |answered| (answered, BridgeOutcome::passed);
        let era = self.server_era(parts, peer).await;
        let discovered = bridge.discover_result().filter(|_| era.speaks_modern());
        let Some(discovered) = discovered.filter(|_| era != Era::Both || local.is_some()) else {
            // A server of the client's revision, or one that said nothing clear: as it came.
            return passed(self.inner(head_of(parts), body, peer).await);
        };
        let message: Value = serde_json::from_slice(&body).unwrap_or_default();
        if local.is_none() && message["method"] == "initialize" && message.get("id").is_some() {
            if era == Era::Modern {
                // Whether it takes the handshake as well: then the client needs no bridge.
                if let Some(taken) = self.try_handshake(parts, &body, peer).await {
                    return passed(taken);
                }
            }
            let resp = self.answer_initialize(parts, &body, &message, &discovered);
            return accepted(resp);
        }
        let initialize = local.as_ref().map(|c| &c.initialize[..]);
        if let Some(answered) = self
            .answer_locally(parts, &body, &message, initialize, peer)
            .await
        {
            return answered;
        }
        self.send_modern(parts, body, &message, initialize, peer)
            .await
    }

    /// What a 2025 client sends that holdfast answers itself (`modern::local`): the methods and
    /// messages the 2026-07-28 revision dropped, kept as the local session's state (its level,
    /// its subscriptions) or handed to who waits for them (an answer to a question of the
    /// server's, a cancellation). `initialize` is the session's, when it is a local one.
    async fn answer_locally(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        message: &Value,
        initialize: Option<&[u8]>,
        peer: SocketAddr,
    ) -> Option<(Answered, BridgeOutcome)> {
        let bridge = &*self.bridge;
        let accepted = |resp| ((resp, note(None, BRIDGED)), BridgeOutcome::accepted);
        // Only a local session keeps state here; another's token is not one to key it by.
        let token = parts.headers.get(MCP_SESSION_ID).map(HeaderValue::as_bytes);
        let local = initialize.is_some();
        let empty = |id| {
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}});
            accepted(respond::json(StatusCode::OK, &answer))
        };
        match modern::local(body)? {
            Local::SetLevel(id, level) if local => {
                if let Some(token) = token {
                    bridge.set_local_level(token, level);
                }
                Some(empty(id))
            }
            Local::Subscribe(id, uri) if local => {
                let open = token.and_then(|token| bridge.subscribe_local(token, &uri));
                if let Some(stream) = open {
                    let more = modern::Listen::Updates(&uri);
                    self.listen_into(parts, initialize, more, stream, peer)
                        .await;
                }
                Some(empty(id))
            }
            Local::Unsubscribe(id, uri) if local => {
                if let Some(token) = token {
                    bridge.unsubscribe_local(token, &uri);
                }
                Some(empty(id))
            }
            Local::Empty(id)
            | Local::SetLevel(id, _)
            | Local::Subscribe(id, _)
            | Local::Unsubscribe(id, _) => Some(empty(id)),
            Local::Accepted => {
                // Perhaps the client's answer to a question holdfast asked it for the server, or
                // its cancellation of a call in progress.
                if let (Some(token), true) = (token, local) {
                    if message["method"] == "notifications/cancelled" {
                        bridge.cancel_call(token, &message["params"]["requestId"]);
                    } else {
                        bridge.asks().answer(token, message.clone());
                    }
                }
                Some(accepted(respond::accepted()))
            }
        }
    }

    /// A 2025 client's request sent to the 2026-07-28 server in its revision's shape: the
    /// envelope and routing headers, the session's level; a call whose headers the server
    /// refused goes again once with its tools listed anew; the answer is watched for input rounds
    /// the client is to be asked, and can be cancelled by the client.
    async fn send_modern(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
        message: &Value,
        initialize: Option<&[u8]>,
        peer: SocketAddr,
    ) -> (Answered, BridgeOutcome) {
        let bridge = &*self.bridge;
        let passed = |answered| (answered, BridgeOutcome::passed);
        let token = parts.headers.get(MCP_SESSION_ID).map(HeaderValue::as_bytes);
        let local = initialize.is_some();
        let level = token.filter(|_| local).and_then(|t| bridge.local_level(t));
        let Ok(request) = modern::request_to_modern(&body, initialize, level) else {
            return passed(self.inner(head_of(parts), body, peer).await);
        };
        let is_call = request.method == "tools/call";
        let call_head = || async {
            let mut head = modern_head(parts, &request.method, request.name.as_deref());
            if is_call {
                let params = self.param_headers(parts, initialize, message, peer);
                head.headers_mut().extend(params.await);
            }
            head
        };
        let sent = Bytes::from(request.body.clone());
        let mut head = call_head().await;
        // The client may cancel it (`notifications/cancelled`) from here on: before its answer
        // came, the request is given up (the server sees its connection close); while the
        // answer streams, the stream is closed.
        let call = token.filter(|_| local);
        let mut call = call.and_then(|token| self.bridge.call_started(token, &message["id"]));
        let first = self.inner(copy(&head), sent.clone(), peer);
        let (mut resp, mut note) = match call.as_mut() {
            Some((cancelled, _)) => tokio::select! {
                answered = first => answered,
                () = cancelled.wait() => {
                    let gone = respond::empty(StatusCode::ACCEPTED);
                    return ((gone, note(None, crate::proxy::Action::Cancelled)), BridgeOutcome::translated);
                }
            },
            None => first.await,
        };
        if is_call && resp.status() == StatusCode::BAD_REQUEST {
            let mismatch;
            (resp, mismatch) = header_mismatch(resp).await;
            if mismatch {
                // The server checks a call's headers before it runs it: the call did not run.
                // Its tools changed since they were listed; listed anew, the call goes again.
                bridge.unlearn_mirrored();
                head = call_head().await;
                (resp, note) = self.inner(copy(&head), sent.clone(), peer).await;
            }
        }
        let watched = token.filter(|_| modern::may_be_asked(initialize));
        let start = watched.map(|token| Start {
            bridge: self.bridge.clone(),
            head,
            sent,
            client_id: message["id"].clone(),
            token: token.to_vec(),
            peer,
        });
        // A call of a session holdfast answered may be answered with an input round: its
        // client is asked on the call's stream.
        let resp = match start {
            Some(start) => self.watch_for_rounds(&request.method, resp, start).await,
            None => resp,
        };
        let resp = match call {
            Some((cancelled, entry)) => {
                resp.map(|body| ProxyBody::new(Cancellable::new(body, cancelled, entry)))
            }
            None => resp,
        };
        ((resp, note), BridgeOutcome::translated)
    }

    /// A 2025 client's GET stream, as a `subscriptions/listen` of every list change the server
    /// announces and of the updates of the URIs the session subscribed to: its events
    /// translated as they come, and those of the listens added by later subscriptions. `None`
    /// when the server speaks another revision, or announces nothing. The stream ends when the
    /// server's listens do (its restart); the client opens it again, as it would a 2025
    /// server's.
    async fn listen(
        &self,
        parts: &http::request::Parts,
        initialize: Option<&[u8]>,
        peer: SocketAddr,
    ) -> Option<Answered> {
        let bridge = &*self.bridge;
        let token = parts.headers.get(MCP_SESSION_ID)?.as_bytes();
        let uris = bridge.local_uris(token);
        let what = modern::Listen::Everything(&uris);
        let (resp, note) = self.open_listen(parts, initialize, what, peer).await?;
        if !crate::proxy::headers::is_event_stream(resp.headers()) {
            return Some((resp, note));
        }
        let (mut parts, body) = resp.into_parts();
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let (to, stream) = tokio::sync::mpsc::channel(crate::bridge::feed::LISTEN_BACKLOG);
        bridge.local_stream(token, &to);
        let translated = Translated::new(body, Reading::Listen, None);
        tokio::spawn(crate::proxy::asking::pump(translated, to));
        let body = ProxyBody::new(Relayed::written(stream));
        Some((Response::from_parts(parts, body), note))
    }

    /// Adds a listen of `what` to the client's open GET stream `to` (a URI it subscribed to).
    async fn listen_into(
        &self,
        parts: &http::request::Parts,
        initialize: Option<&[u8]>,
        what: modern::Listen<'_>,
        to: tokio::sync::mpsc::Sender<Bytes>,
        peer: SocketAddr,
    ) {
        let Some((resp, _)) = self.open_listen(parts, initialize, what, peer).await else {
            return;
        };
        if !crate::proxy::headers::is_event_stream(resp.headers()) {
            tracing::warn!(status = %resp.status(), "bridge: a listen for a subscription refused");
            return;
        }
        let translated = Translated::new(resp.into_body(), Reading::Listen, None);
        tokio::spawn(crate::proxy::asking::pump(translated, to));
    }

    /// The server's answer to a `subscriptions/listen` of `what`, `None` when there is nothing
    /// to listen for.
    async fn open_listen(
        &self,
        parts: &http::request::Parts,
        initialize: Option<&[u8]>,
        what: modern::Listen<'_>,
        peer: SocketAddr,
    ) -> Option<Answered> {
        let bridge = &*self.bridge;
        let era = self.server_era(parts, peer).await;
        let discovered = bridge.discover_result().filter(|_| era.speaks_modern())?;
        let body = modern::listen_request(&discovered, bridge.next_id(), initialize, what)?;
        let mut head = modern_head(parts, "subscriptions/listen", None);
        *head.method_mut() = Method::POST;
        let h = head.headers_mut();
        h.remove(LAST_EVENT_ID);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        Some(self.inner(head, body.into(), peer).await)
    }

    /// The `Mcp-Param-*` headers of the `tools/call` `message`, from what the server's tools
    /// mirror: listed once (all pages), with the client's envelope, when not known yet.
    async fn param_headers(
        &self,
        parts: &http::request::Parts,
        initialize: Option<&[u8]>,
        message: &Value,
        peer: SocketAddr,
    ) -> Vec<(http::HeaderName, HeaderValue)> {
        let bridge = &*self.bridge;
        let mirrored = match bridge.mirrored() {
            Some(known) => known,
            None => {
                let listed = self.list_tools(parts, initialize, peer).await;
                bridge.learn_mirrored(listed);
                bridge.mirrored().unwrap_or_default()
            }
        };
        let tool = message["params"]["name"].as_str().unwrap_or_default();
        match mirrored.get(tool) {
            Some(m) => modern::param_headers(m, &message["params"]["arguments"]),
            None => Vec::new(),
        }
    }

    /// What every tool of the server mirrors in headers: its `tools/list`, page by page.
    async fn list_tools(
        &self,
        parts: &http::request::Parts,
        initialize: Option<&[u8]>,
        peer: SocketAddr,
    ) -> Vec<(String, modern::Mirrored)> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for page in 0..MAX_PAGES {
            let mut params = json!({});
            if let Some(cursor) = &cursor {
                params["cursor"] = json!(cursor);
            }
            let list = json!({"jsonrpc": "2.0", "id": format!("hf-list-{page}"), "method": "tools/list", "params": params});
            let Ok(request) =
                modern::request_to_modern(list.to_string().as_bytes(), initialize, None)
            else {
                break;
            };
            let head = modern_head(parts, "tools/list", None);
            let (resp, _) = self.inner(head, request.body.into(), peer).await;
            let Ok(crate::session::rpc::Reply::Result(result)) = reply_of(resp).await else {
                break;
            };
            tools.extend(modern::mirrored(&result));
            cursor = result["nextCursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        tools
    }

    /// Sends a 2025 client's `initialize` to a server that speaks 2026-07-28, to learn whether it
    /// takes the handshake too: its answer when it did (the server is [`Era::Both`] from then
    /// on, and 2025 clients pass as they came), `None` when it refused ([`Era::ModernOnly`]: they
    /// are bridged). An answer that says neither (an outage's 503, a server's error) is the
    /// client's as it is, and decides nothing.
    async fn try_handshake(
        &self,
        parts: &http::request::Parts,
        body: &Bytes,
        peer: SocketAddr,
    ) -> Option<Answered> {
        let (resp, note) = self.inner(head_of(parts), body.clone(), peer).await;
        let status = resp.status();
        if status.is_server_error() {
            return Some((resp, note));
        }
        let (answer, answer_body) = resp.into_parts();
        let is_sse = crate::proxy::headers::is_event_stream(&answer.headers);
        let Ok(bytes) = read_whole(answer_body).await else {
            let failed = respond::bad_gateway(crate::classify::FailReason::Protocol, parts.version);
            return Some((failed, note));
        };
        let reply = rpc::reply(is_sse, &bytes);
        // Only a well-formed initialize's refusal says the server refuses the handshake: a
        // client's malformed one is refused for itself.
        let era = match crate::bridge::era::from_handshake(status, &reply) {
            Some(Era::ModernOnly) if !crate::bridge::era::well_formed_initialize(body) => None,
            era => era,
        };
        let Some(era) = era else {
            return Some((respond::rewritten(answer, bytes), note));
        };
        if era == Era::Both {
            tracing::info!(
                "bridge: the server takes both revisions; 2025 clients pass as they come"
            );
            self.bridge.found(Era::Both);
            return Some((respond::rewritten(answer, bytes), note));
        }
        tracing::info!(%status, "bridge: the server refused the 2025 handshake; 2025 clients are bridged");
        self.bridge.found(Era::ModernOnly);
        None
    }

    /// The answer to a 2025 client's `initialize` for a 2026-07-28-only server, with a session
    /// token that carries the `initialize` (its capabilities and identity go in every request).
    fn answer_initialize(
        &self,
        parts: &http::request::Parts,
        body: &Bytes,
        message: &Value,
        discovered: &Value,
    ) -> Response<crate::proxy::body::ProxyBody> {
        let requested = message["params"]["protocolVersion"].as_str();
        let result = modern::initialize_result(discovered, requested);
        let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": result});
        let mut resp = respond::json(StatusCode::OK, &answer);
        let version = result["protocolVersion"]
            .as_str()
            .and_then(|v| HeaderValue::from_str(v).ok());
        let local = HeaderValue::from_static(modern::LOCAL_SESSION);
        let sessions = &self.keeper.sessions;
        match sessions.seal_untracked(local, body.clone(), &parts.uri, version) {
            Some(token) => {
                resp.headers_mut().insert(MCP_SESSION_ID, token);
            }
            // Too large to seal: the client goes on without a session, its requests without
            // its capabilities (a 2026 server then assumes it has none).
            None => tracing::warn!("bridge: an initialize too large for a session token"),
        }
        tracing::info!("bridge: a 2025 client's initialize answered for a 2026-07-28 server");
        resp
    }
}

/// Pages of `tools/list` read for what the tools mirror in headers, at most.
const MAX_PAGES: usize = 16;

/// A 400 of the server's, read, and whether it refused a call for its `Mcp-Param-*` headers
/// (`-32020`, header mismatch).
async fn header_mismatch(resp: Response<ProxyBody>) -> (Response<ProxyBody>, bool) {
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = read_whole(body).await else {
        let failed = respond::bad_gateway(crate::classify::FailReason::Protocol, parts.version);
        return (failed, false);
    };
    let is_sse = crate::proxy::headers::is_event_stream(&parts.headers);
    let reply = rpc::reply(is_sse, &bytes);
    let mismatch = matches!(reply, Reply::Error(code, _) if code == HEADER_MISMATCH);
    (respond::rewritten(parts, bytes), mismatch)
}

/// The JSON-RPC error a 2026-07-28 server refuses a request with whose headers do not say what
/// its body does.
const HEADER_MISMATCH: i64 = -32020;

/// A 2025 client's request head made a 2026-07-28 one's: no session, the routing headers.
fn modern_head(
    parts: &http::request::Parts,
    method: &str,
    name: Option<&str>,
) -> http::Request<()> {
    let mut head = head_of(parts);
    let h = head.headers_mut();
    h.remove(MCP_SESSION_ID);
    for (header, value) in modern::routing_headers(method, name) {
        h.insert(header, value);
    }
    head
}
