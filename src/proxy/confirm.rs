//! What a request set on a session (`logging/setLevel`, `resources/subscribe`,
//! `resources/unsubscribe`) is recorded only once the server's answer says it worked: a JSON-RPC
//! result. A 200 whose body is a JSON-RPC error (a level the server refuses, a resource it does
//! not have) sets nothing, and is never sent again after a restart.
//!
//! The answer streams to the client as ever; a bounded copy is read beside it, up to the
//! response (an event stream may stay open after it), and the state is recorded then.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::body::{BoxError, ProxyBody};
use crate::session::rpc::{self, Reply, StateChange};
use crate::session::{Session, Sessions};

/// Most bytes of an answer read for its response: a setLevel or subscribe answer is tiny.
const MAX_READ: usize = 64 * 1024;

/// A state change waiting for its answer, and where it is recorded once answered.
pub(super) struct Pending {
    pub(super) changes: Vec<StateChange>,
    pub(super) session: Arc<Session>,
    pub(super) sessions: Arc<Sessions>,
}

impl Pending {
    /// Records the changes (and shares them through the store, in the background: the answer
    /// is on its way to the client already).
    fn record(self) {
        self.sessions.note_state(&self.session, self.changes);
        if let (Some(_), Some(nonce)) = (self.sessions.shared(), self.session.nonce()) {
            let (sessions, session) = (self.sessions.clone(), self.session.clone());
            tokio::spawn(async move {
                let Some(store) = sessions.shared() else {
                    return;
                };
                let keys = sessions.keys().current();
                if let Err(e) = store.save(&nonce, &session.shared_state(), &keys).await {
                    tracing::warn!(
                        error = %e,
                        "sessions.store failed; this holdfast's own record of the session is used"
                    );
                }
            });
        }
    }
}

pin_project_lite::pin_project! {
    /// An answer on its way to the client, read beside for the response that confirms
    /// `pending`.
    pub(super) struct Confirm {
        #[pin]
        inner: ProxyBody,
        pending: Option<Pending>,
        copy: BytesMut,
        is_sse: bool,
    }
}

impl Confirm {
    pub(super) fn new(inner: ProxyBody, pending: Pending, is_sse: bool) -> Self {
        Confirm {
            inner,
            pending: Some(pending),
            copy: BytesMut::new(),
            is_sse,
        }
    }
}

impl Body for Confirm {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let (Some(_), Some(data)) = (this.pending.as_ref(), f.data_ref()) {
                    if this.copy.len() + data.len() > MAX_READ {
                        // Too long to be the answer of a state change: nothing recorded.
                        *this.pending = None;
                    } else {
                        this.copy.extend_from_slice(data);
                        judge(this.pending, this.copy, *this.is_sse, false);
                    }
                }
            }
            // A broken answer confirms nothing.
            Some(Err(_)) => *this.pending = None,
            None => judge(this.pending, this.copy, *this.is_sse, true),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Records `pending` once `copy` holds a result; drops it on an error, or at the end without
/// a response.
fn judge(pending: &mut Option<Pending>, copy: &[u8], is_sse: bool, ended: bool) {
    match rpc::reply(is_sse, copy) {
        Reply::Result(_) => {
            if let Some(p) = pending.take() {
                p.record();
            }
        }
        Reply::Error(code, message) => {
            tracing::debug!(
                code,
                message,
                "the server refused a request that sets session state: not recorded"
            );
            *pending = None;
        }
        Reply::Nothing if ended => *pending = None,
        Reply::Nothing => {}
    }
}
