//! A 2026-07-28 client's retry of an input round (src/bridge/rounds.rs): its response goes to
//! the 2025 server as the answer to the server's request, on the call's session, and the
//! parked rest of the call's stream becomes the retry's answer.

use std::net::SocketAddr;

use http::StatusCode;

use super::bridged::{copy, note, read_whole, Answered, BRIDGED};
use super::Proxy;
use crate::bridge::rounds::{self, Retry};
use crate::bridge::wire::ToLegacy;
use crate::bridge::Principal;
use crate::metrics::BridgeOutcome;
use crate::proxy::body::ProxyBody;
use crate::proxy::bridged::{Park, Translated};
use crate::respond;

impl Proxy {
    /// Answers `legacy`, the retry `retry` of `principal`'s input round.
    pub(super) async fn resume_round(
        &self,
        retry: Retry,
        legacy: &ToLegacy,
        principal: Principal,
        peer: SocketAddr,
    ) -> (Answered, BridgeOutcome) {
        let refuse = |status, why: serde_json::Value| {
            let answered = (respond::json(status, &why), note(None, BRIDGED));
            (answered, BridgeOutcome::failed)
        };
        let Some(parked) = self.bridge.rounds().take(&retry.state, &principal) else {
            let gone = rounds::round_gone(&legacy.client_id);
            return refuse(StatusCode::BAD_REQUEST, gone);
        };
        let answer = rounds::answer_to_ask(&parked.ask, &retry.responses);
        let (resp, upstream) = self
            .inner(copy(&parked.head), answer.into(), parked.peer)
            .await;
        let status = resp.status();
        let _ = read_whole(resp.into_body()).await;
        if !status.is_success() {
            // The server did not take the answer (its session is gone with it): the call it
            // waited in cannot finish. Dropping the round cancels it.
            tracing::warn!(%status, "bridge: the server refused the answer to its request");
            let failed = serde_json::json!({"jsonrpc": "2.0", "id": legacy.client_id, "error": {
                "code": -32603,
                "message": format!("the server refused the input round's answer ({status}): call again"),
            }});
            let bad = respond::json(StatusCode::BAD_GATEWAY, &failed);
            return ((bad, upstream), BridgeOutcome::failed);
        }
        let park = Park {
            bridge: self.bridge.clone(),
            principal,
            head: copy(&parked.head),
            peer,
            wait: self.timeouts.stream_idle,
        };
        let stream = Translated::resume(parked, legacy.client_id.clone(), park);
        let resp = respond::event_stream(ProxyBody::new(stream));
        ((resp, note(None, BRIDGED)), BridgeOutcome::translated)
    }
}
