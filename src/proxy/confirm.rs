//! What a request set on a session (`logging/setLevel`, `resources/subscribe`,
//! `resources/unsubscribe`) is recorded only once the server's answer says it worked: a JSON-RPC
//! result. A 200 whose body is a JSON-RPC error (a level the server refuses, a resource it does
//! not have) sets nothing, and is never sent again after a restart.
//!
//! The answer streams to the client as ever; a bounded copy is read beside it, up to the
//! response (an event stream may stay open after it), and the state is recorded then. With the
//! shared store, the frame that completes the response goes on once the store has it: when the
//! client has its answer, every replica can read what it set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::body::ProxyBody;
use crate::errors::BoxError;
use crate::session::rpc::{self, Reply, StateChange};
use crate::session::{Session, Table};

/// Most bytes of an answer read for its response: a setLevel or subscribe answer is tiny.
const MAX_READ: usize = 64 * 1024;

/// A state change waiting for its answer, and where it is recorded once answered.
pub(super) struct Pending {
    pub(super) changes: Vec<StateChange>,
    pub(super) session: Arc<Session>,
    pub(super) sessions: Arc<Table>,
    /// `holdfast_session_store_errors_total`.
    pub(super) store_errors: prometheus_client::metrics::counter::Counter,
}

/// Writing the state to the shared store, before the frame that completed the answer goes on.
type Saving = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Pending {
    /// Records the changes; with the shared store, the write to it, to finish before the answer
    /// does.
    fn record(self) -> Option<Saving> {
        self.sessions.note_state(&self.session, self.changes);
        let (Some(_), Some(nonce)) = (self.sessions.shared(), self.session.nonce()) else {
            return None;
        };
        let (sessions, session, errors) = (self.sessions, self.session, self.store_errors);
        // Written after the request's future ended: its id is taken along for the log.
        let request = crate::telemetry::request_id();
        Some(Box::pin(async move {
            let Some(store) = sessions.shared() else {
                return;
            };
            let keys = sessions.keys().current();
            if let Err(e) = store.save(&nonce, &session.shared_state(), &keys).await {
                errors.inc();
                crate::telemetry::in_request(request, || {
                    tracing::warn!(
                        error = %e,
                        "sessions.store failed; this holdfast's own record of the session is used"
                    )
                });
            }
        }))
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
        // The store's write, and the frame waiting for it.
        saving: Option<(Saving, Option<Result<Frame<Bytes>, BoxError>>)>,
        // The request's id: what is logged here, after its future ended, names it.
        request: Option<http::HeaderValue>,
    }
}

impl Confirm {
    pub(super) fn new(inner: ProxyBody, pending: Pending, is_sse: bool) -> Self {
        Confirm {
            inner,
            pending: Some(pending),
            copy: BytesMut::new(),
            is_sse,
            saving: None,
            request: crate::telemetry::request_id(),
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
        if let Some((saving, _)) = this.saving.as_mut() {
            ready!(saving.as_mut().poll(cx));
            let (_, frame) = this.saving.take().expect("just polled");
            return Poll::Ready(frame);
        }
        let frame = ready!(this.inner.poll_frame(cx));
        let saving = match &frame {
            Some(Ok(f)) => match (this.pending.as_ref(), f.data_ref()) {
                (Some(_), Some(data)) if this.copy.len() + data.len() > MAX_READ => {
                    // Too long to be the answer of a state change: nothing recorded.
                    *this.pending = None;
                    None
                }
                (Some(_), Some(data)) => {
                    this.copy.extend_from_slice(data);
                    let (pending, copy, is_sse) = (this.pending, this.copy, *this.is_sse);
                    let request = this.request.clone();
                    crate::telemetry::in_request(request, || judge(pending, copy, is_sse, false))
                }
                _ => None,
            },
            // A broken answer confirms nothing.
            Some(Err(_)) => {
                *this.pending = None;
                None
            }
            None => {
                let (pending, copy, is_sse) = (this.pending, this.copy, *this.is_sse);
                let request = this.request.clone();
                crate::telemetry::in_request(request, || judge(pending, copy, is_sse, true))
            }
        };
        match saving {
            Some(mut saving) => match saving.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(frame),
                Poll::Pending => {
                    *this.saving = Some((saving, frame));
                    Poll::Pending
                }
            },
            None => Poll::Ready(frame),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.saving.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Records `pending` once `copy` holds a result (the store's write, if any, to wait for); drops
/// it on an error, or at the end without a response.
fn judge(pending: &mut Option<Pending>, copy: &[u8], is_sse: bool, ended: bool) -> Option<Saving> {
    match rpc::reply(is_sse, copy) {
        Reply::Result(_) => return pending.take().and_then(Pending::record),
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
    None
}
