//! Heads written out, and a body sent with its framing.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use http_body::Body;
use tokio::io::AsyncWrite;

use super::{Error, Framing};
use crate::errors::BoxError;

/// `METHOD target HTTP/1.1`, the header lines and the blank line, in one buffer: the lines
/// of `headers` and then the `added` ones, each of which replaces the lines of its name. So a
/// head is written from a map it does not own (a request kept for a replay) with lines of its
/// own, and the map is neither copied nor changed; an `added` slot left `None` adds nothing.
/// Most requests add nothing: their lines are written without a comparison each.
pub fn request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    added: &[Option<(HeaderName, HeaderValue)>],
) -> Vec<u8> {
    let pairs = || added.iter().flatten().map(|(n, v)| (n, v));
    // Room for every line of both: an added line that replaces one makes it a few bytes more
    // than needed, never a second allocation.
    let mut out = super::maps::head_buffer(
        method.as_str().len()
            + target.len()
            + 13
            + fields_len(headers.iter())
            + fields_len(pairs()),
    );
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if added.iter().all(Option::is_none) {
        write_lines(&mut out, headers.iter());
    } else {
        let replaced = |name: &HeaderName| pairs().any(|(a, _)| a == name);
        write_lines(&mut out, headers.iter().filter(|(n, _)| !replaced(n)));
        write_lines(&mut out, pairs());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// `HTTP/1.1 200 OK` (or `HTTP/1.0` for `version` 1.0), the header lines and the blank line.
pub fn response_head(version: Version, status: StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let reason = status.canonical_reason().unwrap_or("");
    let mut out = super::maps::head_buffer(15 + reason.len() + fields_len(headers.iter()));
    out.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    write_lines(&mut out, headers.iter());
    out.extend_from_slice(b"\r\n");
    out
}

/// The bytes of `fields` as lines, and of the blank line after them.
fn fields_len<'a>(fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> usize {
    2 + fields
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
}

/// `fields` as lines (the blank line after them is the caller's).
fn write_lines<'a>(
    out: &mut Vec<u8>,
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The `Date` header's value now, formatted once a second per thread (as hyper does: a
/// response needs one, and formatting a date per response costs more than the rest of its
/// head).
pub fn date() -> http::HeaderValue {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, http::HeaderValue)> =
            const { RefCell::new((u64::MAX, http::HeaderValue::from_static(""))) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            cached.1 = http::HeaderValue::from_str(&text).expect("an HTTP date is a header value");
            cached.0 = secs;
        }
        cached.1.clone()
    })
}

/// A chunk's size line, `{hex}\r\n`, without an allocation.
#[derive(Debug, Default, Clone, Copy)]
struct SizeLine {
    bytes: [u8; 18],
    len: u8,
}

impl SizeLine {
    fn new(size: usize) -> Self {
        let mut line = SizeLine::default();
        let digits = if size == 0 {
            1
        } else {
            (usize::BITS - size.leading_zeros()).div_ceil(4) as usize
        };
        for i in 0..digits {
            let nibble = (size >> (4 * (digits - 1 - i))) & 0xf;
            line.bytes[i] = b"0123456789ABCDEF"[nibble];
        }
        line.bytes[digits] = b'\r';
        line.bytes[digits + 1] = b'\n';
        line.len = (digits + 2) as u8;
        line
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Sends one message: its head, then its body's frames in its framing, one frame at a time
/// (nothing is queued beyond the frame being written). The head and the body's first frame go
/// out in one write when the first frame is at hand, as a whole small request or answer is.
///
/// A failure before any byte went out leaves everything here unsent: [`BodyWriter::untouched`]
/// says so, and the writer can go on another connection as it is.
pub struct BodyWriter<B> {
    head: Vec<u8>,
    head_at: usize,
    size: SizeLine,
    size_at: usize,
    data: Bytes,
    /// After the frame: its CRLF, or the last chunk with trailers.
    tail: Bytes,
    body: Option<B>,
    framing: Framing,
    /// Body bytes taken from the body so far.
    taken: u64,
    /// Whether any byte went to the connection.
    started: bool,
    /// Bytes were written since the last flush (a TLS session may hold them).
    unflushed: bool,
}

impl<B> BodyWriter<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// A message with `head` (already written out by [`request_head`] or [`response_head`])
    /// and `body` in `framing`.
    pub fn new(head: Vec<u8>, framing: Framing, body: B) -> Self {
        BodyWriter {
            head,
            head_at: 0,
            size: SizeLine::default(),
            size_at: 0,
            data: Bytes::new(),
            tail: Bytes::new(),
            body: Some(body),
            framing,
            taken: 0,
            started: false,
            unflushed: false,
        }
    }

    /// Whether no byte of the message has been written yet.
    pub fn untouched(&self) -> bool {
        !self.started
    }

    /// Whether anything is waiting to be written.
    fn pending(&self) -> bool {
        self.head_at < self.head.len()
            || self.size_at < self.size.len as usize
            || !self.data.is_empty()
            || !self.tail.is_empty()
    }

    /// Writes until the message is sent (`Ready(Ok)`), the connection or the body must be waited
    /// for (`Pending`), or something fails. `written` counts the bytes the connection took.
    pub fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut W,
        written: &mut u64,
    ) -> Poll<Result<(), Error>> {
        loop {
            // The next frame, once the previous one is out (and before the first write, so
            // that the head can take it along).
            let frame_gone = self.size_at == self.size.len as usize
                && self.data.is_empty()
                && self.tail.is_empty();
            if frame_gone && self.body.is_some() {
                match self.poll_next_frame(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    // Waiting for the body: what was written must reach the peer meanwhile
                    // (an event stream's last event), not wait in a TLS session's buffer.
                    Poll::Pending if !self.pending() => {
                        if self.unflushed {
                            ready!(Pin::new(&mut *io).poll_flush(cx))?;
                            self.unflushed = false;
                        }
                        return Poll::Pending;
                    }
                    // The head goes out without waiting for the body.
                    Poll::Pending => {}
                }
                if self.body.is_some() && !self.pending() {
                    continue;
                }
            }
            if !self.pending() {
                return Poll::Ready(Ok(()));
            }
            let n = ready!(self.poll_write_pending(cx, io))?;
            *written += n as u64;
            self.started = true;
            self.unflushed = true;
            self.advance(n);
        }
    }

    /// Takes one frame from the body into the pending bytes (or ends the body).
    fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let body = self.body.as_mut().expect("called with a body");
        match ready!(Pin::new(body).poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => Poll::Ready(Ok(())),
                Ok(data) => Poll::Ready(self.queue(data)),
                Err(frame) => {
                    if let (Framing::Chunked, Ok(trailers)) = (self.framing, frame.into_trailers())
                    {
                        self.finish(Some(&trailers))?;
                    }
                    // Elsewhere trailers cannot be sent: dropped.
                    Poll::Ready(Ok(()))
                }
            },
            Some(Err(e)) => {
                self.body = None;
                Poll::Ready(Err(Error::Body(e.into())))
            }
            None => Poll::Ready(self.finish(None)),
        }
    }

    fn queue(&mut self, data: Bytes) -> Result<(), Error> {
        self.taken += data.len() as u64;
        match self.framing {
            Framing::Empty => {
                return Err(Error::Body("a body on a message that declares none".into()))
            }
            Framing::Length(n) if self.taken > n => {
                return Err(Error::Body(
                    format!("the body is longer than its Content-Length ({n})").into(),
                ))
            }
            Framing::Chunked => {
                self.size = SizeLine::new(data.len());
                self.size_at = 0;
                self.tail = Bytes::from_static(b"\r\n");
            }
            Framing::Length(_) | Framing::Close => {}
        }
        self.data = data;
        Ok(())
    }

    /// The body ended (with `trailers`, for a chunked one).
    fn finish(&mut self, trailers: Option<&HeaderMap>) -> Result<(), Error> {
        self.body = None;
        match self.framing {
            Framing::Length(n) if self.taken != n => Err(Error::Body(
                format!("the body ended after {} of its {n} bytes", self.taken).into(),
            )),
            Framing::Chunked => {
                let mut last = b"0\r\n".to_vec();
                if let Some(trailers) = trailers {
                    write_lines(&mut last, trailers.iter());
                }
                last.extend_from_slice(b"\r\n");
                self.tail = Bytes::from(last);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn poll_write_pending<W: AsyncWrite + Unpin>(
        &self,
        cx: &mut Context<'_>,
        io: &mut W,
    ) -> Poll<Result<usize, Error>> {
        let parts: [&[u8]; 4] = [
            &self.head[self.head_at..],
            &self.size.as_bytes()[self.size_at..],
            &self.data,
            &self.tail,
        ];
        // Only the parts with bytes (a length-framed body has no size line and no tail), in one
        // write: how to write them is the connection's to decide (a socket copies a few small
        // ones into one `send`, `http1::socket`; a TLS session seals them into one record).
        let mut slices = [IoSlice::new(&[]); 4];
        let mut count = 0;
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            slices[count] = IoSlice::new(part);
            count += 1;
        }
        let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?;
        if n == 0 {
            return Poll::Ready(Err(Error::Io(io::ErrorKind::WriteZero.into())));
        }
        Poll::Ready(Ok(n))
    }

    /// Marks `n` more bytes written, in order: head, size line, data, tail.
    fn advance(&mut self, mut n: usize) {
        let head = (self.head.len() - self.head_at).min(n);
        self.head_at += head;
        n -= head;
        if self.head_at == self.head.len() && !self.head.is_empty() {
            // Written: the head's memory is not needed while the body streams; the next head
            // written on this thread takes it.
            super::maps::recycle_head(std::mem::take(&mut self.head));
            self.head_at = 0;
        }
        let size = (self.size.len as usize - self.size_at).min(n);
        self.size_at += size;
        n -= size;
        let data = self.data.len().min(n);
        bytes::Buf::advance(&mut self.data, data);
        n -= data;
        let tail = self.tail.len().min(n);
        bytes::Buf::advance(&mut self.tail, tail);
    }
}

#[cfg(test)]
mod tests;
