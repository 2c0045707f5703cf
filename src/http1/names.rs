//! A field's name as a `HeaderName`, the common ones found without a parse.
//!
//! `HeaderName::from_bytes` lowercases the name through a table into a scratch buffer, then
//! matches it against every standard name, and allocates a copy of any other name (freed with
//! the head): about 150 instructions a name, ten names a proxied request (its head and its
//! answer's). The names that MCP clients, servers and the routers in front of them actually
//! send are few; here each is found by its length and at most a few case-insensitive
//! comparisons, and handed out as a copy of a constant (no allocation, whatever its case on the
//! wire). Any other name goes to `http` as before, so what a head may contain does not change:
//! a name equal to a listed one but for ASCII case is that same name to `http` too.

use http::header::{
    ACCEPT, ACCEPT_ENCODING, ACCEPT_LANGUAGE, AUTHORIZATION, CACHE_CONTROL, CONNECTION,
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, DATE, ETAG, EXPECT, FORWARDED, HOST,
    LAST_MODIFIED, LOCATION, ORIGIN, RETRY_AFTER, SERVER, SET_COOKIE, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE, USER_AGENT, VARY, VIA, WWW_AUTHENTICATE,
};
use http::HeaderName;

use super::Error;

/// The names `http` has no constant for, made here once: the rest of holdfast names them from
/// here (as `HeaderName`s they are compared, not parsed and hashed as text).
macro_rules! named {
    ($($(#[$doc:meta])* $id:ident = $text:literal;)*) => {
        $($(#[$doc])* pub const $id: HeaderName = HeaderName::from_static($text);)*
    };
}

named! {
    /// The session header of the Streamable HTTP transport.
    MCP_SESSION_ID = "mcp-session-id";
    /// The protocol version header clients send after initialization (2025-06-18 on).
    MCP_PROTOCOL_VERSION = "mcp-protocol-version";
    /// The 2026-07-28 header naming a request's JSON-RPC method.
    MCP_METHOD = "mcp-method";
    /// The 2026-07-28 header naming the tool (prompt, resource) a request is about.
    MCP_NAME = "mcp-name";
    /// The SSE resumption header of a GET stream.
    LAST_EVENT_ID = "last-event-id";
    /// Hop-by-hop (RFC 9110 §7.6.1).
    KEEP_ALIVE = "keep-alive";
    /// Hop-by-hop, non-standard, still sent by old clients.
    PROXY_CONNECTION = "proxy-connection";
    /// The client's address as the proxies in front saw it.
    X_FORWARDED_FOR = "x-forwarded-for";
    /// The scheme the client used.
    X_FORWARDED_PROTO = "x-forwarded-proto";
    /// The Host the client used.
    X_FORWARDED_HOST = "x-forwarded-host";
    /// The port the client used (routers send it; holdfast passes it).
    X_FORWARDED_PORT = "x-forwarded-port";
    /// The router that forwarded (Traefik sends it; holdfast passes it).
    X_FORWARDED_SERVER = "x-forwarded-server";
    /// The client's address (nginx's convention; holdfast passes it).
    X_REAL_IP = "x-real-ip";
    /// A request id routers add (holdfast passes it).
    X_REQUEST_ID = "x-request-id";
    /// nginx's buffering switch an SSE server may send (holdfast passes it).
    X_ACCEL_BUFFERING = "x-accel-buffering";
    /// W3C trace context (holdfast passes it).
    TRACEPARENT = "traceparent";
}

/// A listed name: its text as [`Words`], and the bits of those words a name on the wire may
/// have otherwise (each letter's case bit).
struct Listed {
    name: HeaderName,
    text: Words,
    case: Words,
}

const fn listed(text: &str, name: HeaderName) -> Listed {
    let bytes = text.as_bytes();
    Listed {
        name,
        text: Words::read(bytes, false),
        case: Words::read(bytes, true),
    }
}

/// A name of 2 to 24 bytes as three little-endian words of 2, 4 or 8 bytes (the widest its
/// length allows), the last ending at its last byte: overlapping loads, so every length is read
/// in three, with no loop and no padding.
#[derive(Clone, Copy)]
struct Words([u64; 3]);

impl Words {
    /// `bytes` read so, or with `case` only each lowercase letter's case bit.
    const fn read(bytes: &[u8], case: bool) -> Words {
        let n = bytes.len();
        let width = if n >= 8 {
            8
        } else if n >= 4 {
            4
        } else {
            2
        };
        let middle = if n >= 2 * width { width } else { n - width };
        let starts = [0, middle, n - width];
        let mut words = [0u64; 3];
        let mut w = 0;
        while w < 3 {
            let mut i = 0;
            while i < width {
                let b = bytes[starts[w] + i];
                let b = if !case {
                    b
                } else if b.is_ascii_lowercase() {
                    0x20
                } else {
                    0
                };
                words[w] |= (b as u64) << (8 * i);
                i += 1;
            }
            w += 1;
        }
        Words(words)
    }

    /// The same at run time (`bytes` 2 to 24 long), three unaligned loads.
    fn of(bytes: &[u8]) -> Words {
        debug_assert!(
            (2..=24).contains(&bytes.len()),
            "only listed lengths are read"
        );
        fn at<const N: usize>(bytes: &[u8], start: usize) -> [u8; N] {
            bytes[start..start + N].try_into().expect("in bounds")
        }
        let n = bytes.len();
        match n {
            8.. => {
                let middle = if n >= 16 { 8 } else { n - 8 };
                Words([0, middle, n - 8].map(|s| u64::from_le_bytes(at(bytes, s))))
            }
            4.. => Words([0, n - 4, n - 4].map(|s| u64::from(u32::from_le_bytes(at(bytes, s))))),
            _ => Words([0, n - 2, n - 2].map(|s| u64::from(u16::from_le_bytes(at(bytes, s))))),
        }
    }

    /// Whether these words are `listed`'s text but for the case of its letters: exact for any
    /// bytes (a byte differing from a letter only in its case bit is that letter's other case).
    fn matches(self, listed: &Listed) -> bool {
        let differ = |w: usize| (self.0[w] ^ listed.text.0[w]) & !listed.case.0[w];
        differ(0) | differ(1) | differ(2) == 0
    }
}

/// The listed names of each length, the likelier first. A `static` of each, so that finding one
/// copies a name, never builds and drops a table.
static LEN_2: [Listed; 1] = [listed("te", TE)];
static LEN_3: [Listed; 1] = [listed("via", VIA)];
static LEN_4: [Listed; 4] = [
    listed("host", HOST),
    listed("date", DATE),
    listed("vary", VARY),
    listed("etag", ETAG),
];
static LEN_6: [Listed; 5] = [
    listed("accept", ACCEPT),
    listed("server", SERVER),
    listed("origin", ORIGIN),
    listed("cookie", COOKIE),
    listed("expect", EXPECT),
];
static LEN_7: [Listed; 2] = [listed("upgrade", UPGRADE), listed("trailer", TRAILER)];
static LEN_8: [Listed; 2] = [listed("mcp-name", MCP_NAME), listed("location", LOCATION)];
static LEN_9: [Listed; 2] = [
    listed("x-real-ip", X_REAL_IP),
    listed("forwarded", FORWARDED),
];
static LEN_10: [Listed; 5] = [
    listed("connection", CONNECTION),
    listed("user-agent", USER_AGENT),
    listed("mcp-method", MCP_METHOD),
    listed("keep-alive", KEEP_ALIVE),
    listed("set-cookie", SET_COOKIE),
];
static LEN_11: [Listed; 2] = [
    listed("traceparent", TRACEPARENT),
    listed("retry-after", RETRY_AFTER),
];
static LEN_12: [Listed; 2] = [
    listed("content-type", CONTENT_TYPE),
    listed("x-request-id", X_REQUEST_ID),
];
static LEN_13: [Listed; 4] = [
    listed("authorization", AUTHORIZATION),
    listed("cache-control", CACHE_CONTROL),
    listed("last-event-id", LAST_EVENT_ID),
    listed("last-modified", LAST_MODIFIED),
];
static LEN_14: [Listed; 2] = [
    listed("content-length", CONTENT_LENGTH),
    listed("mcp-session-id", MCP_SESSION_ID),
];
static LEN_15: [Listed; 3] = [
    listed("accept-encoding", ACCEPT_ENCODING),
    listed("x-forwarded-for", X_FORWARDED_FOR),
    listed("accept-language", ACCEPT_LANGUAGE),
];
static LEN_16: [Listed; 5] = [
    listed("x-forwarded-host", X_FORWARDED_HOST),
    listed("x-forwarded-port", X_FORWARDED_PORT),
    listed("content-encoding", CONTENT_ENCODING),
    listed("proxy-connection", PROXY_CONNECTION),
    listed("www-authenticate", WWW_AUTHENTICATE),
];
static LEN_17: [Listed; 3] = [
    listed("transfer-encoding", TRANSFER_ENCODING),
    listed("x-forwarded-proto", X_FORWARDED_PROTO),
    listed("x-accel-buffering", X_ACCEL_BUFFERING),
];
static LEN_18: [Listed; 1] = [listed("x-forwarded-server", X_FORWARDED_SERVER)];
static LEN_20: [Listed; 1] = [listed("mcp-protocol-version", MCP_PROTOCOL_VERSION)];

/// The listed names by their length: an array, not a `match` on the length, which compiles to
/// a jump table whose one indirect jump a branch predictor misses whenever two names in a row
/// differ in length (as most do).
static BY_LENGTH: [&[Listed]; 21] = [
    &[],
    &[],
    &LEN_2,
    &LEN_3,
    &LEN_4,
    &[],
    &LEN_6,
    &LEN_7,
    &LEN_8,
    &LEN_9,
    &LEN_10,
    &LEN_11,
    &LEN_12,
    &LEN_13,
    &LEN_14,
    &LEN_15,
    &LEN_16,
    &LEN_17,
    &LEN_18,
    &[],
    &LEN_20,
];

/// The listed names as long as `len` bytes.
fn of_length(len: usize) -> &'static [Listed] {
    BY_LENGTH.get(len).copied().unwrap_or(&[])
}

/// A field's name as it arrived (any case) as a `HeaderName`: a listed one copied, any other
/// parsed by `http`.
pub(super) fn header_name(raw: &[u8]) -> Result<HeaderName, Error> {
    match find(raw) {
        Some(listed) => Ok(listed.name.clone()),
        None => HeaderName::from_bytes(raw).map_err(|_| Error::Parse("an invalid header name")),
    }
}

/// The listed name `raw` is, in any case.
fn find(raw: &[u8]) -> Option<&'static Listed> {
    let listed = of_length(raw.len());
    if listed.is_empty() {
        return None;
    }
    let words = Words::of(raw);
    listed.iter().find(|l| words.matches(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed() -> impl Iterator<Item = &'static HeaderName> {
        (0..=64).flat_map(|len| of_length(len).iter().map(|l| &l.name))
    }

    #[test]
    fn each_listed_name_sits_under_its_length_and_is_http_s_own() {
        for len in 0..=64 {
            for listed in of_length(len) {
                let name = &listed.name;
                assert_eq!(name.as_str().len(), len, "{name} listed under {len}");
                let text = Words::of(name.as_str().as_bytes());
                assert_eq!(text.0, listed.text.0, "{name}: its text is its name's");
                assert_eq!(
                    HeaderName::from_bytes(name.as_str().as_bytes()).unwrap(),
                    *name,
                    "{name} is what http makes of its text"
                );
            }
        }
        assert!(listed().count() > 40);
    }

    #[test]
    fn any_case_of_a_listed_name_is_found_and_is_the_name_http_would_make() {
        for name in listed() {
            let text = name.as_str();
            let upper = text.to_ascii_uppercase();
            let title: String = text
                .split('-')
                .map(|w| w[..1].to_ascii_uppercase() + &w[1..])
                .collect::<Vec<_>>()
                .join("-");
            for wire in [text.to_owned(), upper, title] {
                let found = find(wire.as_bytes()).map(|l| &l.name);
                assert_eq!(found, Some(name), "{wire} is found without a parse");
                assert_eq!(
                    header_name(wire.as_bytes()).unwrap(),
                    HeaderName::from_bytes(wire.as_bytes()).unwrap(),
                    "{wire}"
                );
            }
        }
    }

    /// Every bit of every byte of every listed name flipped in turn: found only where the flip
    /// is a letter's case, and otherwise whatever `http` makes of it (another name, or none).
    #[test]
    fn a_name_one_bit_away_from_a_listed_one_is_not_taken_for_it() {
        for name in listed() {
            let text = name.as_str().as_bytes();
            for at in 0..text.len() {
                for bit in 0..8 {
                    let mut wire = text.to_vec();
                    wire[at] ^= 1 << bit;
                    let case_flip = bit == 5 && text[at].is_ascii_lowercase();
                    let found = find(&wire).map(|l| &l.name);
                    if case_flip {
                        assert_eq!(found, Some(name), "{wire:?}");
                    } else {
                        assert_ne!(found, Some(name), "{wire:?} is not {name}");
                    }
                    assert_eq!(
                        header_name(&wire).ok(),
                        HeaderName::from_bytes(&wire).ok(),
                        "{wire:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn other_names_and_near_misses_are_parsed_as_http_parses_them() {
        for wire in [
            "X-Custom",
            "Content-Lengtx",
            "Content_Length",
            "Hosts",
            "Mcp-Session-Ie",
            "a",
            "x-forwarded-for2",
            "Content-Lengti",
            "mcp-protocol-versioN",
            "mcp-protocol-versio_",
            "Te",
            "tE",
            "tf",
        ] {
            assert_eq!(
                header_name(wire.as_bytes()).unwrap(),
                HeaderName::from_bytes(wire.as_bytes()).unwrap(),
                "{wire}"
            );
        }
        // A CR differs from `-` only in the bit that is a letter's case: not a letter, no match.
        for bad in [
            "",
            "Hos:",
            "Con tent-Type",
            "Dat\u{0}",
            "Läs",
            "Content\rLength",
            "X\rForwarded-For",
            "x-forwarded\rproto",
            "mcp-protoco\u{0}-version",
        ] {
            assert!(header_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
