//! The `text/event-stream` format, read incrementally: what an MCP server's event stream says,
//! frame by frame, whatever its line endings and however its bytes are cut.
//!
//! Lines end in LF, CRLF or a lone CR (the SSE specification allows all three, and mixed); an
//! empty line ends an event; comments and unknown fields are skipped. An event is handed out
//! when it had a `data` or an `id` line: an `id` alone (a "priming" event, empty data) is what
//! makes a stream resumable with `Last-Event-ID`, so a reader must see it.
//!
//! Memory stays bounded: a line is kept up to [`Parser::new`]'s cap (plus room for its field
//! name) and the rest of it dropped, and an event's data beyond the cap is dropped, the event
//! marked [`Event::cut`].

/// Room on a line for its field name, beyond the cap on its value.
const FIELD_ROOM: usize = 16;

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
        }
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
        for &b in bytes {
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
                each(event);
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
            b"id" => {
                self.id = (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned())
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
}
