//! Which MCP requests are safe to send twice.
//!
//! A request that failed after it may have reached the application (a reset or an EOF after it
//! was sent, before any response byte) is answered 502 and never sent again: the application may
//! have executed it. Some requests are safe to send again all the same, because executing them
//! twice changes nothing:
//!
//! - the read-only JSON-RPC methods ([`READ_ONLY_METHODS`]);
//! - `tools/call` of a tool the server announced, in a `tools/list` answer that passed through
//!   holdfast, with `annotations.readOnlyHint: true` or `annotations.idempotentHint: true`
//!   (learned per upstream: holdfast has one);
//! - `tools/call` of a tool named in `retry.idempotent_tools`.
//!
//! `retry.never_tools` names tools that are never sent twice, whatever their annotations say.
//! Notifications (no id, no answer to wait for) and batches are never judged safe.
//!
//! The method and tool name come from the kept copy of the request body; the 2026-07-28
//! `Mcp-Method` and `Mcp-Name` headers, when the client sends them, must agree with it (a
//! server older than that revision does not check them, so a header alone proves nothing).
//! They alone are enough to spot a `tools/list` whose answer to learn from. What is learned is
//! kept per Host (behind a router, different Hosts are different servers, and one's `update`
//! is not the other's). Nothing here runs for an ordinary request: judging runs only after an
//! ambiguous failure, and learning only for the answer to a `tools/list`.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use http::header::{HeaderMap, HeaderValue};
use serde_json::Value;

/// The 2026-07-28 request headers (named once, in `src/http1/names.rs`).
pub use crate::http1::names::{MCP_METHOD, MCP_NAME};

/// JSON-RPC methods that only read: sending one twice has no further effect. The last two are
/// the final 2026-07-28 revision's: `server/discover` (what replaced the handshake) and
/// `subscriptions/listen` (a stream of notifications, which a broken stream's client must issue
/// again anyway).
pub const READ_ONLY_METHODS: [&str; 10] = [
    "ping",
    "tools/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "server/discover",
    "subscriptions/listen",
];

const TOOLS_CALL: &str = "tools/call";

/// Most tool names remembered from `tools/list` answers: memory stays bounded whatever a server
/// announces. Past it, new names are not learned (and so not sent twice).
const MAX_LEARNED_TOOLS: usize = 4096;

/// The spec's longest tool name.
const MAX_TOOL_NAME: usize = 128;

/// Most bytes of `tools/list` answers copied for learning at once, over every answer in
/// flight; past it an answer streams through unread.
const MAX_LEARNING_BYTES: usize = 8 * 1024 * 1024;

/// Why a request is safe to send twice. A bounded set: it is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafeKind {
    /// One of [`READ_ONLY_METHODS`].
    ReadOnlyMethod,
    /// A tool the server announced as read-only or idempotent.
    AnnotatedTool,
    /// A tool named in `retry.idempotent_tools`.
    ConfiguredTool,
}

/// What holdfast knows about repeating requests to its upstream.
#[derive(Debug)]
pub struct Idempotency {
    enabled: bool,
    learn: bool,
    configured: HashSet<String>,
    never: HashSet<String>,
    /// (Host, tool name) → whether its latest announcement marked it read-only or idempotent.
    learned: RwLock<HashMap<(Option<HeaderValue>, String), bool>>,
    /// Bytes copied from `tools/list` answers in flight, for learning.
    learning: std::sync::atomic::AtomicUsize,
}

/// A request's JSON-RPC method and, for `tools/call`, its tool.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    method: String,
    tool: Option<String>,
}

impl Idempotency {
    /// From validated `[retry]`: on or off, whether to learn from annotations, the tools said
    /// to be safe, and the tools never sent twice.
    pub fn new(enabled: bool, learn: bool, configured: &[String], never: &[String]) -> Self {
        Self {
            enabled,
            learn,
            configured: configured.iter().cloned().collect(),
            never: never.iter().cloned().collect(),
            learned: RwLock::new(HashMap::new()),
            learning: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The same with new settings (a reload), keeping what was learned from annotations.
    pub fn reconfigured(
        &self,
        enabled: bool,
        learn: bool,
        configured: &[String],
        never: &[String],
    ) -> Self {
        let fresh = Self::new(enabled, learn, configured, never);
        *fresh.learned.write().expect("learned lock") =
            self.learned.read().expect("learned lock").clone();
        fresh
    }

    /// Whether `tools/list` answers are read for annotations at all.
    pub fn learns(&self) -> bool {
        self.enabled && self.learn
    }

    /// Reserves `bytes` of the learning copies' budget; false when it is spent.
    pub fn reserve_learning(&self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering;
        if self.learning.fetch_add(bytes, Ordering::AcqRel) + bytes > MAX_LEARNING_BYTES {
            self.learning.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back what a learning copy reserved.
    pub fn release_learning(&self, bytes: usize) {
        self.learning
            .fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether ambiguous failures of safe requests are sent again at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the request (its complete `body`, and the `headers` it went with to `host`) is
    /// safe to send twice, and why. Without the body nothing is.
    pub fn judge(
        &self,
        host: Option<&HeaderValue>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<SafeKind> {
        if !self.enabled {
            return None;
        }
        let call = from_body(body)?;
        // Headers that say something else than the body: a client (or a server) confused about
        // what this request is. Not safe to guess.
        if let Some(said) = from_headers(headers) {
            let name_agrees = match (&said.tool, &call.tool) {
                (Some(said), Some(body)) => said == body,
                (Some(_), None) => false,
                (None, _) => true,
            };
            if said.method != call.method || !name_agrees {
                return None;
            }
        }
        if READ_ONLY_METHODS.contains(&call.method.as_str()) {
            return Some(SafeKind::ReadOnlyMethod);
        }
        if call.method != TOOLS_CALL {
            return None;
        }
        let tool = call.tool?;
        if self.never.contains(&tool) {
            return None;
        }
        if self.configured.contains(&tool) {
            return Some(SafeKind::ConfiguredTool);
        }
        let learned = self.learned.read().expect("learned tools lock");
        learned
            .get(&(host.cloned(), tool))
            .copied()
            .unwrap_or(false)
            .then_some(SafeKind::AnnotatedTool)
    }

    /// Learns from a complete `tools/list` answer body (`application/json`, or the events of a
    /// `text/event-stream`) of the server behind `host`. Returns how many tools it announced.
    pub fn learn_from(&self, host: Option<&HeaderValue>, is_sse: bool, body: &[u8]) -> usize {
        let crate::session::rpc::Reply::Result(result) = crate::session::rpc::reply(is_sse, body)
        else {
            return 0;
        };
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return 0;
        };
        let mut learned = self.learned.write().expect("learned tools lock");
        let mut announced = 0;
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            if name.is_empty() || name.len() > MAX_TOOL_NAME {
                continue;
            }
            announced += 1;
            let hint = |key: &str| {
                tool.get("annotations")
                    .and_then(|a| a.get(key))
                    .and_then(Value::as_bool)
                    == Some(true)
            };
            let safe = hint("readOnlyHint") || hint("idempotentHint");
            let full = learned.len() >= MAX_LEARNED_TOOLS;
            let key = (host.cloned(), name.to_owned());
            match learned.get_mut(&key) {
                Some(known) => *known = safe,
                None if !full => {
                    learned.insert(key, safe);
                }
                None => {
                    tracing::debug!(
                        limit = MAX_LEARNED_TOOLS,
                        "too many tools to remember; this one is never sent twice"
                    );
                }
            }
        }
        announced
    }

    /// Whether `name` is a tool holdfast knows by name: configured (`retry.idempotent_tools`,
    /// `retry.never_tools`) or learned from the `tools/list` of the server behind `host`. A
    /// bounded set (at most 4096 learned), so a name from it may be logged as it is.
    pub fn knows_tool(&self, host: Option<&HeaderValue>, name: &str) -> bool {
        if self.configured.contains(name) || self.never.contains(name) {
            return true;
        }
        let learned = self.learned.read().expect("learned tools lock");
        learned.contains_key(&(host.cloned(), name.to_owned()))
    }

    /// Tools learned so far (for tests).
    pub fn learned(&self) -> usize {
        self.learned.read().expect("learned tools lock").len()
    }
}

impl SafeKind {
    /// The `kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SafeKind::ReadOnlyMethod => "read_only_method",
            SafeKind::AnnotatedTool => "annotated_tool",
            SafeKind::ConfiguredTool => "configured_tool",
        }
    }
}

/// The call as the 2026-07-28 headers name it.
fn from_headers(headers: &HeaderMap) -> Option<Call> {
    let method = headers.get(MCP_METHOD)?.to_str().ok()?.to_owned();
    let tool = headers
        .get(MCP_NAME)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(Call { method, tool })
}

/// The call in a body: one JSON-RPC request (`crate::jsonrpc`: a string or number id). A
/// notification, a batch, a null id or anything that does not parse is none.
fn from_body(body: &[u8]) -> Option<Call> {
    let message = crate::jsonrpc::one(body)?;
    message.request_id()?;
    Some(Call {
        method: message.method()?.to_owned(),
        tool: message.param_str("name"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn safety(idempotent: &[&str], never: &[&str]) -> Idempotency {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Idempotency::new(true, true, &names(idempotent), &names(never))
    }

    fn call(tool: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        )
    }

    const TOOLS: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
        {"name":"lookup","inputSchema":{},"annotations":{"readOnlyHint":true}},
        {"name":"put","inputSchema":{},"annotations":{"idempotentHint":true,"destructiveHint":true}},
        {"name":"charge","inputSchema":{},"annotations":{"readOnlyHint":false}},
        {"name":"plain","inputSchema":{}}
    ]}}"#;

    /// Memory stays bounded whatever a server announces: past 4096 tools, new names are not
    /// learned (so not sent twice), while the ones already known still change with the latest
    /// announcement.
    #[test]
    fn at_most_4096_tools_are_remembered() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        let tools: Vec<String> = (0..MAX_LEARNED_TOOLS + 10)
            .map(|n| {
                format!(
                    r#"{{"name":"t{n}","inputSchema":{{}},"annotations":{{"readOnlyHint":true}}}}"#
                )
            })
            .collect();
        let list = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[{}]}}}}"#,
            tools.join(",")
        );
        assert_eq!(
            safety.learn_from(None, false, list.as_bytes()),
            MAX_LEARNED_TOOLS + 10,
            "every tool is counted as announced"
        );
        assert_eq!(safety.learned(), MAX_LEARNED_TOOLS);
        let first = call("t0");
        let past = call(&format!("t{}", MAX_LEARNED_TOOLS + 1));
        assert_eq!(
            safety.judge(None, &none, first.as_bytes()),
            Some(SafeKind::AnnotatedTool)
        );
        assert_eq!(safety.judge(None, &none, past.as_bytes()), None);
        // A known tool announced again without the hint is no longer safe, even when full.
        let again =
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"t0","inputSchema":{}}]}}"#;
        safety.learn_from(None, false, again.as_bytes());
        assert_eq!(safety.judge(None, &none, first.as_bytes()), None);
    }

    #[test]
    fn read_only_methods_are_safe_and_others_are_not() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        for method in READ_ONLY_METHODS {
            let body = format!(r#"{{"jsonrpc":"2.0","id":"a","method":"{method}"}}"#);
            assert_eq!(
                safety.judge(None, &none, body.as_bytes()),
                Some(SafeKind::ReadOnlyMethod),
                "{method}"
            );
        }
        for body in [
            // A notification: no id.
            r#"{"jsonrpc":"2.0","method":"ping"}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.to_string(),
            // A batch, even of safe requests.
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.to_string(),
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{}}"#.to_string(),
            "not json".to_string(),
            // A tool nobody said anything about.
            call("plain"),
        ] {
            assert_eq!(safety.judge(None, &none, body.as_bytes()), None, "{body}");
        }
    }

    #[test]
    fn tools_are_learned_from_their_annotations() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        assert_eq!(safety.judge(None, &none, call("lookup").as_bytes()), None);
        assert_eq!(safety.learn_from(None, false, TOOLS.as_bytes()), 4);
        for (tool, expected) in [
            ("lookup", Some(SafeKind::AnnotatedTool)),
            ("put", Some(SafeKind::AnnotatedTool)),
            ("charge", None),
            ("plain", None),
            ("unknown", None),
        ] {
            assert_eq!(
                safety.judge(None, &none, call(tool).as_bytes()),
                expected,
                "{tool}"
            );
        }
        // A later announcement without the hint takes it back.
        let again =
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"lookup","inputSchema":{}}]}}"#;
        assert_eq!(safety.learn_from(None, false, again.as_bytes()), 1);
        assert_eq!(safety.judge(None, &none, call("lookup").as_bytes()), None);
    }

    #[test]
    fn an_sse_answer_teaches_too() {
        let safety = safety(&[], &[]);
        let sse = format!(
            "id: 0\ndata: \n\nevent: message\ndata: {}\n\n",
            TOOLS.replace('\n', "")
        );
        assert_eq!(safety.learn_from(None, true, sse.as_bytes()), 4);
        assert_eq!(
            safety.judge(None, &HeaderMap::new(), call("lookup").as_bytes()),
            Some(SafeKind::AnnotatedTool)
        );
        // An error answer teaches nothing.
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#;
        assert_eq!(safety.learn_from(None, false, error), 0);
    }

    #[test]
    fn configuration_adds_and_removes_tools() {
        let safety = safety(&["plain"], &["lookup"]);
        safety.learn_from(None, false, TOOLS.as_bytes());
        let none = HeaderMap::new();
        assert_eq!(
            safety.judge(None, &none, call("plain").as_bytes()),
            Some(SafeKind::ConfiguredTool)
        );
        // Never, whatever the server announced.
        assert_eq!(safety.judge(None, &none, call("lookup").as_bytes()), None);
    }

    #[test]
    fn the_2026_headers_must_agree_with_the_body() {
        let safety = safety(&[], &[]);
        safety.learn_from(None, false, TOOLS.as_bytes());
        let headers = |method: &'static str, name: Option<&'static str>| {
            let mut h = HeaderMap::new();
            h.insert(MCP_METHOD, HeaderValue::from_static(method));
            if let Some(name) = name {
                h.insert(MCP_NAME, HeaderValue::from_static(name));
            }
            h
        };
        let put = call("put");
        assert_eq!(
            safety.judge(None, &headers("tools/call", Some("put")), put.as_bytes()),
            Some(SafeKind::AnnotatedTool)
        );
        // A header that names a safe method or tool does not make the body's call safe.
        let charge = call("charge");
        for h in [
            headers("ping", None),
            headers("tools/call", Some("lookup")),
            headers("resources/read", None),
        ] {
            assert_eq!(safety.judge(None, &h, charge.as_bytes()), None, "{h:?}");
        }
        // Nor the other way round: a safe body under headers that say something else.
        assert_eq!(
            safety.judge(None, &headers("tools/call", Some("charge")), put.as_bytes()),
            None
        );
    }

    #[test]
    fn what_is_learned_is_the_announcing_hosts_own() {
        let safety = safety(&[], &[]);
        let (a, b) = (
            HeaderValue::from_static("a.example"),
            HeaderValue::from_static("b.example"),
        );
        safety.learn_from(Some(&a), false, TOOLS.as_bytes());
        let none = HeaderMap::new();
        let put = call("put");
        assert_eq!(
            safety.judge(Some(&a), &none, put.as_bytes()),
            Some(SafeKind::AnnotatedTool)
        );
        assert_eq!(
            safety.judge(Some(&b), &none, put.as_bytes()),
            None,
            "b never said so"
        );
    }

    #[test]
    fn learning_copies_share_one_budget() {
        let safety = safety(&[], &[]);
        assert!(safety.reserve_learning(MAX_LEARNING_BYTES));
        assert!(!safety.reserve_learning(1));
        safety.release_learning(MAX_LEARNING_BYTES);
        assert!(safety.reserve_learning(1));
    }

    #[test]
    fn off_means_nothing_is_safe_or_learned() {
        let safety = Idempotency::new(false, true, &["plain".to_string()], &[]);
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(safety.judge(None, &HeaderMap::new(), ping), None);
        assert!(!safety.learns());
    }
}
