//! Request ids: one per client request, in the configured header (`request_id.header`,
//! `x-request-id` by default).
//!
//! The client's id is passed on when it sent a usable one; otherwise holdfast makes one and
//! writes it into the request before anything else reads the request's headers. So every
//! request holdfast sends for it carries the same id: its first attempt, a replay after a hold,
//! a resend after an ambiguous failure, the `initialize` of a session re-established for it, a
//! hand-off to a peer (all are built from the same header map). The id also names every line
//! logged while the request is served ([`crate::telemetry::with_request_id`]), its access-log
//! lines, and holdfast's own answers to it ([`crate::respond::stamp`]).

use http::{HeaderMap, HeaderName, HeaderValue};

/// Longest id passed on: a UUID (36), a W3C trace id (32), an AWS `X-Amzn-Trace-Id` (~40) and
/// a nested id or two fit; anything longer is more likely a mistake or an attempt to fill logs.
pub const MAX_LEN: usize = 128;

/// Where request ids travel, and how they are made.
#[derive(Debug, Clone)]
pub struct RequestIds {
    header: HeaderName,
}

impl RequestIds {
    /// Request ids in `header`.
    pub fn new(header: HeaderName) -> Self {
        RequestIds { header }
    }

    /// The header they travel in.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The id of the request whose headers are `headers`: the client's when it sent one usable
    /// id, else a new one, written into `headers` in place of whatever the client sent (so the
    /// server sees the id holdfast logs).
    pub fn take(&self, headers: &mut HeaderMap) -> HeaderValue {
        let mut sent = headers.get_all(&self.header).iter();
        if let (Some(id), None) = (sent.next(), sent.next()) {
            if is_usable(id) {
                return id.clone();
            }
        }
        let id = generate();
        // `insert` replaces every value the client sent under the name.
        headers.insert(self.header.clone(), id.clone());
        id
    }
}

/// Whether a client's id is passed on as it is: 1 to [`MAX_LEN`] visible ASCII characters (no
/// space, no control character), so that it can be logged, quoted and sent on unescaped.
pub fn is_usable(id: &HeaderValue) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// A new id: 128 random bits as 32 lower-case hex digits (a W3C trace id's shape). Unique, not
/// secret: a request id identifies, it authorizes nothing, so the per-thread generator
/// (`fastrand`, seeded from the OS) is enough and costs no system call.
pub fn generate() -> HeaderValue {
    let bits = fastrand::u128(..);
    let mut hex = [0u8; 32];
    for (i, digit) in hex.iter_mut().enumerate() {
        let nibble = ((bits >> (124 - 4 * i)) & 0xf) as u8;
        *digit = b"0123456789abcdef"[usize::from(nibble)];
    }
    HeaderValue::from_bytes(&hex).expect("hex digits are a header value")
}

/// The id as text, for log fields: every id holdfast keeps is visible ASCII.
pub fn as_str(id: &HeaderValue) -> &str {
    id.to_str().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> RequestIds {
        RequestIds::new(HeaderName::from_static("x-request-id"))
    }

    #[test]
    fn a_usable_client_id_is_passed_on_untouched() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-123_XYZ.{}/="));
        assert_eq!(ids().take(&mut h), "abc-123_XYZ.{}/=");
        assert_eq!(h.get_all("x-request-id").iter().count(), 1);
        assert_eq!(h["x-request-id"], "abc-123_XYZ.{}/=");
    }

    #[test]
    fn without_an_id_one_is_made_and_written_in() {
        let mut h = HeaderMap::new();
        let id = ids().take(&mut h);
        assert_eq!(h["x-request-id"], id);
        let text = as_str(&id);
        assert_eq!(text.len(), 32);
        assert!(text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn an_unusable_id_is_replaced_not_passed_on() {
        let long = "a".repeat(MAX_LEN + 1);
        let bad: [&[u8]; 5] = [
            b"",
            b"has space",
            b"tab\there",
            b"caf\xc3\xa9",
            long.as_bytes(),
        ];
        for value in bad {
            let mut h = HeaderMap::new();
            h.insert("x-request-id", HeaderValue::from_bytes(value).unwrap());
            let id = ids().take(&mut h);
            assert_ne!(id.as_bytes(), value);
            assert_eq!(as_str(&id).len(), 32, "{value:?}");
            assert_eq!(h["x-request-id"], id);
        }
        // Two ids: which one would the server log? Neither: one of holdfast's.
        let mut h = HeaderMap::new();
        h.append("x-request-id", HeaderValue::from_static("one"));
        h.append("x-request-id", HeaderValue::from_static("two"));
        let id = ids().take(&mut h);
        assert_eq!(h.get_all("x-request-id").iter().collect::<Vec<_>>(), [&id]);
        assert_ne!(id, "one");
    }

    #[test]
    fn the_longest_usable_id_is_kept_whole() {
        let longest = "b".repeat(MAX_LEN);
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_str(&longest).unwrap());
        assert_eq!(ids().take(&mut h), longest.as_str());
    }

    #[test]
    fn made_ids_differ() {
        let made: std::collections::HashSet<_> = (0..1000).map(|_| generate()).collect();
        assert_eq!(made.len(), 1000);
    }
}
