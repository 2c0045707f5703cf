//! A client's HTTP/1 connection as two parties use it: the connection's driver (it reads request
//! heads and writes answers, `src/server/h1.rs`) and the request body the proxy reads
//! ([`RequestBody`]). Both run in the connection's one task, one after the other, so the socket
//! and what was read from it sit behind one uncontended lock, taken only inside a poll and never
//! across a call into the other party: the driver polls an answer's body (which may read the
//! request body, when the upstream answered before the upload ended) without holding it.
//!
//! An idle connection holds its socket and nothing else: bytes are read into a buffer allocated
//! once the socket is readable ([`super::read`]), and a buffer emptied by the parser is dropped.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use super::decode::{Decoded, Decoder};
use super::read::{poll_read_buf, release, Readable};
use super::socket::Socket;
use super::Error;

/// A client connection: plain TCP (`Left`), or TLS over TCP (`Right`, boxed: a TLS session is
/// large). tokio-util's `Either` passes reads and writes, vectored ones included, to the one it
/// holds.
pub type Io = Either<Socket, Box<TlsStream<Socket>>>;

impl super::read::sealed::Sealed for Io {}

impl Readable for Io {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Either::Left(socket) => socket.poll_readable(cx),
            // Bytes may wait decrypted inside the TLS session while the socket is quiet: read.
            Either::Right(_) => Poll::Ready(Ok(())),
        }
    }
}

/// The connection, shared by its driver and the current request's body.
pub struct SharedConn {
    state: Mutex<State>,
}

/// What the lock guards.
pub struct State {
    /// The socket.
    pub io: Io,
    /// Bytes read and not yet used: the rest of a request body, or the next request's head.
    pub buf: BytesMut,
    /// The current request's body while some of it is unread.
    pub body: Option<Decoder>,
    /// `100 Continue` owed to a client that waits for it before sending its body: the bytes
    /// of it already written.
    pub continue_owed: Option<usize>,
    /// A request body failed (malformed framing, a truncated or broken upload): where the
    /// next request would start is unknown, so the connection must not carry another. Never
    /// reset: it outlives the request whose body failed.
    pub body_failed: bool,
    /// Counts the requests begun: a body is its request's only ([`State::begin`]).
    generation: u64,
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Bytes read at a time when the body's length does not say how many are coming.
pub const READ_SIZE: usize = 8 * 1024;

/// Most bytes read at a time into one buffer.
const MAX_READ_SIZE: usize = 64 * 1024;

impl SharedConn {
    /// A new connection.
    pub fn new(io: Io) -> Arc<SharedConn> {
        Arc::new(SharedConn {
            state: Mutex::new(State {
                io,
                buf: BytesMut::new(),
                body: None,
                continue_owed: None,
                body_failed: false,
                generation: 0,
            }),
        })
    }

    /// The state. A panic elsewhere while holding the lock leaves nothing half-done that
    /// matters here (the connection is about to close anyway), so a poisoned lock is used.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state, once nothing else shares the connection.
    pub fn into_state(self) -> State {
        self.state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes through the lock, holding it only inside each write.
    pub fn writer(&self) -> SharedWriter<'_> {
        SharedWriter(self)
    }
}

/// The connection as an `AsyncWrite` that takes the lock only for each write.
pub struct SharedWriter<'a>(&'a SharedConn);

impl AsyncWrite for SharedWriter<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0.lock().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0.lock().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.lock().io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().io).poll_shutdown(cx)
    }
}

/// Frames up to this size are copied out of the read buffer they arrived in.
const COPIED: usize = 4096;

/// A small frame in an allocation of its own. A request body is kept (for a replay) as long as
/// its request lives, a held one for up to the hold's timeout: as a slice of the read buffer, a
/// 1 KiB tool call would keep the whole 8 KiB buffer with it. A large frame fills most of its
/// buffer anyway, and is not copied.
fn own(data: Bytes) -> Bytes {
    if data.len() <= COPIED {
        super::copied::copy(&data)
    } else {
        data
    }
}

/// A request's body, read off the client's connection as the proxy asks for it. `100 Continue`
/// goes out when it is first asked for, as hyper does: a request answered without reading its
/// body never invites the client to send it.
pub struct RequestBody {
    shared: Arc<SharedConn>,
    /// Nothing left to read (the state's decoder is gone).
    done: bool,
    /// The request it belongs to.
    generation: u64,
}

impl RequestBody {
    /// The body of the request just begun on `shared` ([`State::begin`]).
    pub fn new(shared: Arc<SharedConn>) -> Self {
        let (done, generation) = {
            let st = shared.lock();
            (st.body.is_none(), st.generation)
        };
        RequestBody {
            shared,
            done,
            generation,
        }
    }
}

impl State {
    /// A new request begins, with a body framed as `framing` (whose client waits for
    /// `100 Continue` if `expect_continue`): a body of an earlier request reads nothing more.
    pub fn begin(&mut self, framing: super::Framing, expect_continue: bool) {
        let decoder = Decoder::new(framing);
        self.body = (!decoder.is_done()).then_some(decoder);
        self.continue_owed = (expect_continue && self.body.is_some()).then_some(0);
        self.generation += 1;
    }

    /// The request body failed: nothing more of it is read, and the connection closes after
    /// this request's answer.
    fn fail(&mut self) {
        self.body = None;
        self.body_failed = true;
    }

    /// Whether the connection may carry another request: its last request's body was read to
    /// its end, and did not fail.
    pub fn reusable(&self) -> bool {
        self.body.is_none() && !self.body_failed
    }

    /// Writes what is left of an owed `100 Continue`.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(at) = self.continue_owed {
            if at == CONTINUE.len() {
                self.continue_owed = None;
                break;
            }
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &CONTINUE[at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_owed = Some(at + n);
        }
        Poll::Ready(Ok(()))
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let st = &mut *state;
        if st.generation != self.generation {
            // The connection moved on: this body ended long ago.
            self.done = true;
            return Poll::Ready(None);
        }
        if let Err(e) = std::task::ready!(st.poll_continue(cx)) {
            st.fail();
            self.done = true;
            return Poll::Ready(Some(Err(Error::Io(e))));
        }
        loop {
            let Some(decoder) = st.body.as_mut() else {
                self.done = true;
                return Poll::Ready(None);
            };
            let decoded = match decoder.decode(&mut st.buf) {
                Ok(decoded) => decoded,
                Err(e) => {
                    st.fail();
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            match decoded {
                Decoded::Data(data) => {
                    if decoder.is_done() {
                        st.body = None;
                        self.done = true;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(own(data)))));
                }
                // A client's trailer fields were read and checked, and are not forwarded: they
                // would reach the upstream past everything done to the head's fields (Host,
                // X-Forwarded-*, Mcp-Session-Id, framing). hyper's server did not forward them
                // either.
                Decoded::Trailers(_) => {
                    st.body = None;
                    self.done = true;
                    return Poll::Ready(None);
                }
                Decoded::End => {
                    st.body = None;
                    self.done = true;
                    return Poll::Ready(None);
                }
                Decoded::NeedMore => {}
            }
            let size = decoder
                .known_rest()
                .map_or(READ_SIZE, |n| n.min(MAX_READ_SIZE as u64) as usize);
            match poll_read_buf(&mut st.io, cx, &mut st.buf, size) {
                Poll::Pending => {
                    release(&mut st.buf);
                    return Poll::Pending;
                }
                Poll::Ready(Ok(0)) => {
                    st.fail();
                    self.done = true;
                    return Poll::Ready(Some(Err(Error::Incomplete)));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    st.fail();
                    self.done = true;
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.done {
            return true;
        }
        let st = self.shared.lock();
        st.generation != self.generation || st.body.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(0);
        }
        match self
            .shared
            .lock()
            .body
            .as_ref()
            .and_then(Decoder::length_rest)
        {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
