//! Session bookkeeping on an answer that is passed through to the client: a new session is
//! recorded from its `initialize`, what a request set on a carried session is noted, a DELETE
//! ends it, and the client gets its own session id back. (Re-establishing a session the
//! upstream forgot is [`super::resume`].)

use http::Method;

use super::{Carried, Proxy, Target, BODY_ID_WAIT};
use crate::replay::BodyHandle;
use crate::session::{self, Recorded};

impl Proxy {
    /// Session bookkeeping on an application answer that is passed through: record a new
    /// session, what a request set on one, its end; give the client its own id back.
    pub(super) async fn after_answer(
        &self,
        target: &Target,
        carried: Option<&Carried>,
        head: &mut http::response::Parts,
        handle: &BodyHandle,
    ) {
        if !self.sessions.enabled() {
            return;
        }
        let Some(c) = carried else {
            let opened = target.method == Method::POST
                && head.status.is_success()
                && !target.headers.contains_key(session::MCP_SESSION_ID);
            if let (true, Some(id)) = (opened, head.headers.get(session::MCP_SESSION_ID)) {
                Box::pin(self.record_session(target, id.clone(), handle)).await;
            }
            return;
        };
        c.session.rewrite_response(&mut head.headers, &c.sent);
        if target.method == Method::DELETE {
            // The client ended the session; later requests on its id get the server's answer.
            self.sessions.forget(c.session.client_id());
            return;
        }
        if !head.status.is_success() {
            return;
        }
        if target.method == Method::GET {
            c.session.stream_opened();
        } else if target.method == Method::POST {
            // The kept copy of the body: what the request set on the session, if anything.
            let changes = handle.with_complete_body(session::rpc::state_changes);
            if let Some(changes) = changes.filter(|c| !c.is_empty()) {
                self.sessions.note_state(&c.session, changes);
            }
        }
    }

    /// Tracks the session an `initialize` just opened, if the request was one.
    async fn record_session(&self, target: &Target, id: http::HeaderValue, handle: &BodyHandle) {
        let Some(body) = handle.read_whole(BODY_ID_WAIT).await else {
            tracing::debug!("a session opened, but its request body was not kept: not tracked");
            return;
        };
        let Some(init) = session::rpc::initialize(&body) else {
            return;
        };
        let version = init
            .protocol_version
            .and_then(|v| http::HeaderValue::from_str(&v).ok());
        if self.sessions.record(id, body, target.uri.clone(), version) == Recorded::TooLarge {
            tracing::info!(
                limit = self.sessions.max_initialize_bytes(),
                "an initialize body is larger than sessions.max_initialize_bytes: its session \
                 is not tracked and will not survive a backend restart"
            );
        }
    }
}
