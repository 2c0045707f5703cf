//! Bodies that stream through the proxy.
//!
//! Nothing here collects a body. [`UpstreamBody`] forwards the client's request body frame by
//! frame and keeps a bounded copy of its first bytes (so a synthetic answer can echo the JSON-RPC
//! id, and a request that never reached the application can be sent again); [`Timed`] forwards a
//! response body frame by frame under an *idle* timeout that every frame resets, never a total
//! deadline, so an SSE stream may live for hours.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::{Instant, Sleep};

use crate::metrics::{Abort, AbortLabel};

/// Boxed error type of bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type the proxy answers with: an upstream stream or a synthetic response.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// The client's request body failed while being forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    /// The client's connection failed mid-body.
    #[error("reading the client's request body failed")]
    Read(#[source] hyper::Error),
    /// The client sent nothing for longer than the idle timeout.
    #[error("the client's request body was idle for {0:?}")]
    Idle(Duration),
}

/// A response body stalled (no frame within the idle timeout).
#[derive(Debug, thiserror::Error)]
#[error("the upstream response body was idle for {0:?}")]
pub struct IdleTimeout(pub Duration);

/// State shared between the proxy and the body it handed to the client.
struct Shared {
    /// The part of the client's body not read yet.
    rest: Option<Incoming>,
    /// A copy of what was read so far, while it fits under the cap.
    seen: BytesMut,
    /// The copy's cap.
    cap: usize,
    /// More than `cap` bytes were read: `seen` is incomplete and no longer grows.
    overflowed: bool,
    /// The client's body ended (its whole content is in `seen` unless overflowed).
    complete: bool,
}

/// The request body sent upstream.
///
/// Reads lazily from the client's body: a request that fails while connecting was never polled,
/// and the proxy can still read the body afterwards ([`BodyHandle::read_prefix`]).
pub struct UpstreamBody {
    shared: Arc<Mutex<Shared>>,
    idle: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

/// The proxy's handle on a request body it handed to the client.
#[derive(Clone)]
pub struct BodyHandle {
    shared: Arc<Mutex<Shared>>,
}

impl UpstreamBody {
    /// Wraps the client's body; at most `cap` bytes are copied as they pass.
    pub fn new(incoming: Incoming, cap: usize, idle: Duration) -> (UpstreamBody, BodyHandle) {
        let complete = incoming.is_end_stream();
        let shared = Arc::new(Mutex::new(Shared {
            rest: Some(incoming),
            seen: BytesMut::new(),
            cap,
            overflowed: false,
            complete,
        }));
        (
            UpstreamBody {
                shared: shared.clone(),
                idle,
                sleep: None,
            },
            BodyHandle { shared },
        )
    }

    /// An empty body, for requests built by the proxy itself.
    pub fn empty() -> UpstreamBody {
        UpstreamBody {
            shared: Arc::new(Mutex::new(Shared {
                rest: None,
                seen: BytesMut::new(),
                cap: 0,
                overflowed: false,
                complete: true,
            })),
            idle: Duration::MAX,
            sleep: None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = &mut *self;
        let mut shared = this.shared.lock().expect("body lock");
        let Some(rest) = shared.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(rest).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.sleep = None;
                if let Some(data) = frame.data_ref() {
                    if !shared.overflowed {
                        if shared.seen.len() + data.len() <= shared.cap {
                            shared.seen.extend_from_slice(data);
                        } else {
                            shared.overflowed = true;
                            shared.seen = BytesMut::new();
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                shared.rest = None;
                Poll::Ready(Some(Err(ClientBodyError::Read(e))))
            }
            Poll::Ready(None) => {
                shared.rest = None;
                shared.complete = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                drop(shared);
                let idle = this.idle;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline(idle))));
                ready!(sleep.as_mut().poll(cx));
                this.shared.lock().expect("body lock").rest = None;
                Poll::Ready(Some(Err(ClientBodyError::Idle(idle))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let shared = self.shared.lock().expect("body lock");
        shared.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let shared = self.shared.lock().expect("body lock");
        match &shared.rest {
            Some(r) => r.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}

impl BodyHandle {
    /// The whole body when it is known and fits under the cap: what was copied while streaming,
    /// plus, if the body was never sent (a connect failure), the rest read now within `wait`.
    /// `None` when the body is larger than the cap or does not arrive in time.
    pub async fn read_prefix(&self, wait: Duration) -> Option<Bytes> {
        let deadline = Instant::now() + wait;
        loop {
            let mut rest = {
                let mut shared = self.shared.lock().expect("body lock");
                if shared.overflowed {
                    return None;
                }
                if shared.complete {
                    return Some(shared.seen.clone().freeze());
                }
                // The body is neither complete nor being read by anyone else (the attempt that
                // held it is over): take it and read on.
                shared.rest.take()?
            };
            let frame = tokio::time::timeout_at(
                deadline,
                std::future::poll_fn(|cx| Pin::new(&mut rest).poll_frame(cx)),
            )
            .await;
            let mut shared = self.shared.lock().expect("body lock");
            match frame {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        if shared.seen.len() + data.len() > shared.cap {
                            shared.overflowed = true;
                            shared.seen = BytesMut::new();
                            return None;
                        }
                        shared.seen.extend_from_slice(data);
                    }
                    shared.rest = Some(rest);
                }
                Ok(None) => shared.complete = true,
                Ok(Some(Err(_))) | Err(_) => return None,
            }
        }
    }
}

fn deadline(idle: Duration) -> Instant {
    // `Duration::MAX` means "no timeout"; keep the addition from overflowing.
    Instant::now()
        .checked_add(idle)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}

pin_project_lite::pin_project! {
    /// A response body forwarded under an idle timeout, optionally after bytes already read
    /// (a peeked body), with a guard dropped when the stream ends (e.g. the SSE gauge).
    pub struct Timed<B> {
        prefix: Option<Bytes>,
        #[pin]
        inner: B,
        idle: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
        guard: Option<Box<dyn Send>>,
        aborts: Option<Family<AbortLabel, Counter>>,
    }
}

impl<B> Timed<B> {
    /// Forwards `inner` after `prefix`, failing when no frame arrives for `idle`.
    pub fn new(prefix: Option<Bytes>, inner: B, idle: Duration) -> Self {
        Self {
            prefix: prefix.filter(|p| !p.is_empty()),
            inner,
            idle,
            sleep: None,
            guard: None,
            aborts: None,
        }
    }

    /// Counts aborted responses (`holdfast_response_aborts_total`) in `family`.
    pub fn counting_aborts(mut self, family: &Family<AbortLabel, Counter>) -> Self {
        self.aborts = Some(family.clone());
        self
    }

    /// Keeps `guard` alive exactly as long as the body.
    pub fn with_guard(mut self, guard: impl Send + 'static) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }
}

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.sleep = None;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                *this.guard = None;
                count_abort(this.aborts, Abort::upstream_error);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                *this.guard = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let idle = *this.idle;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline(idle))));
                ready!(sleep.as_mut().poll(cx));
                *this.guard = None;
                count_abort(this.aborts, Abort::idle_timeout);
                Poll::Ready(Some(Err(Box::new(IdleTimeout(idle)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(p) = &self.prefix else {
            return inner;
        };
        let n = p.len() as u64;
        // Built from an unbounded hint: SizeHint asserts lower <= upper at every step.
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + n);
        if let Some(u) = inner.upper() {
            hint.set_upper(u + n);
        }
        hint
    }
}

fn count_abort(family: &Option<Family<AbortLabel, Counter>>, reason: Abort) {
    if let Some(f) = family {
        f.get_or_create(&AbortLabel { reason }).inc();
    }
}
