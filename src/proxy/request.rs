//! The client's request made ready for the upstream ([`Destination::prepare`]): its head rewritten
//! (hop-by-hop headers out, X-Forwarded-* and Host in, the upstream's URI), after refusing what
//! holdfast will not forward: a request whose framing or target two parties could read
//! differently (RFC 9112 §3.2 and §6.1, RFC 9113 §8.3.1). Each gets a 400, as nginx and HAProxy
//! answer them, instead of reaching an upstream that may read it another way.

use std::net::SocketAddr;

use http::header::{HeaderMap, HeaderValue, HOST, TRANSFER_ENCODING};
use http::uri::PathAndQuery;
use http::{Uri, Version};

use super::{headers, Destination, Target};
use crate::config::HostHeader;

/// The client's host: `Host` on HTTP/1.x, `:authority` on HTTP/2, checked. `None` only for an
/// HTTP/1.0 request without one.
pub(super) fn client_host(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Option<HeaderValue>, &'static str> {
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    if let Some(host) = host {
        if !is_host(host.as_bytes()) {
            return Err("the Host header is not a host[:port]");
        }
    }
    if version == Version::HTTP_2 {
        if let Some(authority) = uri.authority() {
            // :authority is the request's host; a Host that names another is malformed.
            if host.is_some_and(|h| {
                !h.as_bytes()
                    .eq_ignore_ascii_case(authority.as_str().as_bytes())
            }) {
                return Err("the Host header and :authority disagree");
            }
            return HeaderValue::from_str(authority.as_str())
                .map(Some)
                .map_err(|_| "the request's :authority is not a host[:port]");
        }
    }
    // An absolute-form target names its host, which RFC 9112 §3.2.2 says wins over Host: a
    // Host that names another is refused rather than chosen between (the upstream, or a router
    // before it, may choose the other).
    if let (Some(authority), Some(host)) = (uri.authority(), host) {
        if !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
        {
            return Err("the Host header and the request target's host disagree");
        }
    }
    match host {
        Some(host) => Ok(Some(host.clone())),
        None if version == Version::HTTP_11 => Err("an HTTP/1.1 request needs a Host header"),
        None => Ok(uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())),
    }
}

/// Whether `value` is a `host[:port]` (RFC 9110 §7.2): a name or IPv4 address of URI host
/// characters, or an IP literal in brackets, then at most a `:` and a port of digits that fits
/// 16 bits. No user information, path, space or percent sign outside the brackets; an empty
/// host is refused (RFC 9110 §4.2.1). Read byte by byte, without building an `Authority`: it
/// runs on every request.
fn is_host(value: &[u8]) -> bool {
    let (host, port) = if let Some(literal) = value.strip_prefix(b"[") {
        let Some(end) = literal.iter().position(|&b| b == b']') else {
            return false;
        };
        let address = &literal[..end];
        let ok = |b: u8| b.is_ascii_alphanumeric() || b":.%-_~".contains(&b);
        if address.is_empty() || !address.iter().all(|&b| ok(b)) {
            return false;
        }
        (address, &literal[end + 1..])
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        let name = &value[..end];
        let ok = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b);
        if !name.iter().all(|&b| ok(b)) {
            return false;
        }
        (name, &value[end..])
    };
    !host.is_empty()
        && match port {
            [] => true,
            [b':', digits @ ..] => {
                (1..=5).contains(&digits.len())
                    && digits
                        .iter()
                        .try_fold(0u32, |n, b| {
                            b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
                        })
                        .is_some_and(|n| n <= u32::from(u16::MAX))
            }
            _ => false,
        }
}

/// A request body's framing must be plain: no `Transfer-Encoding` at all, or a single final
/// `chunked`. Anything else (`chunked, chunked`, `gzip, chunked`, two headers) is read
/// differently by different servers, the stuff of request smuggling.
pub(super) fn check_transfer_encoding(headers: &HeaderMap) -> Result<(), &'static str> {
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| c.trim_ascii())
        .filter(|c| !c.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err("a Transfer-Encoding other than a single chunked"),
    }
}

/// A path with `.` or `..` segments (also percent-encoded) is refused: joined under the
/// upstream URL's path prefix it could leave it (`/api` + `/../admin`), and the path that
/// decides expected routes would not be the path the upstream serves.
pub(super) fn check_path(path: &str) -> Result<(), &'static str> {
    if path.split('/').any(is_dot_segment) {
        return Err("a path with . or .. segments");
    }
    Ok(())
}

/// The checks of a request head before anything of it is forwarded: its target, path, body
/// framing and host. The client's host when they pass.
fn checked(parts: &http::request::Parts) -> Result<Option<HeaderValue>, &'static str> {
    check_target(&parts.method, &parts.uri)?;
    check_path(parts.uri.path())?;
    check_transfer_encoding(&parts.headers)?;
    client_host(parts.version, &parts.uri, &parts.headers)
}

/// Why holdfast refuses (400) a request head before forwarding anything of it, if it does: what
/// [`Destination::prepare`] checks first. Public for the differential oracle (`tests/it/oracle/`),
/// which reads requests as holdfast does.
pub fn refusal(parts: &http::request::Parts) -> Option<&'static str> {
    checked(parts).err()
}

/// A target holdfast, an origin server's gateway and no forward proxy, can forward: not
/// `CONNECT` (a tunnel), and not authority-form (`example.com:443`), which only `CONNECT` uses;
/// hyper's server handed both to the service, which forwarded them as `/`.
fn check_target(method: &http::Method, uri: &Uri) -> Result<(), &'static str> {
    if method == http::Method::CONNECT {
        return Err("CONNECT is not proxied");
    }
    if uri.scheme().is_none() && uri.authority().is_some() {
        return Err("an authority-form request target is for CONNECT only");
    }
    if uri
        .path_and_query()
        .is_some_and(|pq| !pq.as_str().starts_with('/'))
    {
        // `OPTIONS *`: nothing to forward to one upstream.
        return Err("the request target must be an absolute path");
    }
    Ok(())
}

/// Whether `segment` is `.` or `..`, each dot possibly percent-encoded (`%2e`, `%2E`), read
/// without decoding (every request passes here).
fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', more @ ..] => more,
            [b'%', b'2', e, more @ ..] if *e == b'e' || *e == b'E' => more,
            _ => return false,
        };
        dots += 1;
        if dots > 2 {
            return false;
        }
    }
    dots > 0
}

impl Destination {
    /// Rewrites the client's request head for the upstream.
    pub(super) fn prepare(
        &self,
        mut parts: http::request::Parts,
        peer: SocketAddr,
    ) -> Result<Target, &'static str> {
        // What two parties could read differently is refused before anything else. The
        // client's host (`Host` on HTTP/1.1, `:authority` on HTTP/2) is kept as a header value:
        // in "preserve" mode it goes back as it came.
        let client_host = checked(&parts)?;
        let uri = self.upstream_uri(&parts.uri)?;
        let headers = &mut parts.headers;
        // A peer that is not a proxy in front could claim any client, Host or scheme: what it
        // says is replaced, not appended to (src/config/forwarded.rs).
        let untrusted = !self.trusted_proxies.trusts(peer.ip());
        headers::strip_hop_by_hop_and_forwarded(headers, untrusted);
        headers::add_forwarded(headers, peer.ip(), self.client_proto, client_host.clone());
        match (self.host_header, client_host.clone()) {
            (HostHeader::Preserve, Some(host)) => headers.insert(HOST, host),
            _ => headers.insert(HOST, self.host.clone()),
        };
        Ok(Target {
            client_host,
            client: parts.uri,
            method: parts.method,
            uri,
            headers: parts.headers,
        })
    }

    /// The upstream URI for a client request URI: the upstream's authority, its path prefix, then
    /// the client's path and query.
    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, &'static str> {
        let pq = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let prefix = &self.url.path_prefix;
        let pq = if prefix.is_empty() {
            // The usual case: the client's path and query as they are, not copied.
            pq
        } else {
            PathAndQuery::try_from(format!("{prefix}{pq}"))
                .map_err(|_| "the request target cannot be forwarded")?
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.url.authority.clone());
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).map_err(|_| "the request target cannot be forwarded")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn host(
        version: Version,
        uri: &str,
        pairs: &[(&'static str, &'static str)],
    ) -> Result<Option<HeaderValue>, &'static str> {
        client_host(version, &uri.parse().unwrap(), &headers(pairs))
    }

    #[test]
    fn dot_segments_plain_or_encoded() {
        for dot in [".", "..", "%2e", "%2E", ".%2e", "%2E%2e", "%2e."] {
            assert!(is_dot_segment(dot), "{dot}");
        }
        for other in [
            "",
            "...",
            "%2e%2e%2e",
            "a.",
            ".a",
            "%2f",
            "%2",
            "%2x",
            "mcp",
            "%25",
        ] {
            assert!(!is_dot_segment(other), "{other}");
        }
    }

    #[test]
    fn hosts() {
        let one = host(Version::HTTP_11, "/mcp", &[("host", "mcp.example:8080")]);
        assert_eq!(one.unwrap().unwrap(), "mcp.example:8080");
        for bad in [
            "evil example",
            "evil.example/../x",
            "user@evil.example",
            "a:b",
            "",
            ":80",
            "a:",
            "a:65536",
            "a:+80",
            "a:1:2",
            "a%41.example",
            "[::1",
            "[]:80",
            "[::1]x",
            "[::1]:",
            "[::1]/x",
        ] {
            assert!(
                host(Version::HTTP_11, "/mcp", &[("host", bad)]).is_err(),
                "{bad:?}"
            );
        }
        for good in [
            "a",
            "10.0.0.1:65535",
            "[::1]",
            "[fe80::1%25eth0]:8080",
            "a-b_c~d.example:1",
        ] {
            let got = host(Version::HTTP_11, "/mcp", &[("host", good)]);
            assert_eq!(got.unwrap().unwrap(), good);
        }
        assert!(host(Version::HTTP_11, "/mcp", &[("host", "a"), ("host", "a")]).is_err());
        assert!(
            host(Version::HTTP_11, "/mcp", &[]).is_err(),
            "1.1 needs a Host"
        );
        assert_eq!(host(Version::HTTP_10, "/mcp", &[]).unwrap(), None);
        assert_eq!(
            host(
                Version::HTTP_11,
                "[::1]:80/".trim_end_matches('/'),
                &[("host", "[::1]:80")]
            )
            .ok()
            .flatten()
            .unwrap(),
            "[::1]:80"
        );
    }

    #[test]
    fn http2_authority_wins_and_must_agree() {
        let uri = "http://mcp.example/mcp";
        assert_eq!(
            host(Version::HTTP_2, uri, &[]).unwrap().unwrap(),
            "mcp.example"
        );
        assert_eq!(
            host(Version::HTTP_2, uri, &[("host", "MCP.example")])
                .unwrap()
                .unwrap(),
            "mcp.example"
        );
        assert!(host(Version::HTTP_2, uri, &[("host", "other.example")]).is_err());
    }

    #[test]
    fn transfer_encodings() {
        assert!(check_transfer_encoding(&headers(&[])).is_ok());
        assert!(check_transfer_encoding(&headers(&[("transfer-encoding", "chunked")])).is_ok());
        assert!(check_transfer_encoding(&headers(&[("transfer-encoding", "Chunked ")])).is_ok());
        for bad in [
            &[("transfer-encoding", "chunked, chunked")][..],
            &[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ],
            &[("transfer-encoding", "gzip, chunked")],
            &[("transfer-encoding", "gzip")],
        ] {
            assert!(check_transfer_encoding(&headers(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn dot_segments() {
        for ok in ["/", "/mcp", "/mcp/x.json", "/a..b/", "/.well-known/oauth"] {
            assert!(check_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "/../admin",
            "/mcp/..",
            "/./mcp",
            "/mcp/%2e%2e/admin",
            "/%2E/x",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
    }
}
