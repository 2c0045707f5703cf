//! The executor's side of a kept event stream ([`crate::proxy::kept`]): which answers are kept
//! open through the server's restart, and the GET that opens the server's stream again, sent
//! through the whole proxy (held through a missing backend, the session re-established when the
//! server forgot it) like a client's.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode, Version};

use super::{Exchange, Proxy};
use crate::hold::Ticket;
use crate::proxy::body::ProxyBody;
use crate::proxy::ending::Phase;
use crate::proxy::kept::{Again, Kept};
use crate::proxy::life::Life;
use crate::proxy::Target;
use crate::replay::BodyHandle;

/// Tries of a kept stream's GET that holdfast itself could not get answered.
const REOPEN_TRIES: usize = 3;

/// Between two such tries.
const REOPEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

impl Proxy {
    /// An exchange for `target`, its body in `handle`; `handed`: a peer's hand-off.
    pub(super) fn exchange_of(
        &self,
        target: Target,
        handle: BodyHandle,
        version: Version,
        handed: bool,
    ) -> Exchange {
        Exchange {
            carried: self.keeper.carried(&target),
            route: std::sync::OnceLock::new(),
            outages: self.hold.upstream().clone(),
            target,
            handle,
            ticket: Ticket::default(),
            version,
            life: Life::new(self.hold.enabled(), handed),
            flight: None,
            mcp: std::sync::OnceLock::new(),
            described: None,
            trace: None,
            reopens: false,
        }
    }

    /// The answer to a carried session's GET stream, kept open through the server's restarts
    /// when it is one (an event stream answered 200, not itself a reopening).
    pub(super) fn keep(&self, ex: &Exchange, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let Some(carried) = ex.carried.as_ref() else {
            return resp;
        };
        let stream = ex.target.method == Method::GET
            && resp.status() == StatusCode::OK
            && crate::proxy::headers::is_event_stream(resp.headers());
        if !stream || ex.reopens {
            return resp;
        }
        // No handle on itself (a proxy built outside `Proxy::shared`, in tests): not kept.
        let Some(proxy) = self.this.upgrade() else {
            return resp;
        };
        let again = Again {
            proxy: Some(proxy),
            target: Box::new(ex.target.clone()),
            version: ex.version,
        };
        let (session, reopened) = (
            carried.session.clone(),
            self.metrics.sse_streams_reopened.clone(),
        );
        resp.map(|body| {
            http_body_util::BodyExt::boxed_unsync(Kept::new(body, again, session, reopened))
        })
    }

    /// Opens the server's stream again for a kept stream: its body when the GET is answered
    /// with an event stream, else `None` (the client's stream then ends). Never during
    /// holdfast's shutdown.
    ///
    /// A GET that failed on holdfast's side of the answer (a 502: a pooled connection the old
    /// server reset as it went; a 503: the hold ended before the server was back) goes again, up
    /// to [`REOPEN_TRIES`] times, [`REOPEN_PAUSE`] apart: nothing of a GET runs twice. What the
    /// server itself answers (a 404 for a session ended, a 405) ends the client's stream.
    pub(in crate::proxy) async fn reopen(
        self: Arc<Self>,
        target: Target,
        version: Version,
    ) -> Option<ProxyBody> {
        let id = target.headers.get(crate::session::MCP_SESSION_ID)?.clone();
        for _ in 0..REOPEN_TRIES {
            if self.ending.phase() != Phase::Serving {
                return None;
            }
            // A session ended meanwhile (a DELETE at any replica) is not asked for again.
            self.keeper.sessions.lookup(&id).ok()?;
            let handle = BodyHandle::from_bytes(Bytes::new());
            let mut ex = self.exchange_of(target.clone(), handle, version, false);
            ex.reopens = true;
            let (resp, _) = self.forward(&mut ex).await;
            if resp.status() == StatusCode::OK
                && crate::proxy::headers::is_event_stream(resp.headers())
            {
                return Some(resp.into_body());
            }
            let own = resp.headers().contains_key(crate::respond::REASON_HEADER);
            if !own {
                return None;
            }
            tokio::time::sleep(REOPEN_PAUSE).await;
        }
        None
    }

    /// This proxy in an `Arc` that it knows itself by: a kept stream reopens through it.
    pub fn shared(self) -> Arc<Proxy> {
        Arc::new_cyclic(|this| Proxy {
            this: this.clone(),
            ..self
        })
    }
}
