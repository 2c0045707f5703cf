//! One HTTP/1.1 exchange with the upstream, driven by the request's own task.
//!
//! No connection task and no channel: [`send`] writes the request and reads the response head
//! in the task that asked, and the response [`Body`] reads the rest in whichever task polls it
//! (the client connection's, as it writes the answer out). While a connection waits in the pool
//! or an event stream waits for its next event, it holds its socket and nothing else: no read
//! buffer (one is allocated per read, once the socket is readable, and goes with the bytes it
//! carried), no write buffer (the head is written from its own allocation, frames from theirs).
//!
//! A request whose first write fails before any byte of it went out comes back whole
//! ([`Failure::Unwritten`]) and can go on another connection. Otherwise the kernel's count of
//! acknowledged bytes tells whether a request the upstream closed on was ever read
//! ([`Conn::acknowledged_since`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderValue, Method};
use http_body::{Frame, SizeHint};
use tokio::net::TcpStream;

use super::pool::{Pool, Reusable};
use super::tcp::{self, Liveness};
use super::{Head, ResponseLimits};
use crate::http1::decode::{Decoded, Decoder};
use crate::http1::encode::{self, BodyWriter};
use crate::http1::fields;
use crate::http1::head::{self, ResponseHead};
use crate::http1::read::{poll_read_buf, release};
use crate::http1::socket::Socket;
use crate::http1::Error;
use crate::http1::Framing;
use crate::replay::ReplayBody;

/// Bytes read at a time when the body's length does not say how many are coming.
const READ_SIZE: usize = 8 * 1024;

/// Most bytes read at a time into one buffer.
const MAX_READ_SIZE: usize = 64 * 1024;

/// A plain TCP connection to the upstream.
#[derive(Debug)]
pub struct Conn {
    socket: Socket,
    /// Bytes written since it connected.
    written: u64,
    /// `tcpi_bytes_acked` right after connecting: the handshake's SYN counts there too.
    acked_at_connect: u64,
    /// Counted open while it lives (`holdfast_upstream_connections`).
    _open: super::open::Open,
}

impl Conn {
    /// A connected stream, counted as `open`.
    pub fn new(tcp: TcpStream, open: super::open::Open) -> Self {
        let acked_at_connect = tcp::bytes_acked(&tcp).unwrap_or(0);
        Conn {
            socket: Socket::new(tcp),
            written: 0,
            acked_at_connect,
            _open: open,
        }
    }

    /// What the kernel says about this idle connection (see [`tcp::check`]).
    pub fn check(&self) -> Liveness {
        tcp::check(self.socket.tcp())
    }

    /// Whether the upstream's TCP acknowledged any byte written after `mark`; `None` when the
    /// kernel cannot tell.
    pub fn acknowledged_since(&self, mark: u64) -> Option<bool> {
        let acked = tcp::bytes_acked(self.socket.tcp()).ok()?;
        tcp::acknowledged(self.acked_at_connect, acked, mark)
    }
}

impl Reusable for Conn {
    fn check(&self, idle: std::time::Duration) -> Liveness {
        tcp::check_idle(self.socket.tcp(), idle)
    }
}

/// A request ready to be written: its head in wire form, its body and framing.
pub struct Outgoing {
    writer: BodyWriter<ReplayBody>,
    method: Method,
}

impl Outgoing {
    /// The request `head` (its URI's path and query are the request target) with `body`, and
    /// `host` as its `Host` when it has none. The body's framing comes from `Content-Length`,
    /// else from the body: none, a known length, or chunked. The head is borrowed (the exchange
    /// keeps it for a replay) and written out at once; what it lacks goes in as lines of the
    /// wire head only, each replacing any line of its name.
    pub fn new(head: Head<'_>, body: ReplayBody, host: &HeaderValue) -> Result<Outgoing, Error> {
        use http_body::Body as _;
        let headers = head.headers;
        let host = (!headers.contains_key(HOST)).then(|| (HOST, host.clone()));
        let (framing, line) = match fields::Length::of(headers).value()? {
            Some((n, plain)) => (
                Framing::Length(n),
                // A repeated or listed length goes out as one line.
                (!plain).then(|| (CONTENT_LENGTH, HeaderValue::from(n))),
            ),
            None if body.is_end_stream() => {
                // A POST without a body still says so: some servers wait for a length.
                let says = matches!(*head.method, Method::POST | Method::PUT | Method::PATCH);
                let zero = (CONTENT_LENGTH, HeaderValue::from_static("0"));
                (Framing::Empty, says.then_some(zero))
            }
            None => match body.size_hint().exact() {
                Some(n) => (
                    Framing::Length(n),
                    Some((CONTENT_LENGTH, HeaderValue::from(n))),
                ),
                None => (
                    Framing::Chunked,
                    Some((TRANSFER_ENCODING, HeaderValue::from_static("chunked"))),
                ),
            },
        };
        let target = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let wire = encode::request_head(head.method, target, headers, &[host, line]);
        Ok(Outgoing {
            writer: BodyWriter::new(wire, framing, body),
            method: head.method.clone(),
        })
    }
}

/// Why an exchange did not produce a response.
pub enum Failure {
    /// Not a byte of the request was written: here it is, whole, for another connection.
    Unwritten {
        /// The request.
        out: Box<Outgoing>,
        /// The connection, to ask the kernel why.
        conn: Conn,
        /// What failed.
        error: Error,
    },
    /// The request was (partly) written, or its body failed.
    Failed {
        /// What failed.
        error: Error,
        /// Whether the kernel proves the upstream never read it.
        unread: bool,
    },
}

/// Writes `out` on `conn` and reads the response head. The rest of the request body, if the
/// upstream answered before it was all written, goes on from the response body.
///
/// The request comes boxed and goes back in its box when it can go again (unwritten): the
/// futures of an exchange nest three deep, and a request held by value would be kept once per
/// level. Not an async fn for the same reason: its arguments would be kept twice.
#[allow(clippy::manual_async_fn)]
pub fn send(
    mut conn: Conn,
    mut out: Box<Outgoing>,
    limits: ResponseLimits,
) -> impl Future<Output = Result<(http::response::Parts, Body), Failure>> + Send {
    async move {
        let mark = conn.written;
        let mut buf = BytesMut::new();
        let mut writing = true;
        // A failed write does not end the exchange at once: an upstream that answers early (a
        // 413, a 404 for a forgotten session) and closes may have its answer waiting to be read.
        let mut write_error: Option<Error> = None;
        let head = std::future::poll_fn(|cx| {
            let Outgoing { writer, method } = &mut *out;
            if writing {
                match writer.poll_write(cx, &mut conn.socket, &mut conn.written) {
                    Poll::Ready(Ok(())) => writing = false,
                    Poll::Ready(Err(e @ Error::Body(_))) => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(e)) if writer.untouched() => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(e)) => {
                        writing = false;
                        write_error = Some(e);
                    }
                    Poll::Pending => {}
                }
            }
            poll_head(cx, &mut conn.socket, &mut buf, limits, method)
        })
        .await;
        match head {
            Ok(head) => {
                let writer = (writing && write_error.is_none()).then(|| Box::new(out.writer));
                let keep_alive = head.keep_alive && write_error.is_none();
                Ok((
                    head.parts,
                    Body::new(conn, buf, head.framing, keep_alive, writer),
                ))
            }
            Err(error) if out.writer.untouched() && !matches!(error, Error::Body(_)) => {
                Err(Failure::Unwritten { out, conn, error })
            }
            Err(error) => {
                let error = write_error.unwrap_or(error);
                let unread = unacknowledged(&error, &conn, mark);
                Err(Failure::Failed { error, unread })
            }
        }
    }
}

/// Whether a request whose exchange failed is proven unread: the connection ended with the
/// upstream's FIN (EOF) and the upstream's TCP acknowledged none of the bytes written for it.
/// A FIN carries the acknowledgement of every byte its sender's kernel had received, and a
/// server cannot read a byte its kernel never received: so a FIN that acknowledges none of the
/// request was sent before the request arrived. A reset proves nothing: Linux does not read the
/// acknowledgement on a RST, and a server that read the request and then aborted (`SO_LINGER`
/// 0, closing with bytes unread) sends one while its acknowledgement may still be delayed.
fn unacknowledged(error: &Error, conn: &Conn, mark: u64) -> bool {
    error.is_eof() && conn.acknowledged_since(mark) == Some(false)
}

/// Reads until a final response head is complete (100 Continue and 103 Early Hints are read
/// past: holdfast passes neither; a 101 is returned, for the proxy to refuse).
fn poll_head(
    cx: &mut Context<'_>,
    socket: &mut Socket,
    buf: &mut BytesMut,
    limits: ResponseLimits,
    method: &Method,
) -> Poll<Result<ResponseHead, Error>> {
    loop {
        if !buf.is_empty() {
            let window = &buf[..buf.len().min(limits.max_head_bytes)];
            match head::parse_response(window, limits.max_headers, method)? {
                Some((len, head)) => {
                    let _ = buf.split_to(len);
                    if head.parts.status.is_informational()
                        && head.parts.status != http::StatusCode::SWITCHING_PROTOCOLS
                    {
                        continue;
                    }
                    return Poll::Ready(Ok(head));
                }
                None if buf.len() >= limits.max_head_bytes => {
                    return Poll::Ready(Err(Error::HeadTooLarge(limits.max_head_bytes)))
                }
                None => {}
            }
        }
        match std::task::ready!(poll_read_buf(socket, cx, buf, READ_SIZE)) {
            Ok(0) => return Poll::Ready(Err(Error::Incomplete)),
            Ok(_) => {}
            Err(e) => return Poll::Ready(Err(Error::Io(e))),
        }
    }
}

/// A response body read straight off its connection. When it ends, the connection goes back
/// to the pool (if the exchange left it reusable); a body dropped before its end closes it.
pub struct Body {
    conn: Option<Conn>,
    buf: BytesMut,
    decoder: Decoder,
    /// The request's body, still being sent (the upstream answered before it was all written;
    /// boxed, as that is rare).
    writer: Option<Box<BodyWriter<ReplayBody>>>,
    keep_alive: bool,
    pool: Option<Arc<Pool<Conn>>>,
}

impl Body {
    fn new(
        conn: Conn,
        buf: BytesMut,
        framing: Framing,
        keep_alive: bool,
        writer: Option<Box<BodyWriter<ReplayBody>>>,
    ) -> Self {
        Body {
            conn: Some(conn),
            buf,
            decoder: Decoder::new(framing),
            writer,
            keep_alive,
            pool: None,
        }
    }

    /// Gives the connection to `pool` when the body ends (at once if there is none).
    pub fn return_to(&mut self, pool: &Arc<Pool<Conn>>) {
        self.pool = Some(pool.clone());
        if self.decoder.is_done() {
            self.finish();
        }
    }

    /// The body is complete: its connection goes back to the pool, or is closed.
    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Bytes after the body, or a request not sent whole: the connection's state is unknown.
        let reusable = self.keep_alive && self.writer.is_none() && self.buf.is_empty();
        match &self.pool {
            Some(pool) if reusable => pool.checkin(conn),
            _ => drop(conn),
        }
        release(&mut self.buf);
        self.buf = BytesMut::new();
    }

    /// Sends more of the request body, if any is left; a failure ends only the sending (and
    /// the connection's reuse), not the answer.
    fn poll_request_rest(&mut self, cx: &mut Context<'_>) {
        let (Some(writer), Some(conn)) = (self.writer.as_mut(), self.conn.as_mut()) else {
            return;
        };
        match writer.poll_write(cx, &mut conn.socket, &mut conn.written) {
            Poll::Ready(Ok(())) => self.writer = None,
            Poll::Ready(Err(error)) => {
                tracing::debug!(%error, "the rest of a request body could not be sent");
                self.writer = None;
                self.keep_alive = false;
            }
            Poll::Pending => {}
        }
    }

    fn fail(&mut self, error: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        self.writer = None;
        self.buf = BytesMut::new();
        Poll::Ready(Some(Err(error)))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        this.poll_request_rest(cx);
        loop {
            match this.decoder.decode(&mut this.buf) {
                Ok(Decoded::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => {}
                Err(e) => return this.fail(e),
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let size = this
                .decoder
                .known_rest()
                .map_or(READ_SIZE, |n| n.min(MAX_READ_SIZE as u64) as usize);
            match poll_read_buf(&mut conn.socket, cx, &mut this.buf, size) {
                Poll::Pending => {
                    release(&mut this.buf);
                    return Poll::Pending;
                }
                Poll::Ready(Ok(0)) => match this.decoder.eof() {
                    Ok(_) => {
                        this.keep_alive = false;
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(e),
                },
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(Error::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.length_rest() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
