//! Header rewriting between the client and the upstream.
//!
//! Hop-by-hop headers describe one connection and must not cross the proxy (RFC 9110 §7.6.1):
//! the fixed list below plus every name listed in `Connection`. Everything else passes untouched,
//! in particular the MCP headers (`Mcp-Session-Id`, `MCP-Protocol-Version`, `Mcp-Method`,
//! `Mcp-Name`, `Last-Event-ID`) and `Authorization` / `WWW-Authenticate` / `Retry-After`.

use std::net::IpAddr;

use crate::http1::names;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};

/// Header added to SSE responses so nginx in front does not buffer them.
pub const X_ACCEL_BUFFERING: &str = "x-accel-buffering";

/// Always hop-by-hop (RFC 9110 §7.6.1, plus the RFC 2616 §13.5.1 proxy-auth pair and the
/// non-standard `Proxy-Connection` that old clients still send). As `HeaderName`s, so finding
/// one is a comparison, not a parse and a hash; a `static`, not a `const`, so that it is not
/// built and dropped at every use.
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    names::KEEP_ALIVE,
    names::PROXY_CONNECTION,
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
];

static X_FORWARDED_FOR: HeaderName = names::X_FORWARDED_FOR;
static X_FORWARDED_PROTO: HeaderName = names::X_FORWARDED_PROTO;
static X_FORWARDED_HOST: HeaderName = names::X_FORWARDED_HOST;

/// Where `name` is in [`HOP_BY_HOP`]. A match on the name's text compiles to a switch on its
/// length and one comparison, where comparing against each entry in turn costs nine.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// What a client says of where it came from: replaced, not appended to, when it is not a
/// trusted proxy ([`strip_hop_by_hop_and_forwarded`]).
static FORWARDED: [&HeaderName; 4] = [
    &X_FORWARDED_FOR,
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &http::header::FORWARDED,
];

/// Where `name` is in [`FORWARDED`].
fn forwarded_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "x-forwarded-for" => 0,
        "x-forwarded-proto" => 1,
        "x-forwarded-host" => 2,
        "forwarded" => 3,
        _ => return None,
    })
}

/// Removes hop-by-hop headers, including those named in `Connection` (any case, any spacing,
/// across repeated `Connection` headers).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_and_forwarded(headers, false);
}

/// [`strip_hop_by_hop`], and with `forwarded` also `X-Forwarded-For`, `-Proto`, `-Host` and
/// `Forwarded` (from a peer that is not a trusted proxy: holdfast's own replace them), found in
/// the same pass over the names.
pub fn strip_hop_by_hop_and_forwarded(headers: &mut HeaderMap, forwarded: bool) {
    // One pass over the names notes which of the fixed lists are present: most requests carry
    // none, and most answers only `Connection`, so only those are looked up again to remove.
    let mut present = 0u16;
    let mut claimed = 0u8;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            present |= 1 << i;
        } else if let (true, Some(i)) = (forwarded, forwarded_index(name)) {
            claimed |= 1 << i;
        }
    }
    for (i, name) in FORWARDED.iter().enumerate() {
        if claimed & (1 << i) != 0 {
            headers.remove(*name);
        }
    }
    if present == 0 {
        return;
    }
    // Most answers carry `Connection: keep-alive` (or `close`): tokens that name no header
    // beyond the fixed list need no parse and no allocation.
    let mut listed: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(CONNECTION) {
        for token in value.as_bytes().split(|b| *b == b',') {
            let token = token.trim_ascii();
            let known = [&b"close"[..], b"keep-alive", b"upgrade", b"te"]
                .iter()
                .any(|k| token.eq_ignore_ascii_case(k));
            if token.is_empty() || known {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token) {
                listed.push(name);
            }
        }
    }
    for name in listed {
        headers.remove(name);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// Appends `value` to a comma-separated header, creating it when absent.
fn append_list(headers: &mut HeaderMap, name: &'static HeaderName, value: HeaderValue) {
    let mut entry = match headers.entry(name) {
        // The usual case: nothing to join, and the value goes in as it is (one lookup).
        http::header::Entry::Vacant(vacant) => {
            vacant.insert(value);
            return;
        }
        http::header::Entry::Occupied(occupied) => occupied,
    };
    // Every existing line is kept (a list may arrive split over several field lines), joined into
    // one: many readers of X-Forwarded-For look at the first line only.
    let mut joined: Vec<&[u8]> = entry
        .iter()
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|v| !v.is_empty())
        .collect();
    joined.push(value.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&joined.join(&b", "[..])) {
        entry.insert(v);
    }
}

/// Adds `X-Forwarded-For`, `-Proto` and `-Host` for the client at `peer`; `proto` is `http` or
/// `https`, `host` the client's Host (or HTTP/2 `:authority`).
pub fn add_forwarded(
    headers: &mut HeaderMap,
    peer: IpAddr,
    proto: &'static str,
    host: Option<HeaderValue>,
) {
    append_list(headers, &X_FORWARDED_FOR, ip_value(peer));
    append_list(headers, &X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    if let Some(host) = host {
        append_list(headers, &X_FORWARDED_HOST, host);
    }
}

/// `peer` as a header value. A connection's requests come from one address: the last one
/// formatted on this thread is kept, and its next request takes a copy (a reference count).
fn ip_value(peer: IpAddr) -> HeaderValue {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((ip, value)) = last.as_ref() {
            if *ip == peer {
                return value.clone();
            }
        }
        let value =
            HeaderValue::from_str(&peer.to_string()).expect("an IP address is a header value");
        *last = Some((peer, value.clone()));
        value
    })
}

/// Whether a response is an SSE stream (`Content-Type: text/event-stream`, any case, any
/// parameters).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_names_each_entry_of_the_list_and_nothing_else() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
        for other in [
            "host",
            "content-length",
            "connections",
            "t",
            "x-te",
            "upgrade-insecure-requests",
        ] {
            let name = HeaderName::from_static(other);
            assert_eq!(hop_by_hop_index(&name), None, "{other}");
        }
        for (i, name) in FORWARDED.iter().enumerate() {
            assert_eq!(forwarded_index(name), Some(i), "{name}");
        }
        for other in ["x-forwarded", "forwarded-for", "x-real-ip", "host"] {
            let name = HeaderName::from_static(other);
            assert_eq!(forwarded_index(&name), None, "{other}");
        }
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// (headers in, names that must survive, names that must go)
    type Case = (
        &'static [(&'static str, &'static str)],
        &'static [&'static str],
        &'static [&'static str],
    );

    #[test]
    fn hop_by_hop_table() {
        let cases: &[Case] = &[
            (
                &[
                    ("Connection", "keep-alive"),
                    ("Keep-Alive", "timeout=5"),
                    ("Mcp-Session-Id", "abc"),
                ],
                &["mcp-session-id"],
                &["connection", "keep-alive"],
            ),
            // Names listed in Connection, mixed case and odd spacing, over two fields.
            (
                &[
                    ("Connection", " X-Foo ,x-BAR"),
                    ("connection", "close"),
                    ("x-foo", "1"),
                    ("X-Bar", "2"),
                    ("x-baz", "3"),
                ],
                &["x-baz"],
                &["x-foo", "x-bar", "connection"],
            ),
            // Garbage in Connection is ignored, not fatal.
            (
                &[
                    ("Connection", ",,, bad name, ok"),
                    ("ok", "1"),
                    ("authorization", "Bearer t"),
                ],
                &["authorization"],
                &["ok"],
            ),
            (
                &[
                    ("TE", "trailers"),
                    ("Transfer-Encoding", "chunked"),
                    ("Upgrade", "h2c"),
                    ("Proxy-Authorization", "Basic x"),
                    ("Proxy-Connection", "keep-alive"),
                    ("Trailer", "x"),
                    ("MCP-Protocol-Version", "2025-06-18"),
                    ("Last-Event-ID", "42"),
                    ("Mcp-Method", "tools/call"),
                    ("Mcp-Name", "count"),
                    ("WWW-Authenticate", "Bearer"),
                    ("Retry-After", "5"),
                ],
                &[
                    "mcp-protocol-version",
                    "last-event-id",
                    "mcp-method",
                    "mcp-name",
                    "www-authenticate",
                    "retry-after",
                ],
                &[
                    "te",
                    "transfer-encoding",
                    "upgrade",
                    "proxy-authorization",
                    "proxy-connection",
                    "trailer",
                ],
            ),
        ];
        for (input, keep, gone) in cases {
            let mut h = map(input);
            strip_hop_by_hop(&mut h);
            for k in *keep {
                assert!(h.contains_key(*k), "{k} should survive {input:?}");
            }
            for k in *gone {
                assert!(!h.contains_key(*k), "{k} should be removed from {input:?}");
            }
        }
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = map(&[("X-Forwarded-For", "203.0.113.7")]);
        add_forwarded(
            &mut h,
            "10.1.2.3".parse().unwrap(),
            "http",
            Some(HeaderValue::from_static("example.com")),
        );
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 10.1.2.3");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
        // A list split over two field lines keeps both.
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.7"),
            ("X-Forwarded-For", "198.51.100.2"),
        ]);
        add_forwarded(&mut h, "10.1.2.3".parse().unwrap(), "http", None);
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 198.51.100.2, 10.1.2.3");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "::1".parse().unwrap(), "https", None);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert!(!h.contains_key("x-forwarded-host"));
    }
}
