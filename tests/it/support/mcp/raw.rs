//! Raw HTTP/1.1 to an MCP endpoint: the bytes on the wire, not what a client library made of
//! them.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::{MCP_ACCEPT, MCP_PATH};

/// A response read byte for byte off a raw socket.
#[derive(Clone, Debug)]
pub struct RawResponse {
    /// The response bytes as received.
    pub raw: Vec<u8>,
    /// The status line without CRLF, e.g. `HTTP/1.1 404 Not Found`.
    pub status_line: String,
    /// Header fields in wire order, names as sent (hyper sends lowercase).
    pub headers: Vec<(String, String)>,
    /// The body bytes after the blank line (not de-chunked).
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of a header, name compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Header names in wire order.
    pub fn header_names(&self) -> Vec<&str> {
        self.headers.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// Writes `request` (one complete HTTP/1.1 request) to `addr` and reads one response: to its
/// `Content-Length`, to the last chunk, or else to EOF. The bytes are what went over the wire,
/// not what a client library made of them. Without `Connection: close` in the request, the
/// response carries only the server's own headers.
pub async fn raw_http(addr: SocketAddr, request: &[u8]) -> std::io::Result<RawResponse> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut raw = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        if let Some(response) = parse_complete(&raw)? {
            return Ok(response);
        }
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return parse_complete(&raw)?
                .map_or_else(|| parse_head(raw).map(|(response, _)| response), Ok);
        }
        raw.extend_from_slice(&buffer[..read]);
    }
}

/// The response in `raw` if its body is complete by its own framing (length or chunks).
fn parse_complete(raw: &[u8]) -> std::io::Result<Option<RawResponse>> {
    if !raw.windows(4).any(|window| window == b"\r\n\r\n") {
        return Ok(None);
    }
    let (response, body_start) = parse_head(raw.to_vec())?;
    let body = &raw[body_start..];
    let complete = if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().map_err(std::io::Error::other)?;
        body.len() >= length
    } else if response
        .header("transfer-encoding")
        .is_some_and(|value| value.eq_ignore_ascii_case("chunked"))
    {
        body.starts_with(b"0\r\n\r\n") || body.windows(7).any(|window| window == b"\r\n0\r\n\r\n")
    } else {
        false
    };
    Ok(complete.then_some(response))
}

/// Splits the status line, headers and body; returns where the body starts.
fn parse_head(raw: Vec<u8>) -> std::io::Result<(RawResponse, usize)> {
    let split = raw
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers in response"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(std::io::Error::other)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
        .collect();
    let body = raw[split + 4..].to_vec();
    Ok((
        RawResponse {
            raw,
            status_line,
            headers,
            body,
        },
        split + 4,
    ))
}

/// A complete `POST /mcp` request as an MCP client would send it. `session_id` becomes
/// `Mcp-Session-Id`; `host` the Host header.
pub fn mcp_post(host: &str, session_id: Option<&str>, json_body: &str) -> Vec<u8> {
    let session = session_id
        .map(|id| format!("mcp-session-id: {id}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {MCP_PATH} HTTP/1.1\r\n\
         host: {host}\r\n\
         accept: {MCP_ACCEPT}\r\n\
         content-type: application/json\r\n\
         {session}\
         content-length: {}\r\n\
         \r\n\
         {json_body}",
        json_body.len()
    )
    .into_bytes()
}
