//! A client's HTTP/1.1 connection, served by holdfast itself: read a request head, hand the
//! request to the proxy, write its answer, and again, for as long as both sides keep the
//! connection.
//!
//! What hyper's HTTP/1 server did here, and what this keeps of it:
//! - the head's limits: `limits.max_header_bytes` and `limits.max_headers` (431 beyond), a
//!   malformed head 400, a target over 64 KiB 414; `limits.header_read_timeout_secs` from a
//!   head's first byte to its end (a slow head is cut off without an answer), and as the
//!   keep-alive idle timeout between requests;
//! - `100 Continue` when the proxy first reads a body whose client waits for it;
//! - answers framed by their `Content-Length`, else chunked (closed-delimited for an HTTP/1.0
//!   client), with a `Date`, nothing for a HEAD, a 204 or a 304;
//! - a client that hangs up while its request waits for an answer cancels the request (once
//!   its body is read: until then the proxy's read of it notices);
//! - at the connection limit the longest-idle connection closes ([`super::idle`]); a drain lets
//!   the request in progress finish, then closes.
//!
//! What it does not keep: while a connection waits for its next request, or streams an answer
//! between events, it holds its socket and no buffer (hyper kept 8 KiB to read and 8 KiB to
//! write for the connection's whole life), and the request's future lives only while the
//! request does.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::AsyncWrite;
use tokio::sync::watch;
use tokio::time::Instant;

use super::idle::Registered;
use crate::http1::conn::{Io, RequestBody, SharedConn, READ_SIZE};
use crate::http1::encode::{self, BodyWriter};
use crate::http1::fields;
use crate::http1::head::{self, RequestHead};
use crate::http1::read::{poll_read_buf, release};
use crate::http1::Framing;
use crate::proxy::body::ProxyBody;
use crate::proxy::current::{Cached, Current};
use crate::replay::ClientBody;

/// What a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes in a request head.
    pub max_head_bytes: usize,
    /// Most header lines in a request head.
    pub max_headers: usize,
    /// From a head's first byte to its end, and the keep-alive idle timeout.
    pub header_read_timeout: Duration,
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `buf` opens with HTTP/2's preface: `None` while it is a start of it.
fn http2_preface(buf: &[u8]) -> Option<bool> {
    let seen = buf.len().min(PREFACE.len());
    if buf[..seen] != PREFACE[..seen] {
        Some(false)
    } else if seen == PREFACE.len() {
        Some(true)
    } else {
        None
    }
}

/// Longest a closing connection reads (and drops) what its client still sends, so that the
/// answer it was given is not destroyed by a reset (a socket closed with unread bytes resets).
const LINGER: Duration = Duration::from_secs(2);

/// Most bytes read and dropped while lingering.
const LINGER_BYTES: usize = 256 * 1024;

/// One connection's driver.
pub struct Connection {
    shared: Arc<SharedConn>,
    /// Where requests go (a reload replaces it between two requests).
    current: Arc<Current>,
    /// The proxy this connection's requests go to, brought up to date before each.
    proxy: Cached,
    peer: SocketAddr,
    registered: Arc<Registered>,
    drain: watch::Receiver<bool>,
    limits: Limits,
    /// The connection's first bytes have yet to show whether it is HTTP/2.
    may_be_http2: bool,
    /// A request has begun on it: idle now, it is a keep-alive connection, which a drain
    /// closes at once.
    served: bool,
    /// The head timeout, one timer for the connection's life, moved on for each head. A new
    /// timer per head is entered into tokio's timer wheel and taken out again under its lock
    /// every request; one moved to a later deadline is a single atomic update (the wheel finds
    /// the later deadline when the earlier one comes and files it again). Between heads it may
    /// fire unpolled: a spurious wake-up of a long exchange, once; moved on, it is entered anew.
    head_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a connection that has not sent its first request yet when a drain begins still
/// gets for it. Its client chose this holdfast before it could know of the drain, and has
/// usually sent the request already: closed unread, that request would fail in a way no client
/// or proxy in front retries for a POST. (A kept-alive connection's client knows the race.)
const FRESH_DRAIN_GRACE: Duration = Duration::from_secs(1);

/// The proxy's answer to a request, to come.
type Handling<'a> = Pin<Box<dyn std::future::Future<Output = Response<ProxyBody>> + Send + 'a>>;

/// A request handed to the proxy.
struct Begun<'a> {
    /// The connection is busy until its answer is written.
    busy: super::idle::Busy,
    /// The proxy's answer to come.
    handling: Handling<'a>,
    method: Method,
    version: Version,
    keep_alive: bool,
}

/// Why waiting for a head ended without a request.
enum Stop {
    /// The connection opened with HTTP/2's preface: it is not ours.
    Http2,
    /// A head to refuse with this status.
    Refuse(StatusCode),
    /// The connection ends: the client closed it, it was idle too long, a head was too slow,
    /// or it was closed to make room or for a drain.
    Close,
}

impl Connection {
    /// A connection on `io`. With `may_be_http2` its first bytes decide: HTTP/2's preface
    /// (h2c with prior knowledge, or TLS without ALPN) hands it back from [`Connection::serve`].
    pub fn new(
        io: Io,
        current: Arc<Current>,
        peer: SocketAddr,
        registered: Arc<Registered>,
        drain: watch::Receiver<bool>,
        limits: Limits,
        may_be_http2: bool,
    ) -> Self {
        Connection {
            shared: SharedConn::new(io),
            proxy: current.cached(),
            current,
            peer,
            registered,
            drain,
            limits,
            may_be_http2,
            served: false,
            head_timer: None,
        }
    }

    /// Serves requests until the connection ends, or hands it back, with what was read of it,
    /// when it turns out to speak HTTP/2.
    pub async fn serve(mut self) -> Option<(Io, BytesMut)> {
        loop {
            let keep = match self.next_head().await {
                Ok((head, receiving)) => {
                    self.served = true;
                    self.current.refresh(&mut self.proxy);
                    let begun = self.begin(head);
                    // The request is busy now: the head's own mark goes without the connection
                    // ever looking idle between them.
                    drop(receiving);
                    self.exchange(begun).await
                }
                Err(Stop::Refuse(status)) => {
                    self.refuse(status).await;
                    false
                }
                Err(Stop::Close) => return None,
                Err(Stop::Http2) => return self.into_io(),
            };
            if !keep {
                self.close().await;
                return None;
            }
        }
    }

    /// The socket and what was read from it (no request has begun: nothing else holds it).
    fn into_io(self) -> Option<(Io, BytesMut)> {
        let state = Arc::into_inner(self.shared)?.into_state();
        Some((state.io, state.buf))
    }

    /// Waits for, reads and parses the next request head. From its first byte the connection
    /// is busy (the returned mark): at `limits.max_connections`, making room closes a connection
    /// with nothing in progress, not one whose client is sending a head (a slow head is the
    /// head timeout's to end).
    ///
    /// Long on purpose: the read loop's exits (head timeout, drain, a client that closes, a
    /// head too large) are one `select!` each must see together to be sure none is missed.
    async fn next_head(&mut self) -> Result<(RequestHead, Option<super::idle::Busy>), Stop> {
        let since = Instant::now();
        // When this head's first byte arrived.
        let mut started: Option<Instant> = None;
        let mut receiving = None;
        // A new connection's last moment for its first request, once a drain began.
        let mut fresh_until: Option<Instant> = None;
        loop {
            {
                let mut st = self.shared.lock();
                if !st.buf.is_empty() && started.is_none() {
                    started = Some(Instant::now());
                    receiving = Some(self.registered.begin());
                }
                if self.may_be_http2 && !st.buf.is_empty() {
                    match http2_preface(&st.buf) {
                        Some(true) => return Err(Stop::Http2),
                        Some(false) => self.may_be_http2 = false,
                        // A start of the preface is no request head yet: more bytes decide.
                        None => {}
                    }
                }
                if !st.buf.is_empty() && !self.may_be_http2 {
                    let window = &st.buf[..st.buf.len().min(self.limits.max_head_bytes)];
                    match head::parse_request(window, self.limits.max_headers) {
                        Ok(Some((len, head))) => {
                            let _ = st.buf.split_to(len);
                            return Ok((head, receiving));
                        }
                        Ok(None) if st.buf.len() >= self.limits.max_head_bytes => {
                            return Err(Stop::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE))
                        }
                        Ok(None) => {}
                        Err(refusal) => {
                            tracing::debug!(peer = %self.peer, why = refusal.why, "a request head refused");
                            return Err(Stop::Refuse(refusal.status));
                        }
                    }
                }
            }
            let idle = started.is_none();
            let draining = *self.drain.borrow();
            if idle && draining && self.served {
                return Err(Stop::Close);
            }
            let mut deadline = started.unwrap_or(since) + self.limits.header_read_timeout;
            if idle && draining {
                let until = *fresh_until.get_or_insert_with(|| Instant::now() + FRESH_DRAIN_GRACE);
                deadline = deadline.min(until);
            }
            let timer = self
                .head_timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            // (On a new timer this is its registration, which its first poll would make.)
            timer.as_mut().reset(deadline);
            let shared = &self.shared;
            let read = std::future::poll_fn(|cx| {
                let mut st = shared.lock();
                let st = &mut *st;
                let read = poll_read_buf(&mut st.io, cx, &mut st.buf, READ_SIZE);
                if read.is_pending() {
                    release(&mut st.buf);
                }
                read
            });
            tokio::select! {
                biased;
                read = read => match read {
                    Ok(0) | Err(_) => return Err(Stop::Close),
                    Ok(_) => {}
                },
                // A slow head (slowloris), or a keep-alive connection idle too long.
                () = timer.as_mut() => return Err(Stop::Close),
                // Closed to make room at the connection limit (only while idle).
                () = self.registered.closed(), if idle => {
                    if self.registered.may_close() {
                        return Err(Stop::Close);
                    }
                }
                // A kept-alive connection closes; a new one gets FRESH_DRAIN_GRACE (the next
                // turn of the loop).
                Ok(()) = self.drain.changed(), if idle => {
                    if self.served {
                        return Err(Stop::Close);
                    }
                }
            }
        }
    }

    /// Hands a request to the proxy (not async: the head is not kept in the connection's
    /// future, whose arguments would stay in it for the whole exchange).
    fn begin(&self, head: RequestHead) -> Begun<'_> {
        let RequestHead {
            parts,
            framing,
            keep_alive,
            expect_continue,
        } = head;
        let method = parts.method.clone();
        let version = parts.version;
        self.shared.lock().begin(framing, expect_continue);
        let body = ClientBody::H1(RequestBody::new(self.shared.clone()));
        Begun {
            busy: self.registered.begin(),
            // Boxed: it lives only while a request does, and an idle connection's task stays
            // small.
            handling: Box::pin(
                self.proxy
                    .proxy()
                    .handle(Request::from_parts(parts, body), self.peer),
            ),
            method,
            version,
            keep_alive,
        }
    }

    /// One request's answer; whether the connection may carry another.
    async fn exchange(&self, begun: Begun<'_>) -> bool {
        let Begun {
            busy,
            handling,
            method,
            version,
            keep_alive,
        } = begun;
        let Some(resp) = until_answered(&self.shared, handling).await else {
            // The client went away: the request was cancelled with it.
            return false;
        };
        let mut keep = keep_alive && !*self.drain.borrow();
        let (head, framing, body) = answer_head(&method, version, resp, &mut keep);
        let mut writer = BodyWriter::new(head, framing, body);
        let mut written = 0;
        let shared = &self.shared;
        // A client that hangs up while its answer streams (an event stream between events)
        // ends it now, not at the next event's failed write.
        let mut watch = Watch::default();
        let sent = std::future::poll_fn(|cx| {
            if let Poll::Ready(sent) = writer.poll_write(cx, &mut shared.writer(), &mut written) {
                return Poll::Ready(sent.map_err(Some));
            }
            if watch.poll_gone(shared, cx) {
                return Poll::Ready(Err(None));
            }
            Poll::Pending
        })
        .await;
        drop(busy);
        match sent {
            Ok(()) => {}
            Err(Some(error)) => {
                tracing::debug!(peer = %self.peer, %error, "an answer could not be written whole");
                return false;
            }
            Err(None) => return false,
        }
        if flush(shared).await.is_err() {
            return false;
        }
        // A body the proxy did not read to its end, or that failed: where the next request
        // starts is unknown.
        keep && shared.lock().reusable()
    }

    /// Answers a head that cannot be served, then closes.
    async fn refuse(&mut self, status: StatusCode) {
        tracing::debug!(peer = %self.peer, %status, "refused a request head");
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
        headers.insert(DATE, encode::date());
        let head = encode::response_head(Version::HTTP_11, status, &headers);
        let mut writer = BodyWriter::new(head, Framing::Empty, empty());
        let shared = &self.shared;
        let mut written = 0;
        let _ =
            std::future::poll_fn(|cx| writer.poll_write(cx, &mut shared.writer(), &mut written))
                .await;
        let _ = flush(shared).await;
    }

    /// Closes the connection: the write side first (the client reads the end of the last
    /// answer), then a short read of whatever the client still sends, so that closing with
    /// unread bytes does not reset the connection under that answer.
    async fn close(&mut self) {
        let shared = &self.shared;
        let shut = std::future::poll_fn(|cx| Pin::new(&mut shared.writer()).poll_shutdown(cx));
        if tokio::time::timeout(LINGER, shut).await.is_err() {
            return;
        }
        let mut drained = 0;
        let linger = async {
            loop {
                let read = std::future::poll_fn(|cx| {
                    let mut st = shared.lock();
                    let st = &mut *st;
                    st.buf.clear();
                    poll_read_buf(&mut st.io, cx, &mut st.buf, READ_SIZE)
                })
                .await;
                match read {
                    Ok(n) if n > 0 && drained < LINGER_BYTES => drained += n,
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, linger).await;
    }
}

/// Flushes what the connection's TLS session (if any) still holds.
async fn flush(shared: &SharedConn) -> std::io::Result<()> {
    std::future::poll_fn(|cx| Pin::new(&mut shared.writer()).poll_flush(cx)).await
}

/// The proxy's answer, or `None` when the client hung up first (the request is cancelled).
async fn until_answered(
    shared: &SharedConn,
    mut handling: Handling<'_>,
) -> Option<Response<ProxyBody>> {
    let mut watch = Watch::default();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(resp) = handling.as_mut().poll(cx) {
            return Poll::Ready(Some(resp));
        }
        if watch.poll_gone(shared, cx) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// Watches a client connection for its end while its request is answered. Only once the
/// request's body has been read (or it had none): until then the proxy's read of the body
/// notices. The first bytes of a pipelined next request end the watch (they stay read for it).
#[derive(Default)]
struct Watch {
    over: bool,
}

impl Watch {
    /// Whether the client has hung up (or its connection failed).
    fn poll_gone(&mut self, shared: &SharedConn, cx: &mut std::task::Context<'_>) -> bool {
        if self.over {
            return false;
        }
        let mut st = shared.lock();
        let st = &mut *st;
        if st.body.is_some() || st.continue_owed.is_some() {
            return false;
        }
        if !st.buf.is_empty() {
            self.over = true;
            return false;
        }
        match poll_read_buf(&mut st.io, cx, &mut st.buf, 1024) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => true,
            Poll::Ready(Ok(_)) => {
                self.over = true;
                false
            }
            Poll::Pending => {
                release(&mut st.buf);
                false
            }
        }
    }
}

/// An empty body.
fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The answer's head in wire form, its framing, and the body to send. `keep` turns false when
/// the connection must close after it.
fn answer_head(
    method: &Method,
    version: Version,
    resp: Response<ProxyBody>,
    keep: &mut bool,
) -> (Vec<u8>, Framing, ProxyBody) {
    let (mut parts, body) = resp.into_parts();
    let status = parts.status;
    let headers = &mut parts.headers;
    // The proxy's own answer may ask to close (a 400 for a malformed request); a proxied
    // answer's `Connection` lines are gone already (hop-by-hop). Read and removed in one lookup:
    // the line that goes out is this connection's own.
    if let http::header::Entry::Occupied(lines) = headers.entry(CONNECTION) {
        if !fields::connection_keeps_alive(Version::HTTP_11, lines.iter()) {
            *keep = false;
        }
        lines.remove_entry_mult();
    }
    let no_body = method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    // A 204 (or 1xx) has no length to declare (RFC 9110 §8.6); a 304's and a HEAD's describe
    // the representation, and pass.
    if status == StatusCode::NO_CONTENT || status.is_informational() {
        headers.remove(CONTENT_LENGTH);
        headers.remove(TRANSFER_ENCODING);
    }
    let framing = if no_body {
        Framing::Empty
    } else if let Ok(Some(n)) = fields::content_length(headers) {
        Framing::Length(n)
    } else {
        headers.remove(CONTENT_LENGTH);
        if body.is_end_stream() {
            headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
            Framing::Length(0)
        } else if let Some(n) = body.size_hint().exact() {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            Framing::Length(n)
        } else if version == Version::HTTP_11 {
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            Framing::Chunked
        } else {
            // An HTTP/1.0 client reads to the close.
            *keep = false;
            Framing::Close
        }
    };
    if !headers.contains_key(DATE) {
        headers.insert(DATE, encode::date());
    }
    if !*keep {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    } else if version == Version::HTTP_10 {
        headers.insert(CONNECTION, HeaderValue::from_static("keep-alive"));
    }
    let head = encode::response_head(Version::HTTP_11, status, headers);
    // Written out: the map goes back for the next head.
    crate::http1::maps::recycle(std::mem::take(headers));
    let body = if no_body { empty() } else { body };
    (head, framing, body)
}

#[cfg(test)]
mod tests;
