//! Heads read off the wire: parsed by `httparse`, copied into `http` types (so nothing kept
//! later pins the buffer they arrived in), and the body's framing decided from them.

use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};

use super::fields::{copy_fields, is_chunked, is_only_chunked, slice_of, Noted};
use super::Error;
use super::Framing;

/// hyper's default and HAProxy's: the header lines a head may have unless configured.
const DEFAULT_MAX_HEADERS: usize = 100;

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status, version and headers (the reason phrase is not kept).
    pub parts: http::response::Parts,
    /// How its body is framed.
    pub framing: Framing,
    /// Whether the connection may carry another request after this exchange.
    pub keep_alive: bool,
}

/// Longest request target accepted (hyper's limit): longer is a 414.
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// A parsed request head.
#[derive(Debug)]
pub struct RequestHead {
    /// Method, target, version and headers.
    pub parts: http::request::Parts,
    /// How its body is framed (`Empty`, `Length` or `Chunked`).
    pub framing: Framing,
    /// Whether the client keeps the connection open after this exchange.
    pub keep_alive: bool,
    /// Whether the client waits for `100 Continue` before it sends the body.
    pub expect_continue: bool,
}

/// Why a request head is refused: the status it is answered with, and the reason in words (for
/// the debug log, and the differential oracle's table of deliberate strictness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 414 or 431.
    pub status: StatusCode,
    /// Why.
    pub why: &'static str,
}

impl Refusal {
    fn new(status: StatusCode, why: &'static str) -> Self {
        Refusal { status, why }
    }

    fn bad(why: &'static str) -> Self {
        Refusal::new(StatusCode::BAD_REQUEST, why)
    }
}

/// httparse's refusal in words.
fn malformed(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "an invalid header name",
        httparse::Error::HeaderValue => "an invalid header value",
        httparse::Error::NewLine => "an invalid line ending",
        httparse::Error::Status => "an invalid status",
        httparse::Error::Token => "an invalid token in the request line",
        httparse::Error::TooManyHeaders => "too many header lines",
        httparse::Error::Version => "an invalid HTTP version",
    }
}

/// Parses a request head at the start of `buf`: its length and the head, `None` when more
/// bytes are needed, or why to refuse it (400, 414, 431), as hyper did. A `Transfer-Encoding`
/// whose last coding is not `chunked`, or on HTTP/1.0, is a 400, and so is one beside a
/// `Content-Length` (a client that sends both is confused or smuggling). The stricter checks
/// (one Host, a single `chunked`) are the proxy's (`src/proxy/request.rs`), which explains its
/// 400s.
///
/// Long on purpose: one flat pass over the head in the order hyper checks it, each refusal next
/// to the rule it enforces; the differential test against hyper reads against it line by line.
pub fn parse_request(
    buf: &[u8],
    max_headers: usize,
) -> Result<Option<(usize, RequestHead)>, Refusal> {
    let mut stack = [httparse::EMPTY_HEADER; DEFAULT_MAX_HEADERS];
    let mut heap;
    let fields: &mut [httparse::Header<'_>] = if max_headers == DEFAULT_MAX_HEADERS {
        &mut stack
    } else {
        heap = vec![httparse::EMPTY_HEADER; max_headers];
        &mut heap
    };
    let mut req = httparse::Request::new(fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header lines",
            ))
        }
        Err(e) => return Err(Refusal::bad(malformed(e))),
    };
    let path = req.path.ok_or(Refusal::bad("no request target"))?;
    if path.len() > MAX_URI_LEN {
        return Err(Refusal::new(
            StatusCode::URI_TOO_LONG,
            "a request target too long",
        ));
    }
    // One copy of the whole head; the target and every header value are slices of it, so a
    // kept header pins neither the read buffer nor an allocation of its own.
    let copy = super::copied::copy(&buf[..len]);
    let uri = Uri::from_maybe_shared(slice_of(&copy, buf, path.as_bytes()))
        .map_err(|_| Refusal::bad("an invalid request target"))?;
    let method = req
        .method
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
        .ok_or(Refusal::bad("an invalid method"))?;
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    // Room for what the proxy adds (X-Forwarded-For, -Proto, -Host, Host): no regrowth.
    let (mut headers, noted) = copy_fields(&copy, buf, req.headers, 4)
        .map_err(|_| Refusal::bad("an invalid header field"))?;
    let keep_alive = noted.connection.keeps_alive(version);
    let framing = if noted.transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(Refusal::bad("Transfer-Encoding on HTTP/1.0"));
        }
        if !is_chunked(&headers) {
            return Err(Refusal::bad("a Transfer-Encoding not ending in chunked"));
        }
        // Both: one party reads the length, another the chunks (RFC 9112 §6.3 lets a server
        // refuse it; hyper reads the chunks and drops a valid length, and refuses an invalid
        // one). Nobody legitimate sends both.
        if noted.length.is_present() {
            return Err(Refusal::bad("both Content-Length and Transfer-Encoding"));
        }
        Framing::Chunked
    } else {
        // A list (`5, 5`) is refused as hyper refuses it; equal repeated lines are one length.
        if matches!(
            noted.length,
            super::fields::Length::Value { plain: false, .. }
        ) && headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes().contains(&b','))
        {
            return Err(Refusal::bad("a Content-Length list"));
        }
        match noted
            .length
            .settle(&mut headers)
            .map_err(|_| Refusal::bad("an invalid Content-Length"))?
        {
            Some(0) | None => Framing::Empty,
            Some(n) => Framing::Length(n),
        }
    };
    let expect_continue = version == Version::HTTP_11 && noted.expect_continue;
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((
        len,
        RequestHead {
            parts,
            framing,
            keep_alive,
            expect_continue,
        },
    )))
}

/// Parses a response head at the start of `buf`: its length and the head, or `None` when more
/// bytes are needed. `method` is the request's (a HEAD's answer has no body).
pub fn parse_response(
    buf: &[u8],
    max_headers: usize,
    method: &Method,
) -> Result<Option<(usize, ResponseHead)>, Error> {
    let mut stack = [httparse::EMPTY_HEADER; DEFAULT_MAX_HEADERS];
    let mut heap;
    let fields: &mut [httparse::Header<'_>] = if max_headers == DEFAULT_MAX_HEADERS {
        &mut stack
    } else {
        heap = vec![httparse::EMPTY_HEADER; max_headers];
        &mut heap
    };
    let mut resp = httparse::Response::new(fields);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::TooManyHeaders(max_headers)),
        Err(_) => return Err(Error::Parse("an invalid response head")),
    };
    let version = match resp.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(Error::Parse("an invalid status code"))?;
    let copy = super::copied::copy(&buf[..len]);
    // Room for what an answer may gain on its way (Date, X-Accel-Buffering).
    let (mut headers, noted) = copy_fields(&copy, buf, resp.headers, 2)?;
    let framing = response_framing(method, status, &mut headers, &noted)?;
    // Never again after a 101 (the connection speaks another protocol now), nor after an
    // HTTP/1.0 answer with Transfer-Encoding (RFC 9112 §6.1: its framing is faulty, whatever
    // it says; close after it).
    let keep_alive = framing != Framing::Close
        && status != StatusCode::SWITCHING_PROTOCOLS
        && !(version == Version::HTTP_10 && noted.transfer_encoding)
        && noted.connection.keeps_alive(version);
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((
        len,
        ResponseHead {
            parts,
            framing,
            keep_alive,
        },
    )))
}

/// How a response's body is framed (RFC 9112 §6.3), fixing the head where it contradicts
/// itself: with `Transfer-Encoding`, any `Content-Length` is wrong and removed; equal repeated
/// `Content-Length` values become one; different ones are an error.
fn response_framing(
    method: &Method,
    status: StatusCode,
    headers: &mut HeaderMap,
    noted: &Noted,
) -> Result<Framing, Error> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if noted.transfer_encoding {
        if noted.length.is_present() {
            headers.remove(CONTENT_LENGTH);
        }
        // Any coding but one `chunked` (`gzip` alone, `gzip, chunked`) could not be passed on:
        // Transfer-Encoding is hop-by-hop, so once the chunks are undone the client would get
        // coded bytes nobody declared (and `gzip` alone ends only at the connection's close).
        // hyper's client reads both; holdfast refuses them (a 502), as HAProxy does.
        if !is_only_chunked(headers) {
            return Err(Error::Parse(
                "a response's transfer coding is not one chunked alone",
            ));
        }
        return Ok(Framing::Chunked);
    }
    match noted.length.settle(headers)? {
        Some(n) => Ok(Framing::Length(n)),
        None => Ok(Framing::Close),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str, method: Method) -> Result<Option<(usize, ResponseHead)>, Error> {
        parse_response(head.as_bytes(), DEFAULT_MAX_HEADERS, &method)
    }

    fn framing(head: &str) -> Framing {
        parse(head, Method::GET).unwrap().unwrap().1.framing
    }

    #[test]
    fn a_head_is_complete_only_at_its_blank_line() {
        assert!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n", Method::GET)
                .unwrap()
                .is_none()
        );
        let (len, head) = parse(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(len, 38);
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.framing, Framing::Length(2));
        assert!(head.keep_alive);
    }

    #[test]
    fn framing_follows_rfc_9112() {
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: , Chunked \r\n\r\n"),
            Framing::Chunked
        );
        for codings in [
            "gzip",
            "gzip, chunked",
            "chunked, chunked",
            "gzip\r\ntransfer-encoding: chunked",
            "",
        ] {
            let head = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {codings}\r\n\r\n");
            assert!(
                parse(&head, Method::GET).unwrap_err().is_parse(),
                "{codings:?}: a coding that is not chunked cannot be passed on"
            );
        }
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), Framing::Close);
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(
            framing("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"),
            Framing::Empty
        );
        let (_, head) = parse("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(head.framing, Framing::Empty);
        assert_eq!(
            head.parts.headers[CONTENT_LENGTH], "5",
            "a HEAD's length passes as it came"
        );
    }

    #[test]
    fn transfer_encoding_wins_and_the_stale_length_goes() {
        let (_, head) = parse(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert!(!head.parts.headers.contains_key(CONTENT_LENGTH));
    }

    #[test]
    fn content_lengths_agree_or_fail() {
        let (_, head) = parse(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.framing, Framing::Length(2));
        assert_eq!(head.parts.headers.get_all(CONTENT_LENGTH).iter().count(), 1);
        for bad in ["2, 3", "-1", "", "1e3", "99999999999999999999"] {
            let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert!(parse(&text, Method::GET).unwrap_err().is_parse(), "{bad:?}");
        }
    }

    #[test]
    fn a_101_and_an_http_1_0_answer_with_transfer_encoding_never_keep_the_connection() {
        let keeps = |head: &str| parse(head, Method::GET).unwrap().unwrap().1.keep_alive;
        assert!(!keeps(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n"
        ));
        assert!(!keeps(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        // The controls.
        assert!(keeps(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        assert!(keeps(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        assert!(
            !parse(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                Method::GET
            )
            .unwrap()
            .unwrap()
            .1
            .keep_alive
        );
        assert!(
            !parse("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET)
                .unwrap()
                .unwrap()
                .1
                .keep_alive
        );
        assert!(
            parse(
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
                Method::GET
            )
            .unwrap()
            .unwrap()
            .1
            .keep_alive
        );
        assert!(
            !parse("HTTP/1.1 200 OK\r\n\r\n", Method::GET)
                .unwrap()
                .unwrap()
                .1
                .keep_alive,
            "close-delimited"
        );
    }

    #[test]
    fn the_fields_that_decide_framing_are_seen_in_any_case_and_list_form() {
        let (_, head) = parse(
            "HTTP/1.1 200 OK\r\nContent-Length: 3 , 3\r\nConnection: Upgrade, Close\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.framing, Framing::Length(3));
        assert_eq!(
            head.parts.headers[CONTENT_LENGTH], "3",
            "the list became one value"
        );
        assert!(!head.keep_alive);
        let (_, head) = parse(
            "HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\nContent-Length: 9\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert!(!head.parts.headers.contains_key(CONTENT_LENGTH));
        let (_, head) = request(
            "POST / HTTP/1.1\r\nHost: a\r\nEXPECT: 100-continue\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(head.expect_continue);
        assert_eq!(head.framing, Framing::Empty);
    }

    #[test]
    fn mcp_names_in_any_case_are_the_same_names_and_their_lookalikes_others() {
        let (_, head) = request(
            "POST / HTTP/1.1\r\nHost: a\r\nMcp-Session-Id: s1\r\nMCP-PROTOCOL-VERSION: v\r\n\
             Last-Event-ID: 7\r\nMcp-Session-Ix: no\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        let h = &head.parts.headers;
        assert_eq!(h["mcp-session-id"], "s1");
        assert_eq!(h["mcp-protocol-version"], "v");
        assert_eq!(h["last-event-id"], "7");
        assert_eq!(h["mcp-session-ix"], "no");
        assert_eq!(h[CONTENT_LENGTH], "0", "a standard name of the same length");
        assert_eq!(h.len(), 6);
    }

    fn request(head: &str) -> Result<Option<(usize, RequestHead)>, StatusCode> {
        parse_request(head.as_bytes(), DEFAULT_MAX_HEADERS).map_err(|r| r.status)
    }

    #[test]
    fn requests_parse_with_their_framing() {
        let (len, head) =
            request("POST /mcp?x=1 HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhello")
                .unwrap()
                .unwrap();
        assert_eq!(len, 54);
        assert_eq!(head.parts.method, Method::POST);
        assert_eq!(head.parts.uri, "/mcp?x=1");
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.keep_alive && !head.expect_continue);
        let (_, head) = request("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            (head.parts.version, head.framing, head.keep_alive),
            (Version::HTTP_10, Framing::Empty, false)
        );
        let (_, head) = request(
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\nexpect: 100-Continue\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.expect_continue);
        assert!(request("GET / HTTP/1.1\r\nhost: a\r\n").unwrap().is_none());
    }

    #[test]
    fn ambiguous_request_framing_is_refused_or_made_plain() {
        for bad in [
            // Both: refused, a valid length or not.
            "POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 3, 3\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
            "GET /a b HTTP/1.1\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
        ] {
            assert_eq!(
                request(bad).unwrap_err(),
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
        let many: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
        assert_eq!(
            request(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_LEN));
        assert_eq!(request(&long).unwrap_err(), StatusCode::URI_TOO_LONG);
    }

    #[test]
    fn too_many_headers_and_garbage_fail() {
        let many: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(matches!(
            parse(&text, Method::GET),
            Err(Error::TooManyHeaders(100))
        ));
        assert!(parse_response(text.as_bytes(), 200, &Method::GET)
            .unwrap()
            .is_some());
        assert!(parse("SSH-2.0-OpenSSH\r\n\r\n", Method::GET)
            .unwrap_err()
            .is_parse());
    }
}
