//! The client's request body, forwarded as it streams and kept (up to a cap) for a replay.
//!
//! A [`BodyHandle`] owns the client's body. Each attempt at the upstream gets a [`ReplayBody`]
//! from [`BodyHandle::attempt`]: it yields the bytes already read, then reads on from the client.
//! While no more than `cap` bytes have been read, every one of them is kept, so a request that
//! provably never reached the application can be sent again; past the cap the copy is dropped
//! and the request can be sent once only (linkerd2-proxy's `ReplayBody` and pingora's capped
//! retry buffer work the same way).
//!
//! Nothing here waits for the whole body before sending: a body is only read ahead
//! ([`BodyHandle::prefetch`]) while its request is held anyway.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// The client's request body, whatever protocol brought it.
pub enum ClientBody {
    /// Read off an HTTP/1 connection by holdfast itself.
    H1(crate::http1::conn::RequestBody),
    /// From hyper's HTTP/2.
    H2(Incoming),
    /// Whole in memory: a request holdfast makes itself and sends through its own exchange (the
    /// era bridge's translated requests). `None` once sent.
    Memory(Option<Bytes>),
}

impl ClientBody {
    /// A body of `bytes`, whole.
    pub fn memory(bytes: impl Into<Bytes>) -> ClientBody {
        ClientBody::Memory(Some(bytes.into()))
    }
}

/// Why reading the client's request body failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// On an HTTP/1 connection.
    #[error(transparent)]
    H1(crate::http1::Error),
    /// On an HTTP/2 one.
    #[error(transparent)]
    H2(hyper::Error),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        match self.get_mut() {
            ClientBody::H1(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ReadError::H1))),
            ClientBody::H2(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ReadError::H2))),
            ClientBody::Memory(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::H1(body) => body.is_end_stream(),
            ClientBody::H2(body) => body.is_end_stream(),
            ClientBody::Memory(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::H1(body) => body.size_hint(),
            ClientBody::H2(body) => body.size_hint(),
            ClientBody::Memory(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

/// The client's request body failed while being forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    /// The client's connection failed mid-body.
    #[error("reading the client's request body failed")]
    Read(#[source] ReadError),
    /// The client sent nothing for longer than the idle timeout.
    #[error("the client's request body was idle for {0:?}")]
    Idle(Duration),
    /// A newer attempt took over this body (the old attempt is abandoned).
    #[error("the request body was handed to a newer attempt")]
    Superseded,
    /// The body failed earlier, in another attempt.
    #[error("the client's request body failed earlier")]
    Failed,
}

/// Bytes of request-body copies in memory over all requests, in flight or held: past it a request
/// keeps no copy (it streams as usual, and cannot be sent twice).
#[derive(Debug)]
pub struct CopyBudget {
    used: AtomicUsize,
    /// The bound; a reload may move it (copies already taken stay).
    max: AtomicUsize,
}

impl CopyBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Arc<CopyBudget> {
        Arc::new(CopyBudget {
            used: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
        })
    }

    /// A new bound (a reload): copies already taken stay; new ones fit under it.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Release);
    }

    fn try_take(&self, n: usize) -> bool {
        let max = self.max.load(Ordering::Acquire);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= max)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes in use now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// State shared by the handle and the attempts' bodies.
struct SharedBody {
    /// The part of the client's body not read yet.
    rest: Option<ClientBody>,
    /// Bytes read from the client and still held: all of them while `replayable`, otherwise
    /// only those no attempt has sent yet.
    chunks: Vec<Bytes>,
    /// Sum of `chunks`' lengths, all taken from `budget`.
    buffered: usize,
    /// Most bytes kept for a replay.
    cap: usize,
    /// The process-wide budget `buffered` is taken from.
    budget: Arc<CopyBudget>,
    /// Every byte read so far is still in `chunks`.
    replayable: bool,
    /// Reading ahead passed the cap (or the budget): read no further ahead.
    full: bool,
    /// The client's body ended.
    complete: bool,
    /// When the body was read to its end (the response timeout counts from then).
    completed_at: Option<Instant>,
    /// The client's trailers, if it sent any.
    trailers: Option<HeaderMap>,
    /// Reading the client's body failed.
    failed: bool,
    /// Incremented by every attempt; bodies of older attempts stop.
    generation: u64,
    /// Every byte read from the client so far, kept or not (the access log's `bytes_in`).
    read: u64,
}

impl SharedBody {
    fn new(rest: Option<ClientBody>, cap: usize, budget: Arc<CopyBudget>, complete: bool) -> Self {
        SharedBody {
            rest,
            chunks: Vec::new(),
            buffered: 0,
            cap,
            budget,
            replayable: true,
            full: false,
            complete,
            completed_at: complete.then(Instant::now),
            trailers: None,
            failed: false,
            generation: 0,
            read: 0,
        }
    }

    /// Records bytes just read from the client; `delivered` when an attempt is sending them now.
    fn record(&mut self, data: &Bytes, delivered: bool) {
        self.read += data.len() as u64;
        let fits = self.replayable
            && self.buffered + data.len() <= self.cap
            && self.budget.try_take(data.len());
        if fits {
            self.chunks.push(data.clone());
            self.buffered += data.len();
        } else if delivered {
            // Over the cap while being sent: everything in `chunks` was sent already, and these
            // bytes are gone with this attempt. The request can no longer be sent twice.
            self.replayable = false;
            self.drop_chunks();
        } else {
            // Over the cap while reading ahead: nobody has sent these bytes yet, so they must be
            // kept (outside the budget, one frame at most); reading ahead stops here.
            self.full = true;
            self.chunks.push(data.clone());
            self.buffered += data.len();
            self.budget.used.fetch_add(data.len(), Ordering::AcqRel);
        }
    }

    /// Marks the body complete as soon as the client's body says it has ended (its length is
    /// reached), without waiting for one more poll: the connection may never make that poll once
    /// the length is read, and a complete body is what a replay or a recorded `initialize` needs.
    fn note_end(&mut self) {
        if self.rest.as_ref().is_some_and(|rest| rest.is_end_stream()) {
            self.rest = None;
            self.mark_complete();
        }
    }

    /// Every byte of the body has been read from the client.
    fn mark_complete(&mut self) {
        self.complete = true;
        self.completed_at.get_or_insert_with(Instant::now);
    }

    /// Frees every kept byte.
    fn drop_chunks(&mut self) {
        self.chunks.clear();
        self.budget.give_back(std::mem::take(&mut self.buffered));
    }
}

impl Drop for SharedBody {
    fn drop(&mut self) {
        self.budget.give_back(self.buffered);
    }
}

/// The proxy's handle on one request body.
#[derive(Clone)]
pub struct BodyHandle {
    shared: Arc<Mutex<SharedBody>>,
    idle: Duration,
}

/// The body of one attempt.
pub struct ReplayBody {
    shared: Arc<Mutex<SharedBody>>,
    generation: u64,
    /// Next index into `chunks` to send.
    pos: usize,
    trailers_sent: bool,
    idle: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl BodyHandle {
    /// Takes over the client's body. At most `cap` bytes are kept for a replay; `idle` bounds
    /// the wait for each frame from the client.
    pub fn new(
        incoming: ClientBody,
        cap: usize,
        budget: Arc<CopyBudget>,
        idle: Duration,
    ) -> BodyHandle {
        let complete = incoming.is_end_stream();
        BodyHandle {
            shared: Arc::new(Mutex::new(SharedBody::new(
                (!complete).then_some(incoming),
                cap,
                budget,
                complete,
            ))),
            idle,
        }
    }

    /// A handle on an empty body (a request without one, or a test).
    pub fn empty() -> BodyHandle {
        BodyHandle {
            shared: Arc::new(Mutex::new(SharedBody::new(
                None,
                0,
                CopyBudget::new(0),
                true,
            ))),
            idle: Duration::MAX,
        }
    }

    /// A handle on a body holdfast makes itself (a session's re-initialize): complete, kept
    /// whole, and outside the copy budget of client bodies (its own budget, as small as it is).
    pub fn from_bytes(bytes: Bytes) -> BodyHandle {
        let len = bytes.len();
        let mut shared = SharedBody::new(None, len, CopyBudget::new(len), true);
        if len > 0 {
            shared.record(&bytes, false);
        }
        BodyHandle {
            shared: Arc::new(Mutex::new(shared)),
            idle: Duration::MAX,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SharedBody> {
        self.shared.lock().expect("request body lock")
    }

    /// A body for the next attempt, or `None` when an earlier attempt sent bytes that are no
    /// longer kept (the request cannot be sent again).
    pub fn attempt(&self) -> Option<ReplayBody> {
        let mut shared = self.lock();
        let first = shared.generation == 0;
        if !first && !shared.replayable {
            return None;
        }
        shared.generation += 1;
        Some(ReplayBody {
            shared: self.shared.clone(),
            generation: shared.generation,
            pos: 0,
            trailers_sent: false,
            idle: self.idle,
            sleep: None,
        })
    }

    /// Stops the current attempt's body, if it is still being read (e.g. by a connection the
    /// upstream abandoned).
    pub fn supersede(&self) {
        self.lock().generation += 1;
    }

    /// Whether the request could be sent (again) now.
    pub fn is_replayable(&self) -> bool {
        let shared = self.lock();
        shared.generation == 0 || shared.replayable
    }

    /// Whether reading the client's body failed (the client went away mid-body).
    pub fn has_failed(&self) -> bool {
        self.lock().failed
    }

    /// The body bytes this request is expected to hold while it waits: what is read already plus
    /// what the client declared it will still send, at most `cap` in all. A body of unknown
    /// length (chunked, HTTP/2) counts only what was read: reserving the whole cap for each would
    /// let a few dozen such requests fill the hold, and the process-wide [`CopyBudget`] bounds
    /// what reading ahead adds anyway.
    pub fn expected_bytes(&self, cap: usize) -> usize {
        let shared = self.lock();
        let more = match &shared.rest {
            Some(rest) => rest.size_hint().upper().unwrap_or(0),
            None => 0,
        };
        let total = shared.buffered as u64 + more;
        total.min(cap as u64) as usize
    }

    /// Reads the client's body ahead into the buffer until it ends, fails, or passes the cap.
    /// Meant for a request that is waiting anyway: once its body is read, the client's
    /// connection notices a client that hangs up (it watches the socket only after the body). Cancel-safe: the client's
    /// body never leaves the shared state, it is only polled in place, so dropping this future
    /// (the request is released) loses nothing.
    pub async fn prefetch(&self) {
        std::future::poll_fn(|cx| {
            let mut shared = self.lock();
            loop {
                if !shared.replayable || shared.full || shared.complete || shared.failed {
                    return Poll::Ready(());
                }
                let Some(rest) = shared.rest.as_mut() else {
                    return Poll::Ready(());
                };
                match ready!(Pin::new(rest).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            shared.record(&data, false);
                            shared.note_end();
                        }
                        Err(frame) => shared.trailers = frame.into_trailers().ok(),
                    },
                    None => {
                        shared.rest = None;
                        shared.mark_complete();
                    }
                    Some(Err(_)) => {
                        shared.rest = None;
                        shared.failed = true;
                    }
                }
            }
        })
        .await
    }

    /// The complete body, if it has been read to its end and kept whole.
    pub fn complete_body(&self) -> Option<Bytes> {
        let shared = self.lock();
        if !shared.complete || !shared.replayable {
            return None;
        }
        let mut out = BytesMut::with_capacity(shared.buffered);
        for c in &shared.chunks {
            out.extend_from_slice(c);
        }
        Some(out.freeze())
    }

    /// Bytes of the body read from the client so far.
    pub fn bytes_read(&self) -> u64 {
        self.lock().read
    }

    /// Runs `read` on the complete body, if it has been read to its end and kept whole, without
    /// copying it when it arrived in one piece (the usual JSON-RPC request).
    pub fn with_complete_body<R>(&self, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let shared = self.lock();
        if !shared.complete || !shared.replayable {
            return None;
        }
        match shared.chunks.as_slice() {
            [] => Some(read(&[])),
            [one] => Some(read(one)),
            many => Some(read(&many.concat())),
        }
    }

    /// Reads at most the first `max` bytes of the complete body (`None` when it is not
    /// complete or not kept), joining no more chunks than those bytes need.
    pub fn with_body_prefix<R>(&self, max: usize, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let shared = self.lock();
        if !shared.complete || !shared.replayable {
            return None;
        }
        match shared.chunks.as_slice() {
            [] => Some(read(&[])),
            [first, ..] if first.len() >= max || shared.chunks.len() == 1 => {
                Some(read(&first[..first.len().min(max)]))
            }
            many => {
                let mut prefix = Vec::with_capacity(max);
                for chunk in many {
                    let take = (max - prefix.len()).min(chunk.len());
                    prefix.extend_from_slice(&chunk[..take]);
                    if prefix.len() == max {
                        break;
                    }
                }
                Some(read(&prefix))
            }
        }
    }

    /// The complete body if it can be had within `wait` (reading ahead if needed).
    pub async fn read_whole(&self, wait: Duration) -> Option<Bytes> {
        let _ = tokio::time::timeout(wait, self.prefetch()).await;
        self.complete_body()
    }
}

/// Whether a request body has been read to its end, asked after the body itself was handed on.
#[derive(Clone)]
pub struct Completion(Arc<Mutex<SharedBody>>);

impl Completion {
    /// Completes `timeout` after the body was read to its end: the response timeout, counted
    /// from the end of the upload (nginx's `proxy_read_timeout`), so an upload slower than it is
    /// not cut off; a stalled upload is the body's own idle timeout's. Checked only when a
    /// deadline passes: nothing is woken while the body streams.
    pub async fn elapsed_after_upload(&self, timeout: Duration) {
        let mut deadline = Instant::now() + timeout;
        loop {
            tokio::time::sleep_until(deadline).await;
            let completed_at = self.0.lock().expect("request body lock").completed_at;
            match completed_at {
                Some(at) if at + timeout <= Instant::now() => return,
                Some(at) => deadline = at + timeout,
                None => deadline = Instant::now() + timeout,
            }
        }
    }
}

impl ReplayBody {
    /// A handle that tells later whether the body was read to its end.
    pub fn completion(&self) -> Completion {
        Completion(self.shared.clone())
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    /// Long on purpose: one state machine of the body (superseded, failed, replaying the copy,
    /// reading on, idle) whose arms read best side by side.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = &mut *self;
        let mut shared = this.shared.lock().expect("request body lock");
        if shared.generation != this.generation {
            return Poll::Ready(Some(Err(ClientBodyError::Superseded)));
        }
        // First what earlier attempts (or reading ahead) already took from the client.
        if this.pos < shared.chunks.len() {
            let chunk = shared.chunks[this.pos].clone();
            this.pos += 1;
            if !shared.replayable && this.pos == shared.chunks.len() {
                // Not replayable: nothing needs these bytes after this attempt.
                shared.drop_chunks();
                this.pos = 0;
            }
            this.sleep = None;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if shared.complete {
            if !this.trailers_sent {
                this.trailers_sent = true;
                if let Some(t) = shared.trailers.clone() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
            }
            return Poll::Ready(None);
        }
        if shared.failed {
            return Poll::Ready(Some(Err(ClientBodyError::Failed)));
        }
        let Some(rest) = shared.rest.as_mut() else {
            // Another reader holds it: only `prefetch`, which runs while no attempt is live.
            return Poll::Ready(Some(Err(ClientBodyError::Superseded)));
        };
        match Pin::new(rest).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.sleep = None;
                match frame.into_data() {
                    Ok(data) => {
                        shared.record(&data, true);
                        shared.note_end();
                        this.pos = shared.chunks.len();
                        Poll::Ready(Some(Ok(Frame::data(data))))
                    }
                    Err(frame) => {
                        if let Some(t) = frame.trailers_ref() {
                            shared.trailers = Some(t.clone());
                            this.trailers_sent = true;
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                shared.rest = None;
                shared.failed = true;
                Poll::Ready(Some(Err(ClientBodyError::Read(e))))
            }
            Poll::Ready(None) => {
                shared.rest = None;
                shared.mark_complete();
                this.trailers_sent = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                drop(shared);
                let idle = this.idle;
                let sleep = this.sleep.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + idle))
                });
                ready!(sleep.as_mut().poll(cx));
                let mut shared = this.shared.lock().expect("request body lock");
                shared.rest = None;
                shared.failed = true;
                Poll::Ready(Some(Err(ClientBodyError::Idle(idle))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let shared = self.shared.lock().expect("request body lock");
        is_done(&shared, self.pos, self.trailers_sent)
    }

    fn size_hint(&self) -> SizeHint {
        let shared = self.shared.lock().expect("request body lock");
        let pending: u64 = shared.chunks[self.pos.min(shared.chunks.len())..]
            .iter()
            .map(|c| c.len() as u64)
            .sum();
        let mut hint = SizeHint::new();
        match (&shared.rest, shared.complete) {
            (_, true) => hint = SizeHint::with_exact(pending),
            (Some(rest), false) => {
                let r = rest.size_hint();
                hint.set_lower(pending + r.lower());
                if let Some(u) = r.upper() {
                    hint.set_upper(pending + u);
                }
            }
            (None, false) => hint.set_lower(pending),
        }
        hint
    }
}

fn is_done(shared: &SharedBody, pos: usize, trailers_sent: bool) -> bool {
    pos >= shared.chunks.len() && shared.complete && (trailers_sent || shared.trailers.is_none())
}
