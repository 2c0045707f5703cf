//! Session bookkeeping on an answer that is passed through to the client: a new session is
//! recorded from its `initialize`, what a request set on a carried session is noted, a DELETE
//! ends it, and the client gets its own session id back. (Re-establishing a session the
//! upstream forgot is [`super::resume`].)

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{Carried, Target, BODY_ID_WAIT};
use crate::metrics::Metrics;
use crate::replay::BodyHandle;
use crate::session::shared::StoreError;
use crate::session::{self, Plan, Recorded, Session, Table, TokenRefusal};

/// What an answer's session bookkeeping leaves to do.
pub(super) enum After {
    /// Pass the answer; with a state change it sets, once its body confirms it.
    Pass(Option<super::confirm::Pending>),
    /// Pass the answer, which opened this session: it tells the client what the server offers
    /// ([`super::told`]).
    Opened(Arc<Session>),
    /// The session's end was not recorded in the shared store: answer 503 instead, so the
    /// client retries the DELETE.
    EndNotRecorded,
}

/// The keeper of the MCP sessions holdfast carries: which one a request names, the bookkeeping
/// on their answers, their re-establishment when the server forgets one ([`super::resume`]).
pub(super) struct Keeper {
    pub(super) sessions: Arc<Table>,
    pub(super) metrics: Arc<Metrics>,
    /// Longest a request waits for another request's re-establishment of its session.
    pub(super) resume_wait: Duration,
    /// What a deploy's changes do to the sessions carried through it.
    pub(super) on_change: crate::config::OnChange,
}

impl Keeper {
    /// The tracked session a request names, if any. A DELETE marks it closing: the server may
    /// end its streams before it answers, and they are not asked for again ([`super::kept`]).
    pub(super) fn carried(&self, target: &Target) -> Option<Carried> {
        if !self.sessions.enabled() {
            return None;
        }
        let id = target.headers.get(session::MCP_SESSION_ID)?;
        match self.sessions.lookup(id) {
            Ok(session) => {
                if target.method == Method::DELETE {
                    session.closing(true);
                }
                Some(Carried {
                    sent: id.clone(),
                    session,
                })
            }
            Err(session::Miss::Unknown) => None,
            Err(session::Miss::Refused(why)) => {
                // Passed through as an opaque id: the server's own, or one it will answer 404.
                self.count_token_refused(why);
                None
            }
        }
    }

    /// Session bookkeeping on an application answer that is passed through: record a new
    /// session, its end, its client's own id; what a request set on one is returned, to be
    /// recorded once the answer's body confirms it ([`super::confirm`]).
    pub(super) async fn after_answer(
        &self,
        target: &Target,
        carried: Option<&Carried>,
        head: &mut http::response::Parts,
        handle: &BodyHandle,
    ) -> After {
        if !self.sessions.enabled() {
            return After::Pass(None);
        }
        let Some(c) = carried else {
            let opened = target.method == Method::POST
                && head.status.is_success()
                && !target.headers.contains_key(session::MCP_SESSION_ID);
            let upstream_id = head.headers.get(session::MCP_SESSION_ID).cloned();
            if let (true, Some(id)) = (opened, upstream_id) {
                if let Some(session) = Box::pin(self.record_session(target, head, id, handle)).await
                {
                    return After::Opened(session);
                }
            }
            return After::Pass(None);
        };
        c.session.rewrite_response(&mut head.headers, &c.sent);
        if target.method == Method::DELETE {
            // The client ended the session (or the server had already forgotten it): later
            // requests on its id go unchanged and get the server's 404, here and, for the
            // tokens this holdfast saw ended, after a restart of the backend too. A 405 (the
            // server does not let clients end sessions) or a failure leaves it going, and so
            // does a DELETE to another path than the session's endpoint: its answer is that
            // path's.
            let ended = head.status.is_success() || head.status == http::StatusCode::NOT_FOUND;
            let ended = ended && c.session.is_endpoint(&target.uri);
            if !ended {
                c.session.closing(false);
            }
            if ended {
                // Recorded for every replica first (boxed, as every rare wait here: this
                // future is part of every answered request's). An end the store did not take
                // is no end at the other replicas: nor is it here, and the client hears so and
                // retries; its retry meets the server's 404, and ends the session again.
                if Box::pin(self.share_end(&c.session)).await.is_err() {
                    c.session.closing(false);
                    return After::EndNotRecorded;
                }
                c.session.end();
                self.sessions.end(c.session.client_id());
            }
            return After::Pass(None);
        }
        if !head.status.is_success() {
            return After::Pass(None);
        }
        if target.method == Method::GET {
            c.session.stream_opened();
            return After::Pass(None);
        }
        if target.method != Method::POST {
            return After::Pass(None);
        }
        // The kept copy of the body: what the request set on the session, if anything.
        let (changes, batch) = handle
            .with_complete_body(|body| {
                (
                    session::rpc::state_changes(body),
                    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'['),
                )
            })
            .unwrap_or_default();
        if changes.is_empty() {
            return After::Pass(None);
        }
        if batch {
            // A batch's answers are not read one by one: recorded on its 2xx, as before.
            self.sessions.note_state(&c.session, changes);
            Box::pin(self.share_state(&c.session)).await;
            return After::Pass(None);
        }
        After::Pass(Some(super::confirm::Pending {
            changes,
            session: c.session.clone(),
            sessions: self.sessions.clone(),
            store_errors: self.metrics.session_store_errors.clone(),
        }))
    }

    /// Shares what a request set on `session` with every replica (`sessions.store`).
    async fn share_state(&self, session: &Session) {
        let (Some(store), Some(nonce)) = (self.sessions.shared(), session.nonce()) else {
            return;
        };
        let keys = self.sessions.keys().current();
        if let Err(e) = store.save(&nonce, &session.shared_state(), &keys).await {
            self.store_failed(&e);
        }
    }

    /// Tells every replica that `session` was ended (`sessions.store`); an error when the store
    /// did not take it.
    async fn share_end(&self, session: &Session) -> Result<(), ()> {
        let (Some(store), Some(nonce)) = (self.sessions.shared(), session.nonce()) else {
            return Ok(());
        };
        let keys = self.sessions.keys().current();
        store.end(&nonce, &keys).await.map_err(|e| {
            self.metrics.session_store_errors.inc();
            tracing::warn!(
                error = %e,
                "sessions.store did not take a session's end: its DELETE is answered 503, to be \
                 retried"
            );
        })
    }

    /// Ends `session` because the server changed in a way `[sessions.on_change]` ends it for:
    /// as a DELETE would, here and (with the store) at every replica, so that its client's
    /// next request gets the server's answer for a session it does not know.
    pub(super) async fn end_changed(&self, session: &Session) {
        // A store that did not take it leaves the other replicas carrying the session: said
        // there, and the session is ended here all the same.
        session.end();
        let _ = Box::pin(self.share_end(session)).await;
        self.sessions.end(session.client_id());
    }

    /// What the other replicas know of `session` (`sessions.store`), for its re-establishment:
    /// the state they recorded replaces this holdfast's in `plan`. True when its client ended it
    /// (at any replica): it is not re-established.
    pub(super) async fn ended_elsewhere(&self, session: &Session, plan: &mut Plan) -> bool {
        let (Some(store), Some(nonce)) = (self.sessions.shared(), session.nonce()) else {
            return false;
        };
        match store.load(&nonce, &self.sessions.keys().current()).await {
            Ok(shared) => {
                if let Some(state) = shared.state.filter(|_| !shared.ended) {
                    plan.state = state.changes();
                }
                shared.ended
            }
            // The local record, then: the session goes on with what this holdfast saw.
            Err(e) => {
                self.store_failed(&e);
                false
            }
        }
    }

    fn store_failed(&self, error: &StoreError) {
        self.metrics.session_store_errors.inc();
        tracing::warn!(
            error = %error,
            "sessions.store failed; this holdfast's own record of the session is used"
        );
    }

    /// Counts a session token that was not used.
    pub(super) fn count_token_refused(&self, why: TokenRefusal) {
        self.metrics
            .session_tokens_refused
            .get_or_create(&why.into())
            .inc();
    }

    /// Tracks the session an `initialize` just opened, if the request was one, and hands its
    /// client the session's token in place of the upstream's id. The session, once tracked.
    async fn record_session(
        &self,
        target: &Target,
        head: &mut http::response::Parts,
        upstream_id: http::HeaderValue,
        handle: &BodyHandle,
    ) -> Option<Arc<Session>> {
        let Some(body) = handle.read_whole(BODY_ID_WAIT).await else {
            tracing::debug!("a session opened, but its request body was not kept: not tracked");
            return None;
        };
        let init = session::rpc::initialize(&body)?;
        let version = init
            .protocol_version
            .and_then(|v| http::HeaderValue::from_str(&v).ok());
        match self
            .sessions
            .record(upstream_id, body, &target.uri, version)
        {
            // The client holds the token from now on; the upstream never sees it.
            Recorded::Tracked(client_id) => {
                let session = self.sessions.lookup(&client_id).ok();
                head.headers.insert(session::MCP_SESSION_ID, client_id);
                session
            }
            Recorded::TooLarge => {
                tracing::info!(
                    limit = self.sessions.max_initialize_bytes(),
                    "an initialize body is larger than sessions.max_initialize_bytes: its \
                     session is not tracked and will not survive a backend restart"
                );
                None
            }
        }
    }
}
