//! The differential oracle's core: one byte stream read as holdfast's HTTP/1 server reads it
//! and as hyper's does, and the two readings compared; and one upstream answer read as
//! holdfast's upstream side reads it and as hyper's client does. Shared by the fixed-seed test
//! (`tests/it/oracle/mod.rs`) and the fuzz target (`fuzz/fuzz_targets/requests.rs`, which
//! includes this file), so it depends on nothing but holdfast, hyper and their types.
//!
//! holdfast's reading follows `src/server/h1.rs`'s loop with its parts: a head parsed by
//! `http1::head::parse_request` (within `limits.max_header_bytes`, 431 past it), refused by
//! `proxy::refusal` (what the proxy answers 400 before forwarding anything), its body decoded by
//! `http1::decode::Decoder`, the next request only if the head kept the connection and the body
//! ended well. Client trailers are read and dropped (holdfast never forwards them), so they are
//! not compared; header fields are compared by name, each name's values in order.

use std::convert::Infallible;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use holdfast::http1::decode::{Decoded, Decoder};
use holdfast::http1::head::parse_request;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// holdfast's defaults: `limits.max_header_bytes` and `limits.max_headers` (hyper's too).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
pub const MAX_HEADERS: usize = 100;

/// One request as a server handed it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub method: String,
    pub target: String,
    pub version: http::Version,
    /// Field lines in the map's order, without the framing ones (`Content-Length`,
    /// `Transfer-Encoding`): the body is compared instead.
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// How a reading ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every byte was read as complete requests (or the connection closed after one that
    /// asked for it).
    Clean,
    /// The bytes ended inside a message.
    Incomplete,
    /// The server refused, with why (holdfast's words; "hyper" for hyper's).
    Refused(String),
}

/// One server's reading of a byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub messages: Vec<Message>,
    pub end: End,
}

/// The fields by name, the values of one name in their order: the order of different names is
/// not compared (a map's removal moves its last entry, and it means nothing on the wire).
fn fields_of(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut fields: Vec<(String, Vec<u8>)> = headers
        .iter()
        .filter(|(name, _)| {
            *name != http::header::CONTENT_LENGTH && *name != http::header::TRANSFER_ENCODING
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    // Stable: the values of one name keep their order.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

/// Reads `pieces` (the stream, as it arrives) as holdfast's server does.
pub fn holdfast_reads(pieces: &[&[u8]]) -> Reading {
    let mut arriving = pieces.iter();
    let mut buf = BytesMut::new();
    let mut messages = Vec::new();
    let end = |messages, end| Reading { messages, end };
    loop {
        // The head.
        let head = loop {
            if !buf.is_empty() {
                let window = &buf[..buf.len().min(MAX_HEAD_BYTES)];
                match parse_request(window, MAX_HEADERS) {
                    Ok(Some((len, head))) => {
                        let _ = buf.split_to(len);
                        break head;
                    }
                    Ok(None) if buf.len() >= MAX_HEAD_BYTES => {
                        return end(messages, End::Refused("head: 431".into()))
                    }
                    Ok(None) => {}
                    Err(refusal) => {
                        return end(messages, End::Refused(format!("head: {}", refusal.why)))
                    }
                }
            }
            match arriving.next() {
                Some(piece) => buf.extend_from_slice(piece),
                // Empty lines before a request line are skipped (RFC 9112 §2.2): ending on
                // them ends on no request.
                None if buf.iter().all(|b| *b == b'\r' || *b == b'\n') => {
                    return end(messages, End::Clean)
                }
                None => return end(messages, End::Incomplete),
            }
        };
        if let Some(why) = holdfast::proxy::refusal(&head.parts) {
            return end(messages, End::Refused(format!("proxy: {why}")));
        }
        // The body. A request's ends with its framing, never at the connection's end.
        let body = match read_body(Decoder::new(head.framing), &mut buf, &mut arriving, false) {
            Ok(body) => body,
            Err(None) => return end(messages, End::Incomplete),
            Err(Some(e)) => return end(messages, End::Refused(format!("body: {e}"))),
        };
        let parts = &head.parts;
        messages.push(Message {
            method: parts.method.to_string(),
            target: parts.uri.to_string(),
            version: parts.version,
            fields: fields_of(&parts.headers),
            body,
        });
        if !head.keep_alive {
            return end(messages, End::Clean);
        }
    }
}

/// Decodes a body off `buf`, topped up from `arriving`; trailers are read and dropped.
/// `eof_ends`: the connection's end ends it (a response read to the close; the decoder says
/// whether that is its end or a truncation). `Err(None)`: the bytes ran out inside it.
fn read_body<'a>(
    mut decoder: Decoder,
    buf: &mut BytesMut,
    arriving: &mut impl Iterator<Item = &'a &'a [u8]>,
    eof_ends: bool,
) -> Result<Vec<u8>, Option<holdfast::http1::Error>> {
    let mut body = Vec::new();
    loop {
        match decoder.decode(buf).map_err(Some)? {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::Trailers(_) => {}
            Decoded::End => return Ok(body),
            Decoded::NeedMore => match arriving.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None if eof_ends => {
                    decoder.eof().map_err(Some)?;
                    return Ok(body);
                }
                None => return Err(None),
            },
        }
    }
}

/// Reads `pieces` as hyper's HTTP/1 server does (default settings, over an in-memory pipe,
/// each piece written on its own): the requests its service saw whole, bodies read to their
/// end.
pub async fn hyper_reads(pieces: &[&[u8]]) -> Reading {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let tx = tx.clone();
        async move {
            let (parts, body) = req.into_parts();
            let read = match body.collect().await {
                Ok(collected) => Ok(Message {
                    method: parts.method.to_string(),
                    target: parts.uri.to_string(),
                    version: parts.version,
                    fields: fields_of(&parts.headers),
                    body: collected.to_bytes().to_vec(),
                }),
                // The body did not end well: the connection's reading ends here.
                Err(e) if e.is_incomplete_message() => Err(End::Incomplete),
                Err(_) => Err(End::Refused("hyper: body".into())),
            };
            let _ = tx.send(read);
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    let conn = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(server), service),
    );
    // Drained as it comes, so hyper never waits to write an answer.
    let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let (mut from, mut to) = tokio::io::split(client);
        for piece in pieces {
            if to.write_all(&piece).await.is_err() {
                break;
            }
            // Let hyper read this piece before the next arrives.
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        let _ = to.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), from.read_to_end(&mut out)).await;
    });
    let served = tokio::time::timeout(Duration::from_secs(5), conn).await;
    let _ = reader.await;
    let mut messages = Vec::new();
    let mut body_end = None;
    while let Ok(read) = rx.try_recv() {
        match read {
            Ok(message) if body_end.is_none() => messages.push(message),
            Ok(_) => {}
            Err(end) => body_end = body_end.or(Some(end)),
        }
    }
    if let Some(end) = body_end {
        return Reading { messages, end };
    }
    let end = match served {
        Ok(Ok(Ok(()))) => End::Clean,
        Ok(Ok(Err(e))) if e.is_incomplete_message() => End::Incomplete,
        Ok(Ok(Err(_))) => End::Refused("hyper".into()),
        Ok(Err(_)) | Err(_) => End::Refused("hyper: no end".into()),
    };
    Reading { messages, end }
}

/// Where holdfast refuses what hyper accepts, on purpose: the one table of holdfast's extra
/// strictness (README, "What holdfast accepts on HTTP/1"). A reason is a prefix of holdfast's
/// words for the refusal.
pub const STRICTER: &[&str] = &[
    // Ambiguous or plainly wrong targets and hosts (src/proxy/request.rs).
    "proxy: CONNECT is not proxied",
    "proxy: an authority-form request target",
    "proxy: the Host header and the request target's host disagree",
    "proxy: more than one Host header",
    "proxy: the Host header is not a host[:port]",
    "proxy: an HTTP/1.1 request needs a Host header",
    "proxy: a Transfer-Encoding other than a single chunked",
    "proxy: the request target must be an absolute path",
    "proxy: a path with . or .. segments",
    // Framing hyper reads one way and some other server another (src/http1/head.rs).
    "head: both Content-Length and Transfer-Encoding",
    // Chunked bodies' lines end at CRLF only (src/http1/decode.rs). hyper takes a bare LF after
    // the last chunk as the start of a trailer section and reads on to the next CRLF CRLF:
    // the next request's head becomes "trailers".
    "body: invalid HTTP/1 message: a chunked body's line does not end with CRLF",
    "body: invalid HTTP/1 message: a bare CR in a chunked body's line",
];

/// Compares holdfast's reading with hyper's: the same requests, or holdfast stopping earlier
/// with a refusal listed in [`STRICTER`]; never a request hyper did not read the same, never
/// one more.
pub fn compare(holdfast: &Reading, hyper: &Reading) -> Result<(), String> {
    for (i, (h, y)) in holdfast.messages.iter().zip(&hyper.messages).enumerate() {
        if h != y {
            return Err(format!(
                "request {i} read differently:\nholdfast {h:?}\nhyper    {y:?}"
            ));
        }
    }
    let (h, y) = (holdfast.messages.len(), hyper.messages.len());
    if h > y {
        return Err(format!(
            "holdfast read {h} requests, hyper {y}: holdfast {:?}, hyper {:?}",
            holdfast.end, hyper.end
        ));
    }
    match (&holdfast.end, &hyper.end) {
        // The same requests: however each ended after them (read to the end, cut short,
        // refused), neither read another.
        _ if h == y => Ok(()),
        // holdfast refused where hyper read on: only on purpose.
        (End::Refused(why), _) if STRICTER.iter().any(|s| why.starts_with(s)) => Ok(()),
        (h_end, y_end) => Err(format!(
            "holdfast read {h} requests and ended {h_end:?}; hyper read {y} and ended {y_end:?}"
        )),
    }
}

/// One response as a client read it (to a GET).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// As [`Message::fields`].
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// How a response was read: the answer, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Read whole. (Whether the connection may carry another request is holdfast's own call,
    /// stricter than hyper's client: tests/it/strict.rs holds it.)
    Whole(Answer),
    /// Refused or broken, with why.
    Failed(String),
}

/// Reads `pieces` (an upstream's bytes, the connection closing after them) as the answer to a
/// GET, as holdfast's upstream side does (`src/upstream/h1.rs`): 100 and 103 read past, a head
/// within the limits, the body by its framing, to the close when close-delimited.
pub fn holdfast_reads_response(pieces: &[&[u8]]) -> Answered {
    let method = http::Method::GET;
    let mut arriving = pieces.iter();
    let mut buf = BytesMut::new();
    let head = loop {
        if !buf.is_empty() {
            let window = &buf[..buf.len().min(MAX_HEAD_BYTES)];
            match holdfast::http1::head::parse_response(window, MAX_HEADERS, &method) {
                Ok(Some((len, head))) => {
                    let _ = buf.split_to(len);
                    let status = head.parts.status;
                    if status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS
                    {
                        continue;
                    }
                    break head;
                }
                Ok(None) if buf.len() >= MAX_HEAD_BYTES => {
                    return Answered::Failed("head too large".into())
                }
                Ok(None) => {}
                Err(e) => return Answered::Failed(format!("head: {e}")),
            }
        }
        match arriving.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => return Answered::Failed("head: incomplete".into()),
        }
    };
    // The proxy refuses a 101 to a request that asked for no upgrade (src/proxy/attempt.rs).
    if head.parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
        return Answered::Failed("proxy: an unsolicited 101".into());
    }
    let body = match read_body(Decoder::new(head.framing), &mut buf, &mut arriving, true) {
        Ok(body) => body,
        Err(e) => {
            let why = e.map_or("incomplete".into(), |e| e.to_string());
            return Answered::Failed(format!("body: {why}"));
        }
    };
    Answered::Whole(Answer {
        status: head.parts.status.as_u16(),
        fields: fields_of(&head.parts.headers),
        body,
    })
}

/// Reads `pieces` as hyper's HTTP/1 client (`client::conn::http1`, default settings) reads the
/// answer to a GET.
pub async fn hyper_reads_response(pieces: &[&[u8]]) -> Answered {
    let (client, server) = tokio::io::duplex(1 << 20);
    let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
    let upstream = tokio::spawn(async move {
        let (mut from, mut to) = tokio::io::split(server);
        // The request first: the answer comes after it.
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\r\n\r\n") {
            if from.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            seen.push(byte[0]);
        }
        for piece in pieces {
            if to.write_all(&piece).await.is_err() {
                return;
            }
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        let _ = to.shutdown().await;
    });
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        let conn = tokio::spawn(conn);
        let req = Request::get("/mcp")
            .header("host", "mcp.example")
            .body(Empty::<Bytes>::new())
            .expect("a request");
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("hyper: {e}"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("hyper body: {e}"))?
            .to_bytes()
            .to_vec();
        conn.abort();
        Ok::<_, String>(Answered::Whole(Answer {
            status: parts.status.as_u16(),
            fields: fields_of(&parts.headers),
            body,
        }))
    })
    .await;
    upstream.abort();
    match answered {
        Ok(Ok(answered)) => answered,
        Ok(Err(why)) => Answered::Failed(why),
        Err(_) => Answered::Failed("hyper: no answer".into()),
    }
}

/// Where holdfast refuses an answer hyper's client reads, on purpose (README, "Forwarding").
pub const STRICTER_ANSWERS: &[&str] = &[
    // A coding that could not be passed on (Transfer-Encoding is hop-by-hop), `gzip, chunked`
    // included.
    "head: invalid HTTP/1 message: a response's transfer coding is not one chunked alone",
    // holdfast asked for no upgrade.
    "proxy: an unsolicited 101",
    // Chunked lines end at CRLF only, as for requests.
    "body: invalid HTTP/1 message: a chunked body's line does not end with CRLF",
    "body: invalid HTTP/1 message: a bare CR in a chunked body's line",
];

/// Compares the readings of one answer: the same status, fields and body, or holdfast refusing
/// on purpose; never an answer hyper refused or read otherwise.
pub fn compare_answers(holdfast: &Answered, hyper: &Answered) -> Result<(), String> {
    match (holdfast, hyper) {
        (Answered::Whole(h), Answered::Whole(y)) if h == y => Ok(()),
        (Answered::Whole(h), Answered::Whole(y)) => {
            Err(format!("read differently:\nholdfast {h:?}\nhyper    {y:?}"))
        }
        (Answered::Failed(_), Answered::Failed(_)) => Ok(()),
        (Answered::Failed(why), Answered::Whole(..))
            if STRICTER_ANSWERS.iter().any(|s| why.starts_with(s)) =>
        {
            Ok(())
        }
        (h, y) => Err(format!("holdfast {h:?}; hyper {y:?}")),
    }
}
