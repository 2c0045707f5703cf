//! A held request its client gave up on is taken out of the hold unsent
//! ([`crate::session::cancels`]): the request registers while it waits, and the client's
//! `notifications/cancelled` for it is answered here, 202, without going upstream (the server
//! never saw the request).

use http::{Method, StatusCode};

use super::{Exchange, Proxy};
use crate::proxy::{Note, BODY_ID_WAIT};
use crate::session::cancels::{cancelled_id, id_text, Registration};
use crate::session::MCP_SESSION_ID;

type Answer = (http::Response<crate::proxy::body::ProxyBody>, Note);

impl Proxy {
    /// [`Proxy::cancel_held`], looked for only while some request is held: otherwise one atomic
    /// load, and no future of its own in the request's.
    pub(super) fn cancels_held<'a>(
        &'a self,
        ex: &'a Exchange,
    ) -> impl std::future::Future<Output = Option<Answer>> + Send + 'a {
        let look = ex.target.method == Method::POST && !self.keeper.sessions.cancels().is_empty();
        let held = look.then(|| Box::pin(self.cancel_held(ex)));
        async move {
            match held {
                Some(held) => held.await,
                None => None,
            }
        }
    }

    /// A `notifications/cancelled` (a POST, while some request is held) for a request held
    /// here: taken, and answered 202. `None` for any other request (it goes on as ever).
    async fn cancel_held(&self, ex: &Exchange) -> Option<Answer> {
        let cancels = self.keeper.sessions.cancels();
        let session = ex.target.headers.get(MCP_SESSION_ID)?;
        let body = ex.handle.read_whole(BODY_ID_WAIT).await?;
        let id = cancelled_id(&body)?;
        if !cancels.cancel(session, &id) {
            return None;
        }
        tracing::info!(
            "a client cancelled a request held through an outage: it is not sent, and its \
             cancellation goes no further"
        );
        let note = Note {
            upstream_status: None,
            action: crate::proxy::Action::CancelTaken,
        };
        Some((crate::respond::empty(StatusCode::ACCEPTED), note))
    }

    /// The request's place among the cancellable, while it is held: a POST of one JSON-RPC
    /// request on a session.
    pub(super) async fn cancellable<'a>(&'a self, ex: &Exchange) -> Option<Registration<'a>> {
        if ex.target.method != Method::POST {
            return None;
        }
        // The session as the client holds it (an attempt may have put the upstream's in the
        // request since).
        let session = match &ex.carried {
            Some(c) => c.session.client_id().clone(),
            None => ex.target.headers.get(MCP_SESSION_ID)?.clone(),
        };
        let body = ex.handle.read_whole(BODY_ID_WAIT).await?;
        let id = id_text(&crate::jsonrpc::request_id(&body)?)?;
        self.keeper.sessions.cancels().register(session, id)
    }
}
