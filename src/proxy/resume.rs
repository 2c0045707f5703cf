//! Re-establishing a session the upstream forgot, so the client's session outlives the restart.
//!
//! When the application answers a request on a tracked session with 404 (the transport spec: a
//! server "MUST respond to requests containing that session ID with HTTP 404") or 400 (what the
//! TypeScript SDK's example servers and the reference servers copied from them send), the
//! server may no longer know the session, and then did not execute the request. A `ping` on the
//! session, refused the same way, makes sure ([`crate::session::forgotten`]). holdfast then
//! sends what the client sent when it opened the session: the recorded `initialize` (with the
//! *current* request's credentials, never stored ones), `notifications/initialized`, a `ping`
//! that must be answered on the new session (else pings prove nothing on this server), and the
//! state the session had (`logging/setLevel`, live `resources/subscribe`s). The new upstream
//! session id stands for the client's from then on, and the request goes again.
//!
//! Every request holdfast sends here goes through [`Upstream::attempt`], so it is classified like a
//! client's: a missing backend is a [`Gone::Missing`] that the caller holds through, exactly as
//! the request itself would be.

use bytes::{Bytes, BytesMut};
use http::header::{
    HeaderValue, ACCEPT, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, EXPECT,
    TRANSFER_ENCODING,
};
use http::{HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::answer::Peeked;
use super::attempt::Upstream;
use super::life::{Gone, Life};
use super::sessions::Keeper;
use super::{Carried, Target};
use crate::classify::{Missing, Verdict};
use crate::metrics::{ReestablishCause, ReestablishLabel, ResumeOutcome};
use crate::replay::BodyHandle;
use crate::session::forgotten::{self, PingSays};
use crate::session::rpc::{self, Reply, StateChange};
use crate::session::{
    Origin, Plan, Session, TokenRefusal, LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID,
};

mod changed;

/// Most bytes of an answer read while looking for its JSON-RPC response.
const MAX_REPLY_BYTES: usize = 1 << 20;

/// The headers of a 2026-07-28 request that name its method; holdfast's requests set their own
/// body, so the client's would be wrong.
const MCP_METHOD_HEADERS: [&str; 2] = ["mcp-method", "mcp-name"];

/// How one re-establishment ended.
enum Resume {
    /// This request re-established the session.
    Done,
    /// Another request did, while this one waited its turn.
    DoneByAnother,
    /// The session is alive: the 404 (or 400) was the request's own answer.
    Alive,
    /// The backend is missing.
    Missing(Missing),
    /// The server would not re-establish it; why, for the log.
    Failed(String),
    /// Its client ended it, at another replica (the shared store says so).
    Ended,
    /// The server changed in a way `[sessions.on_change]` ends the session for: ended.
    EndedByChange,
}

/// An answer to a request holdfast sent on its own.
struct OwnAnswer {
    head: http::response::Parts,
    reply: Reply,
}

/// One re-establishment under way: the keeper's sessions, sent to the upstream.
struct Resuming<'a> {
    keeper: &'a Keeper,
    upstream: &'a Upstream,
}

impl Keeper {
    /// Decides what the application's `status` (a 404 or 400: [`forgotten::suspects`]) means
    /// for a request: a forgotten session to re-establish, or an answer to pass.
    pub(super) async fn session_gone(
        &self,
        upstream: &Upstream,
        status: StatusCode,
        target: &Target,
        carried: Option<&Carried>,
        handle: &BodyHandle,
        life: &mut Life,
    ) -> Gone {
        let Some(carried) = self.to_resume(status, target, carried, life) else {
            return Gone::Pass;
        };
        let resuming = Resuming {
            keeper: self,
            upstream,
        };
        let resume = resuming.resume(status, carried, target).await;
        self.gone(resume, status, handle)
    }

    /// The session to re-establish for a request the application refused with `status`, when
    /// it may be one the server forgot and may be re-established; None when the answer passes.
    fn to_resume<'c>(
        &self,
        status: StatusCode,
        target: &Target,
        carried: Option<&'c Carried>,
        life: &mut Life,
    ) -> Option<&'c Carried> {
        // A DELETE is re-established too: the client holds a live session, and its end should
        // be the server's answer, not a 404 the SDK clients report as a failed close (the
        // TypeScript SDK's `terminateSession` throws on it). Once ended, the id opens no more.
        if !self.sessions.enabled() {
            return None;
        }
        let Some(carried) = carried else {
            // Counted for the spec's 404 only: a 400 without a session holdfast carries is
            // the request's own answer, nothing to do with sessions.
            if status == StatusCode::NOT_FOUND && target.headers.contains_key(MCP_SESSION_ID) {
                self.count_resume(ResumeOutcome::not_tracked);
            }
            return None;
        };
        // The server refused a ping on a session it had just opened: its refusals cannot tell a
        // forgotten session from a request's own fault, so none is followed for a while.
        if self.sessions.ping_doubt().holds(Instant::now()) {
            return None;
        }
        // Only the session's own endpoint answers for the session: a 404 for another path is
        // that path's (and the check below, sent to this path, would prove nothing).
        if !carried.session.is_endpoint(&target.uri) {
            return None;
        }
        if carried.session.is_too_old(self.sessions.token_max_age()) {
            self.count_token_refused(TokenRefusal::Expired);
            tracing::info!(
                "the server forgot an MCP session whose token is older than \
                 sessions.token_max_age_secs: not re-established, its answer passes"
            );
            return None;
        }
        if !life.may_resume() {
            self.count_resume(ResumeOutcome::failed);
            tracing::warn!(
                resumes = life.resumes(),
                "the server forgot an MCP session again right after it was re-established; \
                 passing its answer to the client"
            );
            return None;
        }
        Some(carried)
    }

    /// What a re-establishment's outcome means for the request that asked for it.
    fn gone(&self, resume: Resume, status: StatusCode, handle: &BodyHandle) -> Gone {
        match resume {
            Resume::Done | Resume::DoneByAnother if !handle.is_replayable() => {
                // Too large to send twice: this request gets the server's 404, the requests
                // after it find the session back.
                tracing::info!(
                    "re-established an MCP session, but the request that found it gone had a \
                     body larger than the copy kept for a replay: passing the server's answer"
                );
                Gone::Pass
            }
            Resume::Done | Resume::DoneByAnother => Gone::SendAgain,
            Resume::Alive => {
                tracing::debug!(
                    status = status.as_u16(),
                    "the server still knows the session: its answer is the request's own"
                );
                Gone::Pass
            }
            Resume::Missing(missing) => Gone::Missing(missing),
            Resume::Ended => {
                tracing::debug!("the session was ended at another replica: its answer passes");
                Gone::Pass
            }
            // Said where it was decided (src/proxy/resume/changed.rs).
            Resume::EndedByChange => Gone::Pass,
            Resume::Failed(why) => {
                self.count_resume(ResumeOutcome::failed);
                tracing::warn!(
                    why = %why,
                    "could not re-establish an MCP session the server forgot; passing its \
                     answer to the client"
                );
                Gone::Pass
            }
        }
    }

    fn count_resume(&self, outcome: ResumeOutcome) {
        self.metrics
            .session_resumes
            .get_or_create(&outcome.into())
            .inc();
    }
}

impl Resuming<'_> {
    /// Re-establishes `carried`'s session upstream, one request at a time per session.
    /// `status`: how the server refused the request on it.
    async fn resume(&self, status: StatusCode, carried: &Carried, current: &Target) -> Resume {
        let session = &carried.session;
        let Ok(_turn) =
            // The same bound as any other wait for the backend: the hold timeout.
            tokio::time::timeout(self.keeper.resume_wait, session.lock_resume()).await
        else {
            return Resume::Failed(
                "another request's re-establishment of this session did not finish within \
                 hold.timeout_secs"
                    .into(),
            );
        };
        // Ended meanwhile, by the request that held the turn (a change), or by its client.
        if session.is_ended() {
            return Resume::EndedByChange;
        }
        if session.upstream_id() != carried.sent {
            return Resume::DoneByAnother;
        }
        let mut plan = session.plan();
        if self.keeper.ended_elsewhere(session, &mut plan).await {
            self.keeper.count_token_refused(TokenRefusal::Ended);
            return Resume::Ended;
        }
        // Sent where the current request went (the same endpoint: `session_gone` checked), so no
        // query string of the initialize (a token, say) is ever replayed.
        let own = |headers: HeaderMap| Target {
            method: Method::POST,
            uri: current.uri.clone(),
            headers,
            client: current.client.clone(),
            client_host: current.client_host.clone(),
        };
        let mut headers = own_headers(&current.headers);

        if let Some(resume) = self.alive(status, &own, &headers, carried, &plan).await {
            return resume;
        }
        let (upstream_id, negotiated, offered) = match self
            .initialize(own(headers.clone()), plan.initialize.clone())
            .await
        {
            Ok(opened) => opened,
            Err(resume) => return resume,
        };
        headers.insert(MCP_SESSION_ID, upstream_id.clone());
        // holdfast's own requests on the new session speak the version the server agreed on for
        // it; the client's keep the one it agreed on (a difference is a change of the server's:
        // `compare`). Without one named, the client's.
        if let Some(version) = negotiated.or(plan.protocol_version.clone()) {
            headers.insert(MCP_PROTOCOL_VERSION, version);
        }
        if let Err(resume) = self.bring_up(status, &own, &headers, &plan).await {
            return resume;
        }
        // What the client was told, against what the new server offers (a deploy?).
        let was = session.told(|t| t.offer().map(|o| o.server.clone()));
        let client_version = plan.agreed.as_ref();
        let compared = match (self.compare(session, &own, &headers, &offered, client_version)).await
        {
            Ok(compared) => compared,
            Err(resume) => return resume,
        };
        match self.act(compared, was, &own, &headers).await {
            changed::Outcome::End => {
                self.keeper.end_changed(session).await;
                Resume::EndedByChange
            }
            changed::Outcome::GoOn(compared) => {
                self.resumed(session, upstream_id, plan.state.len());
                if let Some(compared) = compared {
                    let notify = self.keeper.on_change.lists == crate::config::Act::Notify;
                    changed::tell(session, compared, notify);
                }
                Resume::Done
            }
        }
    }

    /// Is the session really gone? A 404 or 400 can also be a request's own answer (a server
    /// with no GET stream that answers 404 instead of 405, bad JSON, a custom error):
    /// re-establishing then would throw away a live session, and send an executed request
    /// again. A ping on the session tells them apart: a server refuses it as it refused the
    /// request only for a session it does not know. None when it is gone.
    async fn alive(
        &self,
        status: StatusCode,
        own: &impl Fn(HeaderMap) -> Target,
        headers: &HeaderMap,
        carried: &Carried,
        plan: &Plan,
    ) -> Option<Resume> {
        let mut check = headers.clone();
        check.insert(MCP_SESSION_ID, carried.sent.clone());
        if let Some(version) = &plan.protocol_version {
            check.insert(MCP_PROTOCOL_VERSION, version.clone());
        }
        match self.send_own(&own(check), rpc::ping_request(), true).await {
            Ok(answer) => {
                let result = matches!(answer.reply, Reply::Result(_));
                match forgotten::ping_says(status, answer.head.status, result) {
                    PingSays::Forgotten => None,
                    PingSays::Alive => Some(Resume::Alive),
                }
            }
            Err(resume) => Some(resume),
        }
    }

    /// Brings the new session to where the old one was: `notifications/initialized`, a ping
    /// that must be answered (else the ping that found the old session gone proved nothing),
    /// then the recorded state changes in order (one the server refuses is skipped, and said).
    /// `refused_with`: how the server refused the request on the old session.
    async fn bring_up(
        &self,
        refused_with: StatusCode,
        own: &impl Fn(HeaderMap) -> Target,
        headers: &HeaderMap,
        plan: &Plan,
    ) -> Result<(), Resume> {
        let notified = self
            .send_own(
                &own(headers.clone()),
                rpc::initialized_notification(),
                false,
            )
            .await?;
        if !notified.head.status.is_success() {
            return Err(Resume::Failed(format!(
                "the server answered notifications/initialized with {}",
                notified.head.status
            )));
        }
        self.ping_witnesses(refused_with, own(headers.clone()))
            .await?;
        for (n, change) in plan.state.iter().enumerate() {
            let request = rpc::replay_request(n, change);
            match self.send_own(&own(headers.clone()), request, true).await {
                Ok(OwnAnswer {
                    head,
                    reply: Reply::Result(_),
                }) if head.status.is_success() => {}
                Err(resume @ Resume::Missing(_)) => return Err(resume),
                _ => tracing::warn!(
                    method = change_method(change),
                    "the server did not accept a recorded request again after re-establishing \
                     the session; the session goes on without it"
                ),
            }
        }
        Ok(())
    }

    /// Whether the server answers a ping on the session it just opened. One that refuses it as
    /// it refused the old session's refuses every ping: the old session's ping proved nothing,
    /// and would not next time either, so suspicions are not followed for a while
    /// ([`forgotten::PING_DOUBT`]), and the request's answer passes.
    async fn ping_witnesses(&self, refused_with: StatusCode, target: Target) -> Result<(), Resume> {
        let answer = self.send_own(&target, rpc::ping_request(), true).await?;
        let result = matches!(answer.reply, Reply::Result(_));
        if forgotten::new_session_ping_holds(refused_with, answer.head.status, result) {
            return Ok(());
        }
        self.keeper.sessions.ping_doubt().begin(Instant::now());
        Err(Resume::Failed(format!(
            "the server answered a ping on the session it had just opened with {} (the old \
             session's request got {refused_with}): its refusals cannot tell a forgotten \
             session, so none is followed for the next {} minutes",
            answer.head.status,
            forgotten::PING_DOUBT.as_secs() / 60
        )))
    }

    /// The session lives on under `upstream_id`: counted, and said.
    fn resumed(&self, session: &Session, upstream_id: HeaderValue, state: usize) {
        // Before `resumed`: a session opened from its token and re-established for the first
        // time here started elsewhere (or before this holdfast's restart).
        let cause = if session.origin() == Origin::Token && !session.is_mapped() {
            ReestablishCause::unknown_to_this_replica
        } else {
            ReestablishCause::backend_restart
        };
        session.resumed(upstream_id);
        self.keeper.count_resume(ResumeOutcome::resumed);
        self.keeper
            .metrics
            .session_reestablished
            .get_or_create(&ReestablishLabel { cause })
            .inc();
        tracing::info!(
            state,
            "re-established an MCP session the server had forgotten"
        );
    }

    /// Sends the recorded `initialize`; the new upstream session id, the protocol version the
    /// server chose and its whole result, or why not.
    async fn initialize(
        &self,
        target: Target,
        body: Bytes,
    ) -> Result<(HeaderValue, Option<HeaderValue>, serde_json::Value), Resume> {
        let answer = self.send_own(&target, body, true).await?;
        let status = answer.head.status;
        if !status.is_success() {
            return Err(Resume::Failed(format!(
                "the server answered the initialize with {status}"
            )));
        }
        let Some(upstream_id) = answer.head.headers.get(MCP_SESSION_ID).cloned() else {
            return Err(Resume::Failed(
                "the server answered the initialize without a session id".into(),
            ));
        };
        match answer.reply {
            Reply::Result(result) => {
                let version = result
                    .get("protocolVersion")
                    .and_then(|v| v.as_str())
                    .and_then(|v| HeaderValue::from_str(v).ok());
                Ok((upstream_id, version, result))
            }
            Reply::Error(code, message) => Err(Resume::Failed(format!(
                "the server answered the initialize with JSON-RPC error {code} ({message})"
            ))),
            Reply::Nothing => Err(Resume::Failed(
                "the server's answer to the initialize had no JSON-RPC response".into(),
            )),
        }
    }

    /// Sends one request of holdfast's own and classifies the outcome like a client's. With
    /// `read_reply`, the answer is read (bounded) up to its JSON-RPC response.
    async fn send_own(
        &self,
        target: &Target,
        body: Bytes,
        read_reply: bool,
    ) -> Result<OwnAnswer, Resume> {
        let handle = BodyHandle::from_bytes(body);
        let body = handle.attempt().expect("a new body can be sent");
        let route = self
            .upstream
            .hold
            .routes_out()
            .then(|| self.upstream.route_of(target));
        match self.upstream.attempt(target, route.as_deref(), body).await {
            (Verdict::Application, Some((head, peek))) => {
                let reply = if read_reply {
                    self.read_reply(&head, peek).await
                } else {
                    Reply::Nothing
                };
                Ok(OwnAnswer { head, reply })
            }
            (Verdict::Missing(missing), _) => Err(Resume::Missing(missing)),
            (Verdict::RouterPassthrough(_), _) => Err(Resume::Failed(
                "a router answered holdfast's request with a 404 it passes through".into(),
            )),
            (Verdict::Failed(reason), _) => Err(Resume::Failed(format!(
                "holdfast's request failed after it was sent ({})",
                reason.as_str()
            ))),
            // Holdfast's own body, from memory: it cannot break.
            (Verdict::ClientBody(fault), _) => Err(Resume::Failed(format!(
                "holdfast's request body failed ({fault:?})"
            ))),
            (Verdict::Application, None) => unreachable!("the classifier passes responses only"),
        }
    }

    /// Reads an answer until its JSON-RPC response is found, the body ends, or the bounds
    /// (`MAX_REPLY_BYTES`, the response timeout) are reached.
    async fn read_reply(&self, head: &http::response::Parts, peek: Peeked) -> Reply {
        let is_sse = super::headers::is_event_stream(&head.headers);
        if let Some(complete) = peek.complete {
            return rpc::reply(is_sse, &complete);
        }
        let mut buf = BytesMut::new();
        if let Some(prefix) = peek.prefix {
            buf.extend_from_slice(&prefix);
        }
        let mut rest = peek.rest;
        let deadline = Instant::now() + self.upstream.response_timeout;
        loop {
            // An SSE answer may stay open after its response: stop at the response.
            if is_sse {
                let found = rpc::reply(true, &buf);
                if found != Reply::Nothing {
                    return found;
                }
            }
            if buf.len() > MAX_REPLY_BYTES {
                return Reply::Nothing;
            }
            match tokio::time::timeout_at(deadline, rest.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                // The end, a broken body or the deadline: judge what arrived.
                _ => break,
            }
        }
        rpc::reply(is_sse, &buf)
    }
}

/// The headers of holdfast's own requests: the current request's (its credentials, Host,
/// X-Forwarded-*), less what names that request's session, body or method.
fn own_headers(current: &HeaderMap) -> HeaderMap {
    let mut headers = current.clone();
    for name in [MCP_SESSION_ID, LAST_EVENT_ID, MCP_PROTOCOL_VERSION] {
        headers.remove(name);
    }
    for name in MCP_METHOD_HEADERS {
        headers.remove(name);
    }
    // hyper sets Content-Length from the body's exact size.
    for name in [CONTENT_LENGTH, TRANSFER_ENCODING, EXPECT] {
        headers.remove(name);
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    // holdfast reads these answers itself and decodes no content coding.
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    headers.remove(CONTENT_ENCODING);
    headers
}

fn change_method(change: &StateChange) -> &'static str {
    match change {
        StateChange::SetLevel(_) => "logging/setLevel",
        StateChange::Subscribe(_) => "resources/subscribe",
        StateChange::Unsubscribe(_) => "resources/unsubscribe",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_headers_keep_credentials_and_drop_the_old_session() {
        let mut current = HeaderMap::new();
        current.insert("authorization", HeaderValue::from_static("Bearer now"));
        current.insert(MCP_SESSION_ID, HeaderValue::from_static("old"));
        current.insert(LAST_EVENT_ID, HeaderValue::from_static("7"));
        current.insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2025-06-18"));
        current.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        current.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        current.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip, deflate"));
        current.insert("mcp-method", HeaderValue::from_static("tools/call"));
        let own = own_headers(&current);
        assert_eq!(own.get("authorization").unwrap(), "Bearer now");
        for gone in [
            MCP_SESSION_ID,
            LAST_EVENT_ID,
            MCP_PROTOCOL_VERSION,
            CONTENT_LENGTH,
            http::HeaderName::from_static("mcp-method"),
        ] {
            assert!(own.get(&gone).is_none(), "{gone} kept");
        }
        assert_eq!(
            own.get(ACCEPT).unwrap(),
            "application/json, text/event-stream"
        );
        assert_eq!(own.get(CONTENT_TYPE).unwrap(), "application/json");
        assert_eq!(own.get(ACCEPT_ENCODING).unwrap(), "identity");
    }
}
