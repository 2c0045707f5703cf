//! Request bodies that could make holdfast and the server behind it read a connection
//! differently (issue 25, classes 1-4), with the exact bytes an attacker sends on a raw socket:
//! a chunked body that fails to decode, a trailer section ended by a bare LF, trailer fields that
//! would bypass what holdfast does to a head's fields, lenient chunk-size lines. Each is
//! answered once and ends its connection; nothing after the break is ever read as a request, and
//! no client trailer reaches the upstream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::http::Reserved;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// What a raw upstream received: every connection's bytes.
type Received = Arc<Mutex<Vec<Vec<u8>>>>;

/// An upstream on a raw socket that records every byte it is sent and answers each request
/// `200` with an empty body as soon as its head is complete (before reading any body: an
/// upstream that answers early), keeping the connection to read what else comes.
async fn recording_upstream() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let all = received.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let all = all.clone();
            tokio::spawn(async move {
                let index = {
                    let mut all = all.lock().unwrap();
                    all.push(Vec::new());
                    all.len() - 1
                };
                let mut answered = 0;
                let mut buf = [0u8; 4096];
                loop {
                    let n = match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let heads = {
                        let mut all = all.lock().unwrap();
                        all[index].extend_from_slice(&buf[..n]);
                        count(&all[index], b"\r\n\r\n")
                    };
                    // One answer per head seen (a body's trailer section ends the same way:
                    // that over-answers, which only makes a desync easier to see).
                    while answered < heads {
                        answered += 1;
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, received)
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// Sends `bytes` on one connection and reads until the connection ends (bounded): every byte
/// of every answer.
async fn answers_to(hf: &Holdfast, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(hf.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    within(stream.read_to_end(&mut got))
        .await
        .expect("the connection ends after the answer");
    String::from_utf8_lossy(&got).into_owned()
}

/// How many answers `text` holds (status lines).
fn answers(text: &str) -> usize {
    text.matches("HTTP/1.1 ").count()
}

const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: mcp.example\r\n\r\n";

fn chunked_post(body: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{body}"
    )
}

/// Class 1: a chunked body that breaks does not end like a body read to its end. With holding
/// off and the upstream down, the 503 is the answer from holdfast itself; before, the bytes after
/// the break were read as a second request and answered too.
#[tokio::test]
async fn a_body_that_fails_to_decode_ends_the_connection_after_holdfasts_own_answer() {
    let down = Reserved::new();
    let mut raw = raw_config(&down.url());
    raw.hold.enabled = false;
    let hf = Holdfast::start_with(raw).await;
    for body in [
        // The bytes after a chunk are no chunk-size line.
        format!("5\r\nhello\r\n{SMUGGLED}"),
        // A chunk's data not ended by CRLF.
        format!("5\r\nhelloX{SMUGGLED}"),
    ] {
        let got = answers_to(&hf, chunked_post(&body).as_bytes()).await;
        assert_eq!(answers(&got), 1, "{body:?}: {got}");
        assert!(got.starts_with("HTTP/1.1 503 "), "{body:?}: {got}");
    }
}

/// Class 2: the trailer section ends at CRLF CRLF only. A bare LF ending it (which httparse
/// would accept, and where a search for CRLF CRLF would not stop) is an error at once, not a
/// wait for the body's idle timeout, and nothing after it is read as a request.
#[tokio::test]
async fn a_trailer_section_ended_by_a_bare_lf_is_refused_at_once() {
    let (url, received) = recording_upstream().await;
    let hf = Holdfast::start(&url).await;
    for body in [
        format!("5\r\nhello\r\n0\r\n\n{SMUGGLED}"),
        "5\r\nhello\r\n0\r\nX: y\n\n".to_string(),
        format!("5\r\nhello\r\n0\r\nX: y\n\n{SMUGGLED}"),
    ] {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            answers_to(&hf, chunked_post(&body).as_bytes()),
        )
        .await
        .unwrap_or_else(|_| panic!("{body:?}: no answer and no close within 10 s"));
        assert!(answers(&got) <= 1, "{body:?}: {got}");
    }
    let sent = received.lock().unwrap().clone();
    assert!(
        sent.iter()
            .all(|c| !String::from_utf8_lossy(c).contains("/smuggled")),
        "the upstream was sent a smuggled request"
    );
}

/// Class 3: a client's trailer fields are read and checked, never forwarded: as trailers they
/// would pass by everything holdfast does to a head's fields.
#[tokio::test]
async fn client_trailers_never_reach_the_upstream() {
    let (url, received) = recording_upstream().await;
    let hf = Holdfast::start(&url).await;
    let body = "5\r\nhello\r\n0\r\nMcp-Session-Id: evil-session\r\nX-Forwarded-For: 6.6.6.6\r\n\
                Host: evil.example\r\nContent-Length: 99\r\n\r\n";
    let request = chunked_post(body).replace("\r\n\r\n5", "\r\nConnection: close\r\n\r\n5");
    let got = answers_to(&hf, request.as_bytes()).await;
    assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    let sent = String::from_utf8_lossy(&received.lock().unwrap().concat()).into_owned();
    assert!(sent.contains("hello"), "the body went: {sent:?}");
    // Whole fields: a bare "99" could be part of the request id holdfast made (32 hex digits).
    let sent_lower = sent.to_ascii_lowercase();
    for field in [
        "evil-session",
        "6.6.6.6",
        "evil.example",
        "content-length: 99",
    ] {
        assert!(
            !sent_lower.contains(field),
            "a trailer reached the upstream: {sent:?}"
        );
    }
}

/// Class 4: a chunk-size line is hex digits, spaces or tabs, `;extensions`, CRLF; a lone CR or
/// a form feed anywhere in it is refused (hyper: 400), and the connection ends.
#[tokio::test]
async fn lenient_chunk_size_lines_are_refused() {
    let down = Reserved::new();
    let mut raw = raw_config(&down.url());
    raw.hold.enabled = false;
    let hf = Holdfast::start_with(raw).await;
    for body in [
        "5\rx\r\nhello\r\n0\r\n\r\n",
        "5;ext=a\rb\r\nhello\r\n0\r\n\r\n",
        "5\x0c\r\nhello\r\n0\r\n\r\n",
        "5\x0c;a\r\nhello\r\n0\r\n\r\n",
    ] {
        let request = format!("{}{SMUGGLED}", chunked_post(body));
        let got = answers_to(&hf, request.as_bytes()).await;
        assert_eq!(answers(&got), 1, "{body:?}: {got}");
    }
    // The control: the same body, well formed, passes its decoding (and meets the down upstream).
    let last = "GET /next HTTP/1.1\r\nHost: mcp.example\r\nConnection: close\r\n\r\n";
    let fine = format!("{}{last}", chunked_post("5 ;a=b\r\nhello\r\n0\r\n\r\n"));
    let got = answers_to(&hf, fine.as_bytes()).await;
    assert_eq!(
        answers(&got),
        2,
        "a well-formed body keeps the connection: {got}"
    );
}
