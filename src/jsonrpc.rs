//! JSON-RPC 2.0 as MCP sends it, read one way: the one reader of messages in holdfast. The 503's
//! echoed id, the decision to send a request again, the session recorder, the watch for an
//! unanswered stream, the probe and the learning of tool annotations all read through
//! [`read`]; the metric label's fast scan ([`method_scan`]) is property-tested to agree with it.
//!
//! What a message is, as the specifications say:
//! - a **request** has `"jsonrpc": "2.0"`, a string `method` and an `id` that is a string or a
//!   number (JSON-RPC allows null, MCP forbids it: a null id is not a request holdfast answers
//!   for, nor one it sends twice);
//! - a **notification** has a `method` and no `id`;
//! - a **response** has an `id` (null allowed, for an error about an unreadable request) and
//!   exactly one of `result` or `error`;
//! - a **batch** is an array of them (2025-03-26 only; holdfast never replays or echoes one);
//! - anything else, or a message without `"jsonrpc": "2.0"`, is not a JSON-RPC message.
//!
//! An id is kept as it was written ([`Id`]), so the 503 echoes `1e3` as `1e3` and `"7"` as
//! `"7"`: a client matches answers to its requests by the id it chose.

use std::borrow::Cow;

use serde::de::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A member that may be absent, or present with any value (`null` included, unlike `Option`).
#[derive(Debug, Clone, Copy, Default)]
enum Member<'a> {
    #[default]
    Absent,
    Present(&'a RawValue),
}

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&RawValue>::deserialize(d).map(Member::Present)
    }
}

impl<'a> Member<'a> {
    fn get(self) -> Option<&'a RawValue> {
        match self {
            Member::Absent => None,
            Member::Present(raw) => Some(raw),
        }
    }
}

/// One message's members, borrowed from the body.
#[derive(Debug, serde::Deserialize)]
struct Raw<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Member<'a>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Member<'a>,
    #[serde(borrow, default)]
    result: Member<'a>,
    #[serde(borrow, default)]
    error: Member<'a>,
}

/// What a body holds.
#[derive(Debug)]
pub enum Read<'a> {
    /// One message.
    One(Message<'a>),
    /// A batch of them (the messages that are not JSON-RPC are left out).
    Batch(Vec<Message<'a>>),
    /// Not JSON-RPC: not JSON, not an object or array, not `"jsonrpc": "2.0"`.
    Not,
}

/// Reads a body: one message, a batch, or not JSON-RPC.
pub fn read(body: &[u8]) -> Read<'_> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return match serde_json::from_slice::<Vec<Raw<'_>>>(body) {
            Ok(batch) => Read::Batch(batch.into_iter().filter_map(Message::of).collect()),
            Err(_) => Read::Not,
        };
    }
    match serde_json::from_slice::<Raw<'_>>(body)
        .ok()
        .and_then(Message::of)
    {
        Some(message) => Read::One(message),
        None => Read::Not,
    }
}

/// The one message in `body`, if it holds exactly one.
pub fn one(body: &[u8]) -> Option<Message<'_>> {
    match read(body) {
        Read::One(message) => Some(message),
        _ => None,
    }
}

/// The tool a `tools/call` body calls: its `params.name` when that is a string, in a body of
/// one JSON-RPC 2.0 message; read in one pass, the other members (the call's arguments above
/// all) skipped without being built. What [`one`] and [`Message::param_str`] find, for 6k
/// fewer instructions on a 1 KiB call (benches/RESULTS.md): the access log and the trace read
/// it for every call.
pub fn call_tool_name(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        #[serde(borrow, default)]
        jsonrpc: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        params: Option<Named<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        name: Member<'a>,
    }
    let call: Call<'_> = serde_json::from_slice(body).ok()?;
    if call.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    let name = call.params?.name.get()?;
    serde_json::from_str::<String>(name.get()).ok()
}

/// The kind of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
    /// A `"jsonrpc": "2.0"` object that is none of the above (a method with a null or object
    /// id, both `result` and `error`, neither).
    Invalid,
}

/// One JSON-RPC message, borrowed from its body.
#[derive(Debug)]
pub struct Message<'a> {
    raw: Raw<'a>,
}

impl<'a> Message<'a> {
    fn of(raw: Raw<'a>) -> Option<Message<'a>> {
        (raw.jsonrpc.as_deref() == Some("2.0")).then_some(Message { raw })
    }

    /// What it is.
    pub fn kind(&self) -> Kind {
        let r = &self.raw;
        match (&r.method, r.id.get()) {
            (Some(_), None) => Kind::Notification,
            (Some(_), Some(id)) if Id::is_request_id(id) => Kind::Request,
            (Some(_), Some(_)) => Kind::Invalid,
            (None, Some(id)) if Id::is_response_id(id) => match (r.result.get(), r.error.get()) {
                (Some(_), None) | (None, Some(_)) => Kind::Response,
                _ => Kind::Invalid,
            },
            (None, _) => Kind::Invalid,
        }
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        self.raw.method.as_deref()
    }

    /// The id of a request (a string or a number), as written.
    pub fn request_id(&self) -> Option<Id> {
        (self.kind() == Kind::Request).then(|| Id::new(self.raw.id.get()?))?
    }

    /// `params.<key>` when it is a string (a tool's `name`, a level, a URI).
    pub fn param_str(&self, key: &str) -> Option<String> {
        let params = self.raw.params.get()?;
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(params.get()).ok()?;
        object.get(key)?.as_str().map(str::to_owned)
    }

    /// The tool a `tools/call` request calls.
    pub fn tool(&self) -> Option<String> {
        (self.method() == Some("tools/call"))
            .then(|| self.param_str("name"))
            .flatten()
    }

    /// A response's result.
    pub fn result(&self) -> Option<serde_json::Value> {
        if self.kind() != Kind::Response {
            return None;
        }
        serde_json::from_str(self.raw.result.get()?.get()).ok()
    }

    /// An error response's code and message (0 and empty when the error object lacks them).
    pub fn error(&self) -> Option<(i64, String)> {
        if self.kind() != Kind::Response {
            return None;
        }
        let error: serde_json::Value = serde_json::from_str(self.raw.error.get()?.get()).ok()?;
        Some((
            error
                .get("code")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0),
            error
                .get("message")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        ))
    }
}

/// A message id exactly as it was written: echoed byte for byte.
#[derive(Debug, Clone)]
pub struct Id(Box<RawValue>);

impl Id {
    fn new(raw: &RawValue) -> Option<Id> {
        Some(Id(RawValue::from_string(raw.get().to_owned()).ok()?))
    }

    fn is_request_id(raw: &RawValue) -> bool {
        matches!(
            raw.get().as_bytes().first(),
            Some(b'"' | b'-' | b'0'..=b'9')
        )
    }

    fn is_response_id(raw: &RawValue) -> bool {
        Self::is_request_id(raw) || raw.get() == "null"
    }

    /// The id as written (`7`, `"a"`, `1e3`).
    pub fn as_raw(&self) -> &str {
        self.0.get()
    }

    /// The raw value, for embedding in a message holdfast writes.
    pub fn raw(&self) -> &RawValue {
        &self.0
    }
}

/// The id of the one request in `body` (not a notification, a response or a batch).
pub fn request_id(body: &[u8]) -> Option<Id> {
    one(body)?.request_id()
}

/// A JSON-RPC error response to the request `id`, as text: the id written exactly as the
/// request wrote it, `data` as given.
pub fn error_reply(id: &Id, code: i64, message: &str, data: serde_json::Value) -> String {
    #[derive(serde::Serialize)]
    struct Reply<'a> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        error: Error<'a>,
    }
    #[derive(serde::Serialize)]
    struct Error<'a> {
        code: i64,
        message: &'a str,
        data: serde_json::Value,
    }
    let reply = Reply {
        jsonrpc: "2.0",
        id: id.raw(),
        error: Error {
            code,
            message,
            data,
        },
    };
    serde_json::to_string(&reply).expect("a JSON-RPC error serializes")
}

/// The longest prefix of a body [`method_scan`] searches: past it (a method after a large
/// `params`, which no SDK writes) the method is not found rather than cost a long scan.
pub const MAX_SCAN: usize = 64 * 1024;

/// The top-level `"method"` of the one message in `body`, found without parsing it: for the
/// metric label of every POST, where a parse would cost more than the rest of the label. It
/// skips nested objects, arrays and strings (a tool argument named `method` is not it) and
/// gives up on a name with escapes (no spec name has one), a batch, or past [`MAX_SCAN`]. It
/// agrees with [`read`] on every message it finds a method in (`tests` below).
pub fn method_scan(body: &[u8]) -> Option<&[u8]> {
    let body = &body[..body.len().min(MAX_SCAN)];
    let mut i = skip_ws(body, 0);
    if body.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut depth = 1usize;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let end = string_end(body, i + 1)?;
                let text = &body[i + 1..end];
                i = end + 1;
                if depth == 1 && text == b"method" {
                    let colon = skip_ws(body, i);
                    if body.get(colon) == Some(&b':') {
                        let open = skip_ws(body, colon + 1);
                        if body.get(open) != Some(&b'"') {
                            return None;
                        }
                        let close = string_end(body, open + 1)?;
                        let value = &body[open + 1..close];
                        return (!value.contains(&b'\\')).then_some(value);
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return None;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// Index of the quote closing the string whose content starts at `from`.
fn string_end(body: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', body.get(from..)?)?;
        if body[at] == b'"' {
            return Some(at);
        }
        // An escape: the next byte is part of it, whatever it is.
        from = at + 2;
    }
}

fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while body.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests;
