//! A head's fields: copied out of the read buffer into a header map, and read for what decides
//! a body's framing and the connection's fate (`Content-Length`, `Transfer-Encoding`,
//! `Connection`, `Expect`), in both directions.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Version};

use super::Error;

/// The parsed fields as a header map: names as [`super::names`] makes them, values as slices of
/// `copy`, the copy of the head `buf` starts with; `room` for more. What framing and the
/// connection's fate depend on is noted on the way, so that a head without those fields costs
/// no lookup for them afterwards.
pub(super) fn copy_fields(
    copy: &Bytes,
    buf: &[u8],
    fields: &[httparse::Header<'_>],
    room: usize,
) -> Result<(HeaderMap, Noted), Error> {
    let mut headers = super::maps::take(fields.len() + room);
    let mut noted = Noted::default();
    for field in fields {
        let name = super::names::header_name(field.name.as_bytes())?;
        noted.field(&name, field.value);
        let value = HeaderValue::from_maybe_shared(slice_of(copy, buf, field.value))
            .map_err(|_| Error::Parse("an invalid header value"))?;
        headers.append(name, value);
    }
    Ok((headers, noted))
}

/// The fields of a head that decide its framing and its connection's fate, seen as it is
/// copied. Comparing a name with a standard one is comparing two small integers.
#[derive(Default)]
pub(super) struct Noted {
    /// What the `Content-Length` lines say.
    pub length: Length,
    /// A `Transfer-Encoding` line is there.
    pub transfer_encoding: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// The `Connection` options that decide keep-alive.
    pub connection: ConnectionTokens,
}

impl Noted {
    fn field(&mut self, name: &HeaderName, value: &[u8]) {
        if *name == CONTENT_LENGTH {
            self.length.add_line(value);
        } else if *name == TRANSFER_ENCODING {
            self.transfer_encoding = true;
        } else if *name == CONNECTION {
            self.connection.add(value);
        } else if *name == EXPECT {
            self.expect_continue |= value.eq_ignore_ascii_case(b"100-continue");
        }
    }
}

/// The `close` and `keep-alive` options among a head's `Connection` lines.
#[derive(Default, Clone, Copy)]
pub(super) struct ConnectionTokens {
    close: bool,
    keep_alive: bool,
}

impl ConnectionTokens {
    fn add(&mut self, value: &[u8]) {
        for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            self.close |= token.eq_ignore_ascii_case(b"close");
            self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }

    /// HTTP/1.0 closes unless asked not to; HTTP/1.1 stays open unless asked to close.
    pub fn keeps_alive(self, version: Version) -> bool {
        if version == Version::HTTP_10 {
            self.keep_alive
        } else {
            !self.close
        }
    }
}

/// The part of `copy` (a copy of the start of `buf`) that `part` (a slice of `buf`) is.
pub(super) fn slice_of(copy: &Bytes, buf: &[u8], part: &[u8]) -> Bytes {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    copy.slice(start..start + part.len())
}

/// Whether the last transfer coding is `chunked`.
pub fn is_chunked(headers: &HeaderMap) -> bool {
    headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|v| v.as_bytes().rsplit(|b| *b == b',').next())
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether the transfer codings, over every `Transfer-Encoding` line, are one `chunked` and
/// nothing else: the only framing a response's body can be passed on with. Another coding
/// (`gzip, chunked`) would be undone by nobody: `Transfer-Encoding` is hop-by-hop, so the client
/// would get coded bytes that no header declares.
pub fn is_only_chunked(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    matches!(
        (codings.next(), codings.next()),
        (Some(c), None) if c.eq_ignore_ascii_case(b"chunked")
    )
}

/// The one `Content-Length` value (repeated lines or a list of equal values become one line), or
/// an error for an invalid or disagreeing one.
pub fn content_length(headers: &mut HeaderMap) -> Result<Option<u64>, Error> {
    Length::of(headers).settle(headers)
}

/// What a head's `Content-Length` lines say, read a line at a time (as bytes: it runs on every
/// head in both directions) and judged only where the length decides the framing: with
/// `Transfer-Encoding` an invalid one is removed, not refused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// No line.
    #[default]
    Absent,
    /// One value; `plain` while it stands as one line holding one number.
    Value {
        /// The length.
        n: u64,
        /// Neither repeated nor a list nor zero-padded: sent as it came.
        plain: bool,
    },
    /// Why the lines are no length.
    Invalid(&'static str),
}

impl Length {
    /// What the `Content-Length` lines of `headers` say (one lookup).
    pub fn of(headers: &HeaderMap) -> Length {
        let mut length = Length::Absent;
        for value in headers.get_all(CONTENT_LENGTH) {
            length.add_line(value.as_bytes());
        }
        length
    }

    /// Adds one line: a number, or a list of equal numbers.
    fn add_line(&mut self, line: &[u8]) {
        let (mut found, mut plain) = match *self {
            Length::Absent => (None, true),
            Length::Value { n, .. } => (Some(n), false),
            Length::Invalid(_) => return,
        };
        for (i, part) in line.split(|b| *b == b',').enumerate() {
            let part = part.trim_ascii();
            // Padded with zeros, the line is written again as its number (`settle`): a server
            // behind holdfast that caps the digits must read what holdfast read.
            plain &= i == 0 && !(part.len() > 1 && part[0] == b'0');
            let Some(n) = decimal(part) else {
                *self = Length::Invalid("an invalid Content-Length");
                return;
            };
            if found.is_some_and(|f| f != n) {
                *self = Length::Invalid("disagreeing Content-Length values");
                return;
            }
            found = Some(n);
        }
        if let Some(n) = found {
            *self = Length::Value { n, plain };
        }
    }

    /// Whether any line was there.
    pub fn is_present(self) -> bool {
        self != Length::Absent
    }

    /// The length and whether it stood plain, or why there is none.
    pub fn value(self) -> Result<Option<(u64, bool)>, Error> {
        match self {
            Length::Absent => Ok(None),
            Length::Value { n, plain } => Ok(Some((n, plain))),
            Length::Invalid(why) => Err(Error::Parse(why)),
        }
    }

    /// The length of the head `headers` whose lines these are, a repeated, listed or zero-padded
    /// one written again there as one plain number.
    pub fn settle(self, headers: &mut HeaderMap) -> Result<Option<u64>, Error> {
        let found = self.value()?;
        if let Some((n, false)) = found {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        Ok(found.map(|(n, _)| n))
    }
}

/// A length: decimal digits only, as many as hyper takes (leading zeros included), refused once
/// the value would not fit a `u64` (never wrapped).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = b.is_ascii_digit().then(|| u64::from(b - b'0'))?;
        n.checked_mul(10)?.checked_add(digit)
    })
}

/// Whether a message of `version` whose `Connection` lines are `lines` leaves its connection
/// open.
pub fn connection_keeps_alive<'a>(
    version: Version,
    lines: impl IntoIterator<Item = &'a HeaderValue>,
) -> bool {
    let mut tokens = ConnectionTokens::default();
    for value in lines {
        tokens.add(value.as_bytes());
    }
    tokens.keeps_alive(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_options_are_read_from_the_map_as_bytes() {
        let mut headers = HeaderMap::new();
        headers.append(CONNECTION, HeaderValue::from_static("Keep-Alive "));
        assert!(connection_keeps_alive(
            Version::HTTP_10,
            headers.get_all(CONNECTION)
        ));
        assert!(connection_keeps_alive(
            Version::HTTP_11,
            headers.get_all(CONNECTION)
        ));
        assert_eq!(content_length(&mut headers).unwrap(), None, "no line");
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("7"));
        assert_eq!(Length::of(&headers).value().unwrap(), Some((7, true)));
        headers.append(CONTENT_LENGTH, HeaderValue::from_static(" 7 ,7"));
        assert_eq!(Length::of(&headers).value().unwrap(), Some((7, false)));
        assert_eq!(content_length(&mut headers).unwrap(), Some(7));
        assert_eq!(
            headers.get_all(CONTENT_LENGTH).iter().count(),
            1,
            "one line now"
        );
        // As many digits as hyper takes: leading zeros are no overflow; the line is written
        // again as its number.
        let mut padded = HeaderMap::new();
        padded.insert(
            CONTENT_LENGTH,
            HeaderValue::from_static("000000000000000000000005"),
        );
        assert_eq!(content_length(&mut padded).unwrap(), Some(5));
        assert_eq!(padded.get(CONTENT_LENGTH).unwrap(), "5");
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "+7",
            "0x7",
            "7 7",
            "18446744073709551616",
            "99999999999999999999",
        ] {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_LENGTH, HeaderValue::from_str(bad).unwrap());
            assert!(content_length(&mut h).is_err(), "{bad:?}");
        }
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade,CLOSE"));
        assert!(!connection_keeps_alive(
            Version::HTTP_11,
            headers.get_all(CONNECTION)
        ));
    }
}
