//! The access log (`access_log = true`, target `holdfast::access`): one line per request, and
//! one more when an event stream ends.
//!
//! A request's line is written once its answer is known whole: for an ordinary answer when its
//! body has been sent (or the client went away during it), so that it can say how many bytes
//! went out; for an event stream at once, with its head, because a stream may last for hours,
//! and its end gets a line of its own (how long it lived, how many events, why it ended). A
//! request answered by nothing (its client went away, holdfast's drain cut it) is written when
//! its future is dropped. Every line carries the request's id, by which the server's, the
//! router's and holdfast's lines about one request are joined.
//!
//! Nothing here reads more than the proxy read anyway: the client's address comes from the
//! peer and the `X-Forwarded-For` a trusted proxy wrote, the MCP method from what the metrics
//! read, the tool's name only when the tool is one holdfast knows by name (a bounded set).
//! Never a query, a header's value or a body.

use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::{request_id, Note};
use crate::config::TrustedProxies;
use crate::idempotent::Idempotency;
use crate::mcp_method::McpMethod;
use crate::replay::BodyHandle;

/// What the access log knows of a request as it arrives.
pub(super) struct Entry {
    /// Its id (src/proxy/request_id.rs).
    id: HeaderValue,
    /// Its path, never its query (a query may carry tokens).
    path: String,
    /// The client, after the trusted proxies in front ([`client_addr`]).
    client: IpAddr,
}

/// What the request's body and headers told, found by the exchange once it was answered.
#[derive(Debug, Default)]
pub struct Described {
    /// The MCP method of a POST.
    pub mcp: Option<McpMethod>,
    /// The tool a `tools/call` called: its name when holdfast knows the tool by name
    /// ([`Idempotency::knows_tool`]), `other` otherwise.
    pub tool: Option<Box<str>>,
    /// Request body bytes read from the client by the time the answer's head was ready.
    pub bytes_in: u64,
}

/// The tool name logged for a tool holdfast does not know by name: a client's string never
/// reaches the log unbounded.
const OTHER_TOOL: &str = "other";

impl Described {
    /// What the exchange tells of a request: its MCP method (`mcp`, a POST's), and for a
    /// `tools/call` its tool, from the 2026-07-28 `Mcp-Name` header or the kept body.
    pub(super) fn of(
        mcp: Option<McpMethod>,
        handle: &BodyHandle,
        headers: &HeaderMap,
        idempotency: &Idempotency,
    ) -> Box<Described> {
        let tool = (mcp == Some(McpMethod::ToolsCall)).then(|| {
            let named = match headers.get(crate::idempotent::MCP_NAME) {
                Some(name) => name.to_str().ok().map(str::to_owned),
                None => handle
                    .with_complete_body(crate::jsonrpc::call_tool_name)
                    .flatten(),
            };
            let host = headers.get(http::header::HOST);
            match named {
                Some(name) if idempotency.knows_tool(host, &name) => name.into_boxed_str(),
                _ => OTHER_TOOL.into(),
            }
        });
        Box::new(Described {
            mcp,
            tool,
            bytes_in: handle.bytes_read(),
        })
    }
}

impl Entry {
    /// The entry of a request from `client` (after the trusted proxies, [`client_addr`]).
    pub(super) fn new(id: HeaderValue, uri: &http::Uri, client: IpAddr) -> Box<Entry> {
        Box::new(Entry {
            id,
            path: uri.path().to_owned(),
            client,
        })
    }

    /// Writes the line of a request that got no answer (its client went away, or holdfast's
    /// drain cut it).
    pub(super) fn unanswered(
        &self,
        method: &http::Method,
        status: u16,
        note: &Note,
        took: Duration,
    ) {
        self.write(method, status, note, took, None, None);
    }

    /// The line of an answered request: written now for an event stream (whose end gets a
    /// line of its own, [`Tail::write`]), else when its body has been sent.
    pub(super) fn answered(
        self: Box<Self>,
        method: &http::Method,
        status: u16,
        note: &Note,
        took: Duration,
        described: Option<Box<Described>>,
        is_sse: bool,
    ) -> Tail {
        if is_sse {
            self.write(method, status, note, took, described.as_deref(), None);
            return Tail::Stream(self);
        }
        Tail::Line(Box::new((
            self,
            Line {
                method: method.clone(),
                status,
                upstream_status: note.upstream_status.map(|s| s.as_u16()),
                action: note.action,
                took,
                described,
            },
        )))
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        method: &http::Method,
        status: u16,
        note: &Note,
        took: Duration,
        described: Option<&Described>,
        bytes_out: Option<u64>,
    ) {
        tracing::info!(
            target: "holdfast::access",
            request_id = request_id::as_str(&self.id),
            client = %self.client,
            method = %method,
            path = self.path,
            status,
            upstream_status = note.upstream_status.map(|s| s.as_u16()),
            action = note.action.as_str(),
            mcp_method = described.and_then(|d| d.mcp).map(McpMethod::as_str),
            tool = described.and_then(|d| d.tool.as_deref()),
            bytes_in = described.map_or(0, |d| d.bytes_in),
            bytes_out,
            duration_ms = millis(took),
        );
    }
}

/// Microsecond resolution is all a log reader needs: 1.009, not 1.0088169999.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The client of a request from `peer`: the peer itself, unless it is a trusted proxy
/// (`forwarded.trusted_proxies`); then the `X-Forwarded-For` entries it sent are walked from the
/// right (the nearest hop first), past every trusted proxy, to the first address that is not
/// one: the one a proxy of the operator's own saw connect. An entry that is not an address
/// stops the walk at the last hop known (nothing left of it can be believed).
pub fn client_addr(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let mut client = peer.to_canonical();
    if !trusted.trusts(client) {
        return client;
    }
    let entries: Vec<&str> = headers
        .get_all(http::header::HeaderName::from_static("x-forwarded-for"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for entry in entries.iter().rev() {
        let Some(hop) = parse_hop(entry) else {
            return client;
        };
        client = hop;
        if !trusted.trusts(hop) {
            return hop;
        }
    }
    client
}

/// An `X-Forwarded-For` entry's address: `a.b.c.d`, an IPv6 address, either with a port
/// (`a.b.c.d:p`, `[v6]:p`) as some proxies write it.
fn parse_hop(entry: &str) -> Option<IpAddr> {
    let ip = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            let bare = entry.strip_prefix('[')?.strip_suffix(']')?;
            bare.parse().ok()
        })?;
    Some(ip.to_canonical())
}

/// A request's line, written when its body ends.
pub(super) struct Line {
    method: http::Method,
    status: u16,
    upstream_status: Option<u16>,
    action: super::Action,
    took: Duration,
    described: Option<Box<Described>>,
}

/// How an event stream ended, as its line says.
pub(super) struct StreamEnded {
    /// Why (src/proxy/sent.rs names the reasons).
    pub reason: &'static str,
    pub events: u64,
    pub lived: Duration,
}

/// What is written when the answer's body ends.
pub(super) enum Tail {
    Line(Box<(Box<Entry>, Line)>),
    /// An event stream's end.
    Stream(Box<Entry>),
}

impl Tail {
    /// Writes the line: `bytes_out` went to the client; `stream`: how the event stream ended.
    pub(super) fn write(self, bytes_out: u64, stream: Option<&StreamEnded>) {
        match self {
            Tail::Line(line) => {
                let (entry, line) = *line;
                let note = Note {
                    upstream_status: line
                        .upstream_status
                        .and_then(|s| http::StatusCode::from_u16(s).ok()),
                    action: line.action,
                };
                let described = line.described.as_deref();
                let (method, status) = (&line.method, line.status);
                entry.write(method, status, &note, line.took, described, Some(bytes_out));
            }
            Tail::Stream(entry) => {
                let Some(stream) = stream else { return };
                tracing::info!(
                    target: "holdfast::access",
                    request_id = request_id::as_str(&entry.id),
                    client = %entry.client,
                    path = entry.path,
                    reason = stream.reason,
                    events = stream.events,
                    bytes_out,
                    duration_ms = millis(stream.lived),
                    "event stream ended"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies::for_tests(list)
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let t = trusted(&["10.0.0.0/8"]);
        let h = xff(&["1.2.3.4"]);
        assert_eq!(client_addr(ip("192.0.2.9"), &h, &t), ip("192.0.2.9"));
        assert_eq!(
            client_addr(ip("192.0.2.9"), &h, &trusted(&[])),
            ip("192.0.2.9")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_first_untrusted_hop_from_the_right_is_the_client() {
        let t = trusted(&["10.0.0.0/8", "fd00::/8"]);
        // A client's own claim (6.6.6.6) sits left of the address the proxy saw: not believed.
        let h = xff(&["6.6.6.6, 203.0.113.5", "10.1.1.1"]);
        assert_eq!(client_addr(ip("10.0.0.2"), &h, &t), ip("203.0.113.5"));
        // Ports and brackets as some proxies write them; an IPv4 peer on an IPv6 socket.
        let h = xff(&["[2001:db8::1]:4711", "10.2.2.2:80"]);
        assert_eq!(
            client_addr(ip("::ffff:10.0.0.2"), &h, &t),
            ip("2001:db8::1")
        );
        let h = xff(&["203.0.113.7:5555"]);
        assert_eq!(client_addr(ip("fd00::1"), &h, &t), ip("203.0.113.7"));
    }

    #[test]
    fn every_hop_trusted_or_a_bad_entry_stops_at_the_last_known_hop() {
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(
            client_addr(ip("10.0.0.2"), &xff(&["10.9.9.9"]), &t),
            ip("10.9.9.9")
        );
        assert_eq!(
            client_addr(ip("10.0.0.2"), &HeaderMap::new(), &t),
            ip("10.0.0.2")
        );
        let h = xff(&["1.2.3.4, unknown, 10.3.3.3"]);
        assert_eq!(client_addr(ip("10.0.0.2"), &h, &t), ip("10.3.3.3"));
    }
}
