//! A message body's framing undone: what arrives is cut into data frames (slices of the buffer
//! they arrived in, not copies), trailers, and the end.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{Error, Framing, MAX_LINE};

/// What [`Decoder::decode`] found in the buffer.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The chunked body's trailer fields (its end follows).
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More bytes are needed.
    NeedMore,
}

/// Decodes one body.
#[derive(Debug)]
pub struct Decoder {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes left of a `Content-Length` body.
    Length(u64),
    /// A chunk-size line next.
    Size,
    /// This many bytes left of the current chunk.
    Chunk(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// The trailer section (after the last chunk) next.
    Trailers,
    /// Until the connection closes.
    Close,
    /// Complete.
    Done,
}

impl Decoder {
    /// A decoder for a body framed by `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Size,
            Framing::Close => State::Close,
        };
        Decoder { state }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The bytes left of a body whose whole length is known (0 once complete).
    pub fn length_rest(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Bytes known to be still to come (a `Content-Length` body's rest, a chunk's), to size
    /// the next read.
    pub fn known_rest(&self) -> Option<u64> {
        match self.state {
            State::Length(n) | State::Chunk(n) => Some(n),
            _ => None,
        }
    }

    /// Takes the next frame out of `buf` (consuming what it used).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Error> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Length(rest) | State::Chunk(rest) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = usize::try_from(rest).unwrap_or(usize::MAX).min(buf.len());
                    let left = rest - n as u64;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::Chunk(left),
                    };
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::Close => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                State::Size => {
                    let Some(line) = line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = chunk_size(&buf[..line])?;
                    buf.advance(line + 2);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Chunk(size)
                    };
                }
                State::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(Error::Parse("a chunk's data does not end with CRLF"));
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => return self.trailers(buf),
            }
        }
    }

    /// The connection ended: the end of a close-delimited body, a truncated one otherwise.
    pub fn eof(&mut self) -> Result<Decoded, Error> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(Decoded::End)
            }
            _ => Err(Error::Incomplete),
        }
    }

    /// The trailer section: field lines, each ended by CRLF, then an empty line. Where it ends
    /// is found line by line, by the same rule as a chunk-size line's end (a bare CR or LF is an
    /// error), so that nothing after it can be read as part of it, or it as a next request.
    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Decoded, Error> {
        let Some(end) = section_end(buf)? else {
            return Ok(Decoded::NeedMore);
        };
        if end == 2 {
            buf.advance(2);
            self.state = State::Done;
            return Ok(Decoded::End);
        }
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let parsed = match httparse::parse_headers(&buf[..end], &mut fields) {
            // httparse must read exactly the section found: no obs-fold, nothing left over.
            Ok(httparse::Status::Complete((used, fields))) if used == end => {
                let mut map = HeaderMap::with_capacity(fields.len());
                for f in fields {
                    let name = HeaderName::from_bytes(f.name.as_bytes())
                        .map_err(|_| Error::Parse("an invalid trailer field name"))?;
                    let value = HeaderValue::from_bytes(f.value)
                        .map_err(|_| Error::Parse("an invalid trailer field value"))?;
                    map.append(name, value);
                }
                map
            }
            _ => return Err(Error::Parse("an invalid trailer section")),
        };
        buf.advance(end);
        self.state = State::Done;
        Ok(Decoded::Trailers(parsed))
    }
}

/// Where the trailer section at the start of `buf` ends (after its empty line's CRLF), if it is
/// complete: lines ended by CRLF, with no other CR or LF in them, within [`MAX_LINE`] in all.
fn section_end(buf: &[u8]) -> Result<Option<usize>, Error> {
    let mut start = 0;
    loop {
        let Some(len) = line(&buf[start..])? else {
            if buf.len() >= MAX_LINE {
                return Err(Error::Parse("the trailer section is too large"));
            }
            return Ok(None);
        };
        start += len + 2;
        if start > MAX_LINE {
            return Err(Error::Parse("the trailer section is too large"));
        }
        if len == 0 {
            return Ok(Some(start));
        }
    }
}

/// The length of the first line in `buf` (before its CRLF), if complete. A line ends at CRLF
/// only: a bare LF, or a CR anywhere else in it, is an error (as hyper's decoder has it), so no
/// reader that ends lines differently can see another line structure in the same bytes.
fn line(buf: &[u8]) -> Result<Option<usize>, Error> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    match memchr::memchr2(b'\r', b'\n', window) {
        Some(cr) if window[cr] == b'\r' => match window.get(cr + 1) {
            Some(b'\n') => Ok(Some(cr)),
            Some(_) => Err(Error::Parse("a bare CR in a chunked body's line")),
            None if buf.len() > cr + 1 => Err(Error::Parse("a chunked body's line is too long")),
            None => Ok(None),
        },
        Some(_) => Err(Error::Parse("a chunked body's line does not end with CRLF")),
        None if buf.len() >= MAX_LINE => Err(Error::Parse("a chunked body's line is too long")),
        None => Ok(None),
    }
}

/// A chunk-size line's size: hex digits, then optional spaces or tabs and `;extensions`
/// (ignored). Nothing else: no other whitespace (a form feed), no junk.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    // As many digits as hyper takes (leading zeros included); a size past `u64` is refused
    // below, never wrapped.
    if digits == 0 {
        return Err(Error::Parse("an invalid chunk size"));
    }
    let blanks = line[digits..]
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let rest = &line[digits + blanks..];
    if !(rest.is_empty() || rest[0] == b';') {
        return Err(Error::Parse("an invalid chunk size"));
    }
    line[..digits]
        .iter()
        .try_fold(0u64, |n, &b| {
            let digit = u64::from((b as char).to_digit(16).expect("a hex digit"));
            n.checked_mul(16)?.checked_add(digit)
        })
        .ok_or(Error::Parse("an invalid chunk size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes; the data, the trailers' count, whether it ended.
    fn feed(framing: Framing, input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), Error> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), 0);
        let mut chunks = input.chunks(step.max(1));
        loop {
            match d.decode(&mut buf)? {
                Decoded::Data(b) => {
                    assert!(!b.is_empty(), "no empty data frames");
                    data.extend_from_slice(&b)
                }
                Decoded::Trailers(t) => trailers += t.len(),
                Decoded::End => return Ok((data, trailers, true)),
                Decoded::NeedMore => match chunks.next() {
                    Some(c) => buf.extend_from_slice(c),
                    None => return Ok((data, trailers, false)),
                },
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_pieces() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for step in 1..body.len() {
            let (data, trailers, ended) = feed(Framing::Chunked, body, step).unwrap();
            assert_eq!(data, b"hello, world", "step {step}");
            assert_eq!(trailers, 0);
            assert!(ended);
        }
    }

    #[test]
    fn trailers_come_after_the_last_chunk() {
        let body = b"3\r\nabc\r\n0\r\nx-checksum: 1\r\nx-other: 2\r\n\r\n";
        for step in 1..body.len() {
            let (data, trailers, ended) = feed(Framing::Chunked, body, step).unwrap();
            assert_eq!((data.as_slice(), trailers, ended), (&b"abc"[..], 2, true));
        }
    }

    #[test]
    fn a_length_body_ends_at_its_length_and_leaves_the_rest() {
        let mut d = Decoder::new(Framing::Length(5));
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from("hello"))
        );
        assert!(d.is_done());
        assert_eq!(d.decode(&mut buf).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"HTTP/1.1");
    }

    #[test]
    fn a_close_delimited_body_ends_only_at_eof() {
        let (data, _, ended) = feed(Framing::Close, b"everything", 3).unwrap();
        assert_eq!((data.as_slice(), ended), (&b"everything"[..], false));
        let mut d = Decoder::new(Framing::Close);
        assert_eq!(d.eof().unwrap(), Decoded::End);
        let mut d = Decoder::new(Framing::Length(3));
        assert!(d.eof().unwrap_err().is_eof());
        let mut d = Decoder::new(Framing::Chunked);
        assert!(d.eof().unwrap_err().is_eof());
    }

    #[test]
    fn malformed_chunking_is_an_error() {
        for bad in [
            &b"\r\nabc"[..],                  // no size
            b"g\r\n",                         // not hex
            b"12345678123456781\r\n",         // past u64
            b"3 x\r\n",                       // junk after the size
            b"3\nabc",                        // bare LF
            b"3\r\nabcX\r\n",                 // data not ended by CRLF
            b"0\r\nbad trailer\r\n\r\n",      // trailer without a colon
            b"5\rx\r\nhello",                 // a lone CR in the size
            b"5;a\rb\r\nhello",               // a lone CR in an extension
            b"5\x0c\r\nhello",                // a form feed as whitespace
            b"0\r\n\nGET / HTTP/1.1\r\n\r\n", // the section ended by a bare LF
            b"0\r\nX: y\n\n",                 // a trailer line ended by a bare LF
            b"0\r\nX: y\r\r\n\r\n",           // a lone CR in a trailer line
            b"0\r\nX: a\r\n b\r\n\r\n",       // obs-fold
        ] {
            assert!(
                feed(Framing::Chunked, bad, 64).unwrap_err().is_parse(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'a'; MAX_LINE + 1];
        assert!(feed(Framing::Chunked, &long, 64).unwrap_err().is_parse());
    }

    #[test]
    fn the_trailer_section_ends_at_its_empty_line_and_leaves_the_rest() {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"0\r\nX-A: 1\r\nX-B: 2\r\n\r\nGET / HTTP/1.1\r\n"[..]);
        let Decoded::Trailers(trailers) = d.decode(&mut buf).unwrap() else {
            panic!("trailers")
        };
        assert_eq!(trailers.len(), 2);
        assert_eq!(d.decode(&mut buf).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
        // An incomplete section waits for more, whatever the cut.
        let whole = b"0\r\nX-A: 1\r\n\r\n";
        for cut in 1..whole.len() {
            let mut d = Decoder::new(Framing::Chunked);
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(
                d.decode(&mut buf).unwrap(),
                Decoded::NeedMore,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn chunk_sizes_parse_with_whitespace_and_extensions() {
        assert_eq!(chunk_size(b"1F").unwrap(), 31);
        assert_eq!(chunk_size(b"a ; name=value").unwrap(), 10);
        assert_eq!(chunk_size(b"a\t;x").unwrap(), 10);
        assert!(chunk_size(b"a\x0b").is_err());
        assert_eq!(chunk_size(b"ffffffffffffffff").unwrap(), u64::MAX);
        // Leading zeros are no overflow (hyper reads them so); one digit more is.
        assert_eq!(chunk_size(b"00000000000000000005").unwrap(), 5);
        assert!(chunk_size(b"10000000000000000").is_err());
        assert!(chunk_size(b"-1").is_err());
        assert!(chunk_size(b"").is_err());
    }
}
