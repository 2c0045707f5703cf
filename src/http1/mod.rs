//! HTTP/1.1 messages on the wire, of our own: parsing heads, framing bodies both ways.
//!
//! hyper's HTTP/1 connections keep an 8 KiB read buffer and an 8 KiB write buffer for as long
//! as they live, hand every request to a connection task over a channel, and copy nothing they
//! can slice from those buffers, so a header kept for later pins the whole buffer. For a proxy
//! whose connections mostly sit idle on an open event stream, that is most of its memory:
//! 41 KiB per stream, against HAProxy's 7. Here a connection holds a buffer only while bytes are
//! arriving: heads are parsed with `httparse` and copied out (a kept header pins nothing), body
//! bytes go on as `Bytes` sliced from a buffer allocated for the read that brought them, and an
//! idle plain connection holds no buffer at all (a TLS one keeps rustls's record buffers).
//!
//! - [`copied`]: small copies out of a read buffer, in one allocation each.
//! - [`decode`]: a body's framing (`Content-Length`, chunked, until close) undone.
//! - [`encode`]: heads written out, and a body sent with its framing ([`encode::BodyWriter`]).
//! - [`head`]: heads parsed, and the framing of the body that follows decided.
//! - [`fields`]: a head's fields copied into a header map, and the framing ones read.
//! - [`maps`]: header maps and head buffers used again, per thread, instead of made and freed
//!   per head.
//! - [`names`]: a field's name as a `HeaderName`, the common ones found without a parse.
//! - [`read`]: reading into a buffer allocated only once the socket is readable.
//! - [`socket`]: every TCP socket holdfast writes to, a few small parts sent as one plain write.
//! - [`conn`]: a client connection shared by its driver and the request body being read.

pub mod conn;
pub mod copied;
pub mod decode;
pub mod encode;
pub mod fields;
pub mod head;
pub mod maps;
pub mod names;
pub mod read;
pub mod socket;
#[cfg(test)]
mod trickle;

use std::io;

use crate::errors::BoxError;

/// Why an HTTP/1 exchange failed. The I/O and body variants keep their cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The peer sent something that is not a valid HTTP/1 message.
    #[error("invalid HTTP/1 message: {0}")]
    Parse(&'static str),
    /// The head did not end within the size limit.
    #[error("the message head is larger than {0} bytes")]
    HeadTooLarge(usize),
    /// The head had more header lines than allowed.
    #[error("the message head has more than {0} header lines")]
    TooManyHeaders(usize),
    /// The connection ended (the peer's FIN) before the message did.
    #[error("the connection closed before the message was complete")]
    Incomplete,
    /// Reading or writing the connection failed.
    #[error("the connection failed")]
    Io(#[source] io::Error),
    /// The body being sent failed, or did not match its declared length.
    #[error("the body being sent failed")]
    Body(#[source] BoxError),
}

/// How a body's end is found: by the decoder of a body read, and by the writer of a body sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all (the head says so, or the message cannot have one).
    Empty,
    /// `Content-Length`: exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the connection closes: a response with neither of the above, or one
    /// sent to an HTTP/1.0 client as it comes.
    Close,
}

impl Error {
    /// The peer broke the protocol (not the connection): nothing about whether it read what was
    /// sent follows from it.
    pub fn is_parse(&self) -> bool {
        matches!(
            self,
            Error::Parse(_) | Error::HeadTooLarge(_) | Error::TooManyHeaders(_)
        )
    }

    /// The connection ended with the peer's FIN.
    pub fn is_eof(&self) -> bool {
        matches!(self, Error::Incomplete)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Most bytes of a chunk-size line (size and extensions) or of a trailer section.
pub const MAX_LINE: usize = 4096;
