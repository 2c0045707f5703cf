//! What a carried session's client is told, read beside it as the answer streams: the
//! `initialize` result and each page of the lists clients cache (`tools/list`, `prompts/list`,
//! `resources/list`, `resources/templates/list`), kept as digests in the session
//! ([`crate::session::told`]) so that a re-establishment can tell what a deploy changed.
//!
//! Only those answers are read (a session's first answer, and the list calls a client makes
//! when it starts or is told a list changed): never a tool call's. The copy is bounded; a list
//! too large to read is noted as received but unknown, and taken as changed after a restart.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::body::ProxyBody;
use crate::errors::BoxError;
use crate::session::rpc::{self, Reply};
use crate::session::told::List;
use crate::session::Session;

/// Most bytes of an answer read: a list of a few hundred tools with their schemas fits.
const MAX_READ: usize = 1 << 20;

/// What the answer tells the client.
pub(super) enum Heard {
    /// The server's `initialize` result.
    Offer,
    /// A page of a list; `first`: asked without a cursor.
    Page { list: List, first: bool },
}

/// The copy of an answer being read, and where what it says goes.
struct Reading {
    heard: Heard,
    session: Arc<Session>,
    bytes: BytesMut,
    /// An event stream's events as they arrive (`None` for a JSON answer).
    events: Option<crate::sse::Parser>,
}

impl Reading {
    /// What the answer said, `reply`, noted in the session.
    fn note(self, reply: Reply) {
        match (self.heard, reply) {
            (Heard::Offer, Reply::Result(result)) => self.session.offered(&result),
            (Heard::Offer, _) => {}
            (Heard::Page { list, first }, Reply::Result(result)) => {
                self.session.listed(list, first, Some(&result))
            }
            // The client got an error, not a page: it holds what it held.
            (Heard::Page { .. }, Reply::Error(..)) => {}
            // Cut short, or too large to read: the client may hold a list holdfast cannot know.
            (Heard::Page { list, first }, Reply::Nothing) => self.session.listed(list, first, None),
        }
    }

    /// Takes `data`; the response once an event carrying one completed.
    fn push(&mut self, data: &[u8]) -> Result<Option<Reply>, ()> {
        if self.bytes.len() + data.len() > MAX_READ {
            return Err(());
        }
        let Some(events) = self.events.as_mut() else {
            self.bytes.extend_from_slice(data);
            return Ok(None);
        };
        let mut found = None;
        events.feed(data, |event| {
            if found.is_none() && !event.data.is_empty() {
                let reply = rpc::reply(false, event.data.as_bytes());
                if reply != Reply::Nothing {
                    found = Some(reply);
                }
            }
        });
        Ok(found)
    }
}

pin_project_lite::pin_project! {
    /// An answer on its way to the client, read beside for what it tells the client.
    pub(super) struct Telling {
        #[pin]
        inner: ProxyBody,
        reading: Option<Reading>,
    }
}

impl Telling {
    /// Reads `inner` (an event stream when `is_sse`) for what it tells `session`'s client.
    pub(super) fn new(inner: ProxyBody, is_sse: bool, heard: Heard, session: Arc<Session>) -> Self {
        Telling {
            inner,
            reading: Some(Reading {
                heard,
                session,
                bytes: BytesMut::new(),
                events: is_sse.then(|| crate::sse::Parser::new(MAX_READ)),
            }),
        }
    }
}

impl Body for Telling {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        let Some(reading) = this.reading.as_mut() else {
            return Poll::Ready(frame);
        };
        // Noted before the frame goes on: a client that lists and is then told of a change
        // must find its list noted first.
        let reply = match &frame {
            Some(Ok(f)) => match f.data_ref().map(|data| reading.push(data)) {
                Some(Err(())) => Some(Reply::Nothing),
                Some(Ok(Some(reply))) => Some(reply),
                // A JSON answer is read when it ends (hyper may not poll again once the body
                // says so).
                _ if reading.events.is_none() && inner.is_end_stream() => {
                    Some(rpc::reply(false, &reading.bytes))
                }
                _ => None,
            },
            Some(Err(_)) => Some(Reply::Nothing),
            None if reading.events.is_none() => Some(rpc::reply(false, &reading.bytes)),
            None => Some(Reply::Nothing),
        };
        if let Some(reply) = reply {
            this.reading.take().expect("reading").note(reply);
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

/// What an answer passed to the client is read for beside it: a state change its request set,
/// confirmed by its result; or what it tells the session's client (an `initialize`'s offer, a
/// list's page). Never both: a request that sets state lists nothing.
pub(super) enum Beside {
    Confirm(super::confirm::Pending),
    Told(Heard, Arc<Session>),
}

impl Beside {
    /// `resp` (an event stream when `is_sse`), read beside for this.
    pub(super) fn read(
        self,
        resp: http::Response<ProxyBody>,
        is_sse: bool,
    ) -> http::Response<ProxyBody> {
        use http_body_util::BodyExt;
        match self {
            Beside::Told(heard, session) => {
                resp.map(|body| Telling::new(body, is_sse, heard, session).boxed_unsync())
            }
            Beside::Confirm(pending) => {
                resp.map(|body| super::confirm::Confirm::new(body, pending, is_sse).boxed_unsync())
            }
        }
    }
}

/// What a POST's answer (`status`) on `carried`'s session tells its client, when it is a 2xx
/// answer to a list call (`method`: the request's MCP method, asked only then).
pub(super) fn tells(
    carried: Option<&super::Carried>,
    status: http::StatusCode,
    body: &crate::replay::BodyHandle,
    method: impl FnOnce() -> crate::mcp_method::McpMethod,
) -> Option<Beside> {
    let carried = carried?;
    if !status.is_success() {
        return None;
    }
    let heard = heard_list(method(), body)?;
    Some(Beside::Told(heard, carried.session.clone()))
}

/// What the answer to a request of `method` (on a carried session, answered 2xx) tells its
/// client, when it is a page of a list: the first when the request (its kept copy, `body`)
/// names no cursor. A request whose copy was not kept is taken as a later page: the list is
/// then noted as received but unknown.
fn heard_list(
    method: crate::mcp_method::McpMethod,
    body: &crate::replay::BodyHandle,
) -> Option<Heard> {
    let list = List::of_method(method.as_str())?;
    let first = body
        .with_complete_body(|b| {
            crate::jsonrpc::one(b).is_some_and(|m| m.param_str("cursor").is_none())
        })
        .unwrap_or(false);
    Some(Heard::Page { list, first })
}
