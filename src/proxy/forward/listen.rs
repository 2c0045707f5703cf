//! A 2026-07-28 client's `subscriptions/listen`, bridged to its principal's 2025 session
//! (docs/design/era-bridge.md 3.4): the URIs it names subscribed on the session with
//! `resources/subscribe` (recorded state, so a re-established session has them again), the
//! session's GET stream opened once and shared by the principal's listens (src/bridge/feed.rs),
//! and the answer an event stream of what the listen asked for (src/proxy/listening.rs).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, StatusCode};
use serde_json::Value;

use super::bridged::{note, own_head, Answered, BRIDGED};
use super::Proxy;
use crate::bridge::feed::{Feed, Reader};
use crate::bridge::listen::Filter;
use crate::bridge::wire::{self, ToLegacy};
use crate::bridge::Opened;
use crate::metrics::BridgeOutcome;
use crate::proxy::body::ProxyBody;
use crate::proxy::listening::Listening;
use crate::respond;
use crate::session::rpc::Reply;

impl Proxy {
    /// Answers the listen `legacy` (its 2026 request `body`) on the session `opened`.
    pub(super) async fn listen_legacy(
        &self,
        parts: &http::request::Parts,
        body: &Bytes,
        legacy: &ToLegacy,
        opened: &Opened,
        peer: SocketAddr,
    ) -> (Answered, BridgeOutcome) {
        let params = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|mut m| m.get_mut("params").map(Value::take));
        let asked = Filter::of_request(params.as_ref());
        let mut honoured = asked.honoured(&opened.server["capabilities"]);
        let mut subscribed = Vec::with_capacity(honoured.uris.len());
        for uri in std::mem::take(&mut honoured.uris) {
            if opened.is_subscribed(&uri) || self.subscribe(parts, opened, &uri, peer).await {
                subscribed.push(uri);
            }
        }
        honoured.uris = subscribed;
        let reader = if honoured == Filter::default() {
            None
        } else {
            match self.feed_of(parts, opened, peer).await {
                Ok(Some(reader)) => Some(reader),
                // The server has no GET stream: nothing it sends can reach the listen.
                Ok(None) => {
                    honoured = Filter::default();
                    None
                }
                Err(failed) => return (failed, BridgeOutcome::failed),
            }
        };
        let stream = Listening::new(legacy.client_id.clone(), honoured, reader);
        let resp = respond::event_stream(ProxyBody::new(stream));
        ((resp, note(None, BRIDGED)), BridgeOutcome::translated)
    }

    /// `resources/subscribe` of `uri` on the session: whether the server took it.
    async fn subscribe(
        &self,
        parts: &http::request::Parts,
        opened: &Opened,
        uri: &str,
        peer: SocketAddr,
    ) -> bool {
        let params = serde_json::json!({ "uri": uri });
        let asked = self.on_session(parts, opened, "resources/subscribe", params, peer);
        match asked.await {
            (status, Ok(Reply::Result(_))) if status.is_success() => {
                opened.subscribed_to(uri);
                true
            }
            (status, reply) => {
                tracing::warn!(%status, ?reply, uri, "bridge: resources/subscribe refused");
                false
            }
        }
    }

    /// A place on the session's GET stream, opened if no listen reads it now: `None` when the
    /// server has none (405), the answer for the client when it could not be opened (an outage).
    async fn feed_of(
        &self,
        parts: &http::request::Parts,
        opened: &Opened,
        peer: SocketAddr,
    ) -> Result<Option<Reader>, Answered> {
        let mut current = opened.feed.lock().await;
        if let Some(reader) = current.as_ref().and_then(Feed::join) {
            return Ok(Some(reader));
        }
        let mut head = own_head(parts);
        *head.method_mut() = Method::GET;
        let h = head.headers_mut();
        h.remove(CONTENT_TYPE);
        h.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        wire::headers_to_legacy(h, &opened.version, opened.session.clone());
        let (resp, note) = self.inner(head, Bytes::new(), peer).await;
        let status = resp.status();
        // A server without a GET stream says 405: nothing it sends can reach a listen. Any other
        // refusal (an outage's 503, a session it lost) is the client's to see: it listens again.
        if status == StatusCode::METHOD_NOT_ALLOWED {
            tracing::info!("bridge: the server has no GET stream; listens get nothing");
            return Ok(None);
        }
        if !status.is_success() || !crate::proxy::headers::is_event_stream(resp.headers()) {
            return Err((resp, note));
        }
        let feed = Arc::new(Feed::default());
        let reader = feed.join();
        tokio::spawn(feed.clone().pump(resp.into_body()));
        *current = Some(feed);
        Ok(reader)
    }
}
