//! The `text/event-stream` format, read incrementally: what an MCP server's event stream says,
//! frame by frame, whatever its line endings and however its bytes are cut. The one reader of
//! events in holdfast: the probe, the watch for an unanswered stream, the session's own
//! requests' answers, the learning of tool annotations and the legacy `endpoint` rewrite all
//! read through it.
//!
//! As the SSE specification says: lines end in LF, CRLF or a lone CR (and may mix); a UTF-8 BOM
//! at the stream's start is dropped; an empty line ends an event; comments (`:`) and unknown
//! fields are skipped; one space after the colon is dropped; `data` lines join with newlines;
//! an `id` holding a NUL is ignored; `retry` counts only when all digits. An event is handed out
//! when it had a `data` or an `id` line: an `id` alone (a "priming" event, empty data) is what
//! makes a stream resumable with `Last-Event-ID`, so a reader must see it. (A browser would
//! drop it; holdfast is not a browser.)
//!
//! Memory stays bounded: a line is kept up to [`Parser::new`]'s cap (plus room for its field
//! name) and the rest of it dropped, and an event's data beyond the cap is dropped, the event
//! marked [`Event::cut`].

/// `message` (one line: JSON as serde writes it) as one event: the answers and notifications
/// holdfast writes on event streams of its own (the era bridge's).
pub fn data_event(message: &[u8]) -> bytes::Bytes {
    let mut out = bytes::BytesMut::with_capacity(message.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(message);
    out.extend_from_slice(b"\n\n");
    out.freeze()
}

/// Room on a line for its field name, beyond the cap on its value.
const FIELD_ROOM: usize = 16;

/// The UTF-8 byte order mark, dropped at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The lines of `bytes` as they are, each with its line end (LF, CRLF or a lone CR; empty for
/// a last line without one): for rewriting one field of an event while keeping every other
/// byte.
pub fn lines(bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (line, end_len) = match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            None => (rest, 0),
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => (&rest[..i], 2),
            Some(i) => (&rest[..i], 1),
        };
        let (end, after) = rest[line.len()..].split_at(end_len);
        rest = after;
        Some((line, end))
    })
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field; `message` when absent, as the SSE specification says.
    pub event: String,
    /// The `id:` field when it was given and not empty: the client may resume after it.
    pub id: Option<String>,
    /// The `data:` lines, joined with newlines (empty when there were none).
    pub data: String,
    /// Whether the event had at least one `data:` line (an empty one included).
    pub has_data: bool,
    /// Whether its data was longer than the cap: `data` holds only its start.
    pub cut: bool,
}

/// An incremental event-stream parser.
#[derive(Debug)]
pub struct Parser {
    cap: usize,
    line: Vec<u8>,
    /// The line grew past the cap: the rest of it is dropped.
    line_cut: bool,
    event: Option<String>,
    id: Option<String>,
    data: Vec<u8>,
    data_lines: usize,
    cut: bool,
    /// The last byte was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    /// Bytes of a BOM matched at the stream's start; `None` once past it.
    bom: Option<usize>,
    /// The latest valid `retry:` value, in milliseconds.
    retry: Option<u64>,
}

impl Parser {
    /// A parser that keeps at most `cap` bytes of a line and of an event's data.
    pub fn new(cap: usize) -> Self {
        Parser {
            cap,
            line: Vec::new(),
            line_cut: false,
            event: None,
            id: None,
            data: Vec::new(),
            data_lines: 0,
            cut: false,
            after_cr: false,
            bom: Some(0),
            retry: None,
        }
    }

    /// The reconnection time the stream last asked for (`retry:`), in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Whether the bytes fed so far end exactly at an event boundary: nothing of a line or of
    /// an event is pending. (What a stream that ends here leaves unfinished: nothing.)
    pub fn at_boundary(&self) -> bool {
        self.line.is_empty()
            && !self.line_cut
            && self.data_lines == 0
            && self.id.is_none()
            && self.event.is_none()
    }

    /// Feeds bytes; calls `each` with every event they complete, in order.
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(Event)) {
        self.feed_at(bytes, |event, _| each(event));
    }

    /// Feeds bytes; calls `each` with every event they complete and where in `bytes` it ended:
    /// just past the line end of its empty line (for a CRLF, past the CR: the LF may come in
    /// the next bytes, and ends nothing).
    pub fn feed_at(&mut self, bytes: &[u8], mut each: impl FnMut(Event, usize)) {
        let mut bytes = bytes;
        let mut offset = 0;
        if let Some(matched) = self.bom {
            // The stream's first bytes, perhaps cut inside the BOM.
            let n = bytes.len().min(BOM.len() - matched);
            if bytes[..n] == BOM[matched..matched + n] {
                self.bom = (matched + n < BOM.len()).then_some(matched + n);
                bytes = &bytes[n..];
                offset = n;
            } else {
                // Not a BOM after all: what was taken for its start is ordinary bytes.
                self.bom = None;
                self.push_bytes(&BOM[..matched], &mut |_, _| {}, 0);
            }
        }
        self.push_bytes(bytes, &mut each, offset);
    }

    fn push_bytes(&mut self, bytes: &[u8], each: &mut impl FnMut(Event, usize), offset: usize) {
        if !bytes.is_empty() {
            self.bom = None;
        }
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' && std::mem::take(&mut self.after_cr) {
                continue;
            }
            self.after_cr = b == b'\r';
            if b != b'\n' && b != b'\r' {
                if self.line.len() < self.cap + FIELD_ROOM {
                    self.line.push(b);
                } else {
                    self.line_cut = true;
                }
                continue;
            }
            if let Some(event) = self.end_line() {
                each(event, offset + i + 1);
            }
        }
    }

    /// Feeds bytes; the events they complete.
    pub fn events(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut done = Vec::new();
        self.feed(bytes, |e| done.push(e));
        done
    }

    /// A line ended: a field noted, or (an empty line) the event handed out.
    fn end_line(&mut self) -> Option<Event> {
        let line = std::mem::take(&mut self.line);
        let line_cut = std::mem::take(&mut self.line_cut);
        if line.is_empty() && !line_cut {
            return self.dispatch();
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => (&line[..colon], &line[colon + 1..]),
            None => (&line[..], &[][..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        match field {
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            b"id" if !value.contains(&0) => {
                self.id = (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned())
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                // Past u64 it is not a time anyone waits: kept as the largest.
                self.retry = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(u64::MAX),
                );
            }
            b"data" => {
                if self.data_lines > 0 {
                    self.push_data(b"\n");
                }
                self.push_data(value);
                self.data_lines += 1;
                self.cut |= line_cut;
            }
            _ => {}
        }
        None
    }

    fn push_data(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.cut = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn dispatch(&mut self) -> Option<Event> {
        let event = self.event.take();
        let id = self.id.take();
        let has_data = std::mem::take(&mut self.data_lines) > 0;
        let data = std::mem::take(&mut self.data);
        let cut = std::mem::take(&mut self.cut);
        if !has_data && id.is_none() {
            return None;
        }
        Some(Event {
            event: event.unwrap_or_else(|| "message".into()),
            id,
            data: String::from_utf8_lossy(&data).into_owned(),
            has_data,
            cut,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, id: Option<&str>, data: &str) -> Event {
        Event {
            event: name.into(),
            id: id.map(Into::into),
            data: data.into(),
            has_data: true,
            cut: false,
        }
    }

    #[test]
    fn events_are_cut_at_blank_lines_whatever_the_line_ends_and_the_chunks() {
        let stream = b": comment\r\nevent: endpoint\r\ndata: /messages?s=1\r\n\r\nid: 7\ndata: {\"a\":\ndata: 1}\n\nevent: x\rdata: y\r\r";
        let expected = [
            event("endpoint", None, "/messages?s=1"),
            event("message", Some("7"), "{\"a\":\n1}"),
            event("x", None, "y"),
        ];
        // Fed at once, and one byte at a time, the events come out the same.
        let mut parser = Parser::new(1024);
        assert_eq!(parser.events(stream), expected);
        assert!(parser.at_boundary());
        let mut parser = Parser::new(1024);
        let mut events = Vec::new();
        for b in stream.iter() {
            events.extend(parser.events(std::slice::from_ref(b)));
        }
        assert_eq!(events, expected);
    }

    #[test]
    fn a_priming_event_is_an_event_and_a_named_one_without_data_is_not() {
        let mut parser = Parser::new(1024);
        let events = parser.events(b"event: ping\n\nid: 0\nretry: 3000\ndata:\n\nid:\n\n");
        assert_eq!(
            events,
            [Event {
                event: "message".into(),
                id: Some("0".into()),
                data: String::new(),
                has_data: true,
                cut: false,
            }]
        );
    }

    #[test]
    fn a_stream_cut_mid_event_is_not_at_a_boundary() {
        let mut parser = Parser::new(1024);
        assert!(parser.at_boundary());
        parser.feed(b"data: {\"jsonrpc\"", |_| panic!("no event yet"));
        assert!(!parser.at_boundary());
        parser.feed(b"}\n", |_| panic!("no event yet"));
        assert!(!parser.at_boundary());
        assert_eq!(parser.events(b"\n").len(), 1);
        assert!(parser.at_boundary());
    }

    #[test]
    fn data_beyond_the_cap_is_dropped_and_marked() {
        let mut parser = Parser::new(8);
        let events = parser.events(b"data: 0123456789abcdef\ndata: more\n\ndata: ok\n\n");
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data, "01234567");
        assert!(events[0].cut);
        assert_eq!(events[1].data, "ok");
        assert!(!events[1].cut);
    }

    fn data_of(stream: &[u8]) -> Vec<String> {
        Parser::new(1024)
            .events(stream)
            .into_iter()
            .map(|e| e.data)
            .collect()
    }

    /// The SSE specification's own examples (HTML Living Standard, "Server-sent events",
    /// "Parsing an event stream" and "Interpreting an event stream").
    #[test]
    fn the_specifications_examples() {
        // Three data lines make one event's data, joined with newlines.
        assert_eq!(
            data_of(b"data: YHOO\ndata: +2\ndata: 10\n\n"),
            ["YHOO\n+2\n10"]
        );
        // A comment; ids; `id` alone on its line resets the id; only one space is dropped.
        let events = Parser::new(1024).events(
            b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n",
        );
        assert_eq!(events.len(), 2, "the last event has no empty line yet");
        assert_eq!(
            (events[0].data.as_str(), events[0].id.as_deref()),
            ("first event", Some("1"))
        );
        assert_eq!(
            (events[1].data.as_str(), events[1].id.as_deref()),
            ("second event", None)
        );
        let mut parser = Parser::new(1024);
        let events = parser
            .events(b"data: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n");
        assert_eq!(events[2].data, " third event");
        // `data` with no colon is an empty data line; the stream's unterminated end is dropped.
        assert_eq!(data_of(b"data\n\ndata\ndata\n\ndata:"), ["", "\n"]);
        // With or without the space, the same data.
        assert_eq!(data_of(b"data:test\n\ndata: test\n\n"), ["test", "test"]);
    }

    #[test]
    fn a_bom_at_the_start_is_dropped_even_cut_in_two_and_only_there() {
        let stream = b"\xEF\xBB\xBFdata: a\n\ndata: \xEF\xBB\xBFb\n\n";
        assert_eq!(data_of(stream), ["a", "\u{feff}b"]);
        let mut parser = Parser::new(1024);
        assert!(parser.events(b"\xEF").is_empty());
        assert!(parser.events(b"\xBB").is_empty());
        assert_eq!(parser.events(b"\xBFdata: a\n\n")[0].data, "a");
        // Not a BOM: the bytes are the first line's (a field name nobody knows).
        assert_eq!(data_of(b"\xEFdata: a\n\ndata: b\n\n"), ["b"]);
    }

    #[test]
    fn retry_counts_only_when_all_digits_and_a_nul_id_is_ignored() {
        let mut parser = Parser::new(1024);
        parser.events(b"retry: 3000\n\nretry: 12x\nretry:\n\n");
        assert_eq!(parser.retry(), Some(3000));
        let events = parser.events(b"id: 7\ndata: a\n\nid: 8\0\ndata: b\n\n");
        assert_eq!(events[0].id.as_deref(), Some("7"));
        assert_eq!(events[1].id, None, "an id with a NUL is ignored");
    }

    #[test]
    fn each_event_says_where_it_ended() {
        let stream = b"data: a\r\n\r\n: c\rdata: b\r\rdata: c\n\n";
        let mut ends = Vec::new();
        Parser::new(1024).feed_at(stream, |e, end| ends.push((e.data, end)));
        assert_eq!(
            ends,
            [("a".into(), 10), ("b".into(), 24), ("c".into(), 33)],
            "just past the CR of a CRLF"
        );
        // A BOM counts in the offsets.
        let mut ends = Vec::new();
        Parser::new(1024).feed_at(b"\xEF\xBB\xBFdata: a\n\n", |_, end| ends.push(end));
        assert_eq!(ends, [12]);
    }

    proptest::proptest! {
        /// However a stream is cut into pieces, the same events come out, and the offsets of
        /// their ends, counted over the whole stream, are the same.
        #[test]
        fn cutting_a_stream_anywhere_changes_nothing(
            lines in proptest::collection::vec(
                (
                    proptest::sample::select(vec!["data", "data:", "data: ", "id: ", "id:", "event: ", "retry: ", ": ", "x: ", ""]),
                    "[a-z0-9 {}\":,]{0,12}",
                    proptest::sample::select(vec!["\n", "\r", "\r\n"]),
                ),
                0..24,
            ),
            bom in proptest::bool::ANY,
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let mut stream: Vec<u8> = if bom { BOM.to_vec() } else { Vec::new() };
            for (field, value, end) in &lines {
                stream.extend_from_slice(field.as_bytes());
                if !field.is_empty() {
                    stream.extend_from_slice(value.as_bytes());
                }
                stream.extend_from_slice(end.as_bytes());
            }
            let whole = {
                let mut out = Vec::new();
                Parser::new(64).feed_at(&stream, |e, end| out.push((e, end)));
                out
            };
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut parser = Parser::new(64);
            let mut start = 0;
            for cut in cuts.into_iter().chain([stream.len()]) {
                parser.feed_at(&stream[start..cut], |e, end| pieces.push((e, start + end)));
                start = cut;
            }
            // A CRLF cut between its CR and LF ends the event at the CR either way.
            proptest::prop_assert_eq!(whole, pieces);
        }
    }

    #[test]
    fn one_byte_at_a_time_is_the_same_as_all_at_once() {
        let stream =
            b"\xEF\xBB\xBFid: 1\r\nretry: 10\revent: e\ndata: a\r\ndata: b\r\r: c\n\ndata: z\n\n";
        let mut whole = Vec::new();
        Parser::new(1024).feed_at(stream, |e, end| whole.push((e, end)));
        let mut parser = Parser::new(1024);
        let mut each = Vec::new();
        for (i, b) in stream.iter().enumerate() {
            parser.feed_at(std::slice::from_ref(b), |e, end| each.push((e, i + end)));
        }
        assert_eq!(whole, each);
        assert_eq!(whole.len(), 2);
    }

    #[test]
    fn lines_keep_their_ends() {
        let got: Vec<(&[u8], &[u8])> = lines(b"a\r\nb\rc\n\nd").collect();
        let want: [(&[u8], &[u8]); 5] = [
            (b"a", b"\r\n"),
            (b"b", b"\r"),
            (b"c", b"\n"),
            (b"", b"\n"),
            (b"d", b""),
        ];
        assert_eq!(got, want);
    }
}
