//! The differential oracle (issue 25): byte streams read by holdfast's HTTP/1 request side and by
//! hyper's HTTP/1 server must give the same requests, or holdfast must refuse earlier for a
//! reason in its one table of deliberate strictness ([`core::STRICTER`]). Never a request hyper
//! read otherwise, never one more: two parties that read one connection differently are how
//! requests are smuggled past a proxy.
//!
//! The inputs: valid messages made from parts (methods, targets, versions, fields, bodies by
//! length or in chunks with extensions and trailers, pipelined in twos and threes), then mutated
//! where framing lives: line endings (LF, CR, CRLF), whitespace around names and values,
//! obs-fold, duplicate and conflicting Content-Length and Transfer-Encoding, chunk sizes,
//! extensions and trailers, truncation, stray framing bytes. Each is delivered whole, one byte
//! at a time, and split at random places. A fixed seed: the same few thousand inputs every run
//! (`fuzz/` runs the same core unbounded).
//!
//! The same for answers: upstream responses made from parts (statuses, an interim 100 first,
//! bodies by length, in chunks or to the close) and mutated alike, read by holdfast's upstream
//! side and by hyper's `client::conn::http1`: the same status, fields and body, or holdfast
//! refusing for a reason in [`core::STRICTER_ANSWERS`].

#[path = "core.rs"]
pub mod core;

use self::core::{compare, holdfast_reads, hyper_reads, End};

/// Inputs per run.
const INPUTS: usize = 2500;

/// One message under construction: head lines (without their line ends), then the body bytes
/// exactly as sent.
struct Draft {
    lines: Vec<String>,
    /// The line end after each head line and after the blank line (index `lines.len()`).
    ends: Vec<&'static str>,
    body: Vec<u8>,
}

impl Draft {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, line) in self.lines.iter().enumerate() {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(self.ends[i].as_bytes());
        }
        out.extend_from_slice(self.ends[self.lines.len()].as_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

fn pick<T: Copy>(rng: &mut fastrand::Rng, items: &[T]) -> T {
    items[rng.usize(..items.len())]
}

/// A chunked body of `data`, in pieces, with extensions and trailers now and then.
fn chunked(rng: &mut fastrand::Rng, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = rng.usize(1..=rest.len().min(9));
        let size = match rng.u8(..6) {
            0 => format!("{n:X}"),
            1 => format!("00{n:x}"),
            _ => format!("{n:x}"),
        };
        let ext = match rng.u8(..8) {
            0 => ";name=value",
            1 => " ;a",
            2 => ";q=\"quoted;x\"",
            _ => "",
        };
        out.extend_from_slice(format!("{size}{ext}\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n");
    if rng.u8(..4) == 0 {
        out.extend_from_slice(b"X-Checksum: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A valid message made from parts.
fn message(rng: &mut fastrand::Rng) -> Draft {
    let method = pick(
        rng,
        &["GET", "POST", "POST", "POST", "DELETE", "HEAD", "OPTIONS"],
    );
    let target = pick(
        rng,
        &[
            "/mcp",
            "/mcp",
            "/mcp?session=1",
            "/mcp/x",
            "http://mcp.example/mcp",
            "/",
        ],
    );
    let version = if rng.u8(..8) == 0 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let mut lines = vec![format!("{method} {target} {version}")];
    lines.push("Host: mcp.example".into());
    if rng.bool() {
        lines.push("Content-Type: application/json".into());
    }
    if rng.u8(..4) == 0 {
        lines.push("Mcp-Session-Id: abc123".into());
    }
    match rng.u8(..8) {
        0 => lines.push("Connection: close".into()),
        1 => lines.push("Connection: keep-alive".into()),
        2 => lines.push("Expect: 100-continue".into()),
        _ => {}
    }
    let data = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let data = &data[..rng.usize(1..=data.len())];
    let body = if method == "POST" || rng.u8(..6) == 0 {
        if version == "HTTP/1.1" && rng.bool() {
            lines.push("Transfer-Encoding: chunked".into());
            chunked(rng, data)
        } else {
            lines.push(format!("Content-Length: {}", data.len()));
            data.to_vec()
        }
    } else {
        Vec::new()
    };
    let ends = vec!["\r\n"; lines.len() + 1];
    Draft { lines, ends, body }
}

/// One mutation where framing lives.
fn mutate(rng: &mut fastrand::Rng, d: &mut Draft) {
    let line = rng.usize(1..d.lines.len().max(2)).min(d.lines.len() - 1);
    match rng.u8(..16) {
        // Line endings.
        0 => {
            let at = rng.usize(..d.ends.len());
            d.ends[at] = pick(rng, &["\n", "\r", "\r\r\n", "\n\r"]);
        }
        // Whitespace before the colon, around the value, in the name.
        1 => d.lines[line] = d.lines[line].replacen(':', pick(rng, &[" :", "\t:", ": ", ":\t"]), 1),
        2 => d.lines[line].push_str(pick(rng, &[" ", "\t", "\x0b", "\x0c"])),
        // obs-fold: a line that begins with whitespace.
        3 => d
            .lines
            .insert(line, pick(rng, &[" folded", "\tfolded"]).to_string()),
        // Duplicate or conflicting framing.
        4 => d.lines.insert(
            line,
            pick(
                rng,
                &[
                    "Content-Length: 5",
                    "Content-Length: 0",
                    "Content-Length: 5, 5",
                    "Content-Length: +5",
                    "Content-Length: 05",
                    "Content-Length: 5 ",
                    "Content-Length:5",
                    "Content-Length: -1",
                    "Content-Length: 99999999999999999999",
                ],
            )
            .to_string(),
        ),
        5 => d.lines.insert(
            line,
            pick(
                rng,
                &[
                    "Transfer-Encoding: chunked",
                    "Transfer-Encoding: Chunked",
                    "Transfer-Encoding: chunked, chunked",
                    "Transfer-Encoding: gzip, chunked",
                    "Transfer-Encoding: identity",
                    "Transfer-Encoding: chunked;q=1",
                    "Transfer-Encoding:\tchunked",
                    "Transfer-Encoding: xchunked",
                    "Transfer-Encoding: ,chunked",
                ],
            )
            .to_string(),
        ),
        // Hosts.
        6 => d.lines.insert(
            line,
            pick(
                rng,
                &[
                    "Host: other.example",
                    "Host: mcp.example",
                    "Host:",
                    "Host: a b",
                    "Host: [::1]:80",
                ],
            )
            .to_string(),
        ),
        // Chunk-size lines and chunk data.
        7 => {
            let size = pick(
                rng,
                &[
                    "5 ",
                    "5\t",
                    "5;",
                    "5;a=\"b\r\nc\"",
                    "0x5",
                    "+5",
                    "5\x0c",
                    "ffffffffffffffffff",
                    "5 5",
                    " 5",
                    "5;a\rb",
                ],
            );
            let body = String::from_utf8_lossy(&d.body).into_owned();
            if let Some(at) = body.find("\r\n") {
                d.body = format!("{size}{}", &body[at..]).into_bytes();
            }
        }
        // Trailers.
        8 => {
            let trailer = pick(
                rng,
                &[
                    "0\r\n\n",
                    "0\r\nX: y\n\n",
                    "0\r\nX: y\r\n\r\n",
                    "0\r\n X: y\r\n\r\n",
                    "0\n\r\n",
                    "0\r\nContent-Length: 5\r\n\r\n",
                    "0\r\r\n\r\n",
                ],
            );
            if let Some(at) = d.body.windows(3).rposition(|w| w == b"0\r\n") {
                d.body.truncate(at);
                d.body.extend_from_slice(trailer.as_bytes());
            }
        }
        // The request line.
        9 => {
            d.lines[0] = pick(
                rng,
                &[
                    "GET /mcp HTTP/1.1 ",
                    "GET  /mcp HTTP/1.1",
                    "GET /mcp HTTP/1.2",
                    "GET /mcp http/1.1",
                    "CONNECT mcp.example:443 HTTP/1.1",
                    "GET mcp.example:443 HTTP/1.1",
                    "OPTIONS * HTTP/1.1",
                    "GET /mcp/../x HTTP/1.1",
                    "GET http://other.example/mcp HTTP/1.1",
                    "GET /mcp",
                ],
            )
            .to_string()
        }
        // A stray framing byte somewhere in the body.
        10 if !d.body.is_empty() => {
            let at = rng.usize(..=d.body.len());
            d.body.insert(at, pick(rng, b"\r\n ;:0"));
        }
        // A name with a bad character, an empty name, a very long line.
        11 => d.lines.insert(
            line,
            pick(rng, &["X Bad: 1", ": empty", "X\x00: 1", "X:\x7f"]).to_string(),
        ),
        12 => d.body.truncate(rng.usize(..=d.body.len())),
        _ => {}
    }
    d.ends.resize(d.lines.len() + 1, "\r\n");
}

/// The `i`th input: one to three messages, most mutated, sometimes cut short.
fn input(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.usize(1..=3) {
        let mut draft = message(rng);
        for _ in 0..rng.usize(0..=2) {
            mutate(rng, &mut draft);
        }
        out.extend(draft.bytes());
    }
    if rng.u8(..10) == 0 {
        out.truncate(rng.usize(..=out.len()));
    }
    out
}

/// The ways one input is delivered: whole, a byte at a time, and split at two random places.
fn deliveries(rng: &mut fastrand::Rng, bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut ways = vec![
        vec![bytes.to_vec()],
        bytes.iter().map(|b| vec![*b]).collect(),
    ];
    if bytes.len() > 2 {
        let mut cuts = [rng.usize(1..bytes.len()), rng.usize(1..bytes.len())];
        cuts.sort_unstable();
        ways.push(vec![
            bytes[..cuts[0]].to_vec(),
            bytes[cuts[0]..cuts[1]].to_vec(),
            bytes[cuts[1]..].to_vec(),
        ]);
    }
    ways
}

/// Inputs the fuzzer found (`fuzz/`), kept: each once a difference, now agreed.
const FOUND: &[&[u8]] = &[
    // Empty lines and a stray CR, no request: holdfast refuses the CR, hyper ends quietly.
    b"\r\n\n\n\r\n\n\n\n\n\r\n\r\r",
    // A Content-Length of 24 digits, leading zeros: hyper reads 5; holdfast refused more than
    // 19 digits whatever their value. And a zero-padded chunk size alike.
    b"POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nContent-Length: 000000000000000000000005\r\n\r\nhello",
    b"POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000000005\r\nhello\r\n0\r\n\r\n",
];

#[tokio::test]
async fn inputs_the_fuzzer_found_read_alike() {
    for bytes in FOUND {
        let mut rng = fastrand::Rng::with_seed(1);
        for pieces in deliveries(&mut rng, bytes) {
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let (ours, theirs) = (holdfast_reads(&pieces), hyper_reads(&pieces).await);
            if let Err(why) = compare(&ours, &theirs) {
                panic!("{why}\n  bytes: {:?}", String::from_utf8_lossy(bytes));
            }
        }
    }
}

#[tokio::test]
async fn holdfast_reads_requests_as_hyper_does_or_refuses_on_purpose() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_0025);
    let mut differences = Vec::new();
    let mut stricter = std::collections::BTreeMap::<String, usize>::new();
    let mut agreed = 0;
    for i in 0..INPUTS {
        let bytes = input(&mut rng);
        for pieces in deliveries(&mut rng, &bytes) {
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let ours = holdfast_reads(&pieces);
            let theirs = hyper_reads(&pieces).await;
            match compare(&ours, &theirs) {
                Ok(()) => {
                    agreed += 1;
                    // Counted where hyper read on: more requests, or to the end.
                    let read_on =
                        theirs.messages.len() > ours.messages.len() || theirs.end == End::Clean;
                    if let (End::Refused(why), true) = (&ours.end, read_on) {
                        *stricter.entry(why.clone()).or_default() += 1;
                    }
                }
                Err(why) if pieces.len() == 1 => differences.push(format!(
                    "input {i} ({} pieces): {why}\n  bytes: {:?}",
                    pieces.len(),
                    String::from_utf8_lossy(&bytes)
                )),
                Err(why) => differences.push(format!("input {i} ({} pieces): {why}", pieces.len())),
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} readings differ; the first:\n{}",
        differences.len(),
        agreed + differences.len(),
        differences[..differences.len().min(12)].join("\n")
    );
    eprintln!("{agreed} readings agreed; holdfast stricter on purpose: {stricter:#?}");
    // The inputs must exercise both agreement and refusal, or the generator proves nothing.
    assert!(agreed > INPUTS, "{agreed} readings agreed");
    assert!(
        !stricter.is_empty(),
        "holdfast was never stricter than hyper: {stricter:?}"
    );
}

/// A valid answer made from parts, as an upstream might send it.
fn answer(rng: &mut fastrand::Rng) -> Draft {
    let status = pick(
        rng,
        &[
            "200 OK",
            "200 OK",
            "404 Not Found",
            "503 Service Unavailable",
            "204 No Content",
        ],
    );
    let version = if rng.u8(..8) == 0 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let mut lines = vec![format!("{version} {status}")];
    if rng.u8(..6) == 0 {
        // An interim answer first, which the final one follows.
        lines = vec![
            "HTTP/1.1 100 Continue".into(),
            String::new(),
            format!("{version} {status}"),
        ];
    }
    lines.push(
        pick(
            rng,
            &[
                "Content-Type: application/json",
                "Content-Type: text/event-stream",
            ],
        )
        .into(),
    );
    if rng.u8(..4) == 0 {
        lines.push("Mcp-Session-Id: abc123".into());
    }
    let data = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    let data = &data[..rng.usize(1..=data.len())];
    let body = match rng.u8(..3) {
        0 if version == "HTTP/1.1" => {
            lines.push("Transfer-Encoding: chunked".into());
            chunked(rng, data)
        }
        1 => {
            lines.push(format!("Content-Length: {}", data.len()));
            data.to_vec()
        }
        // Read to the close.
        _ => data.to_vec(),
    };
    let ends = vec!["\r\n"; lines.len() + 1];
    Draft { lines, ends, body }
}

#[tokio::test]
async fn holdfast_reads_answers_as_hypers_client_does_or_refuses_on_purpose() {
    use self::core::{compare_answers, holdfast_reads_response, hyper_reads_response};
    let mut rng = fastrand::Rng::with_seed(0x5eed_0026);
    let mut differences = Vec::new();
    let (mut agreed, mut whole) = (0, 0);
    for i in 0..INPUTS / 2 {
        let mut draft = answer(&mut rng);
        for _ in 0..rng.usize(0..=2) {
            mutate(&mut rng, &mut draft);
        }
        let bytes = draft.bytes();
        for pieces in deliveries(&mut rng, &bytes) {
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let ours = holdfast_reads_response(&pieces);
            let theirs = hyper_reads_response(&pieces).await;
            match compare_answers(&ours, &theirs) {
                Ok(()) => {
                    agreed += 1;
                    whole += usize::from(matches!(ours, core::Answered::Whole(_)));
                }
                Err(why) => differences.push(format!(
                    "answer {i} ({} pieces): {why}\n  bytes: {:?}",
                    pieces.len(),
                    String::from_utf8_lossy(&bytes)
                )),
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} readings differ; the first:\n{}",
        differences.len(),
        agreed + differences.len(),
        differences[..differences.len().min(8)].join("\n")
    );
    eprintln!("{agreed} answer readings agreed, {whole} of them read whole");
    assert!(whole > INPUTS / 2, "{whole} answers were read whole");
    assert!(
        agreed > whole,
        "no answer was refused: the mutations prove nothing"
    );
}
