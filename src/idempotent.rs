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
//! The method and tool name come from the 2026-07-28 `Mcp-Method` and `Mcp-Name` headers when
//! the client sends them, else from the kept copy of the request body. Nothing here runs for an
//! ordinary request: judging runs only after an ambiguous failure, and learning only for the
//! answer to a `tools/list`.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use http::header::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::Value;

/// The 2026-07-28 header naming a request's JSON-RPC method.
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");

/// The 2026-07-28 header naming the tool (prompt, resource) a request is about.
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// JSON-RPC methods that only read: sending one twice has no further effect.
pub const READ_ONLY_METHODS: [&str; 8] = [
    "ping",
    "tools/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

/// The method whose answers teach which tools are safe.
pub const TOOLS_LIST: &str = "tools/list";

const TOOLS_CALL: &str = "tools/call";

/// Most tool names remembered from `tools/list` answers: memory stays bounded whatever a server
/// announces. Past it, new names are not learned (and so not sent twice).
const MAX_LEARNED_TOOLS: usize = 4096;

/// The spec's longest tool name.
const MAX_TOOL_NAME: usize = 128;

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
    /// Tool name → whether its latest announcement marked it read-only or idempotent.
    learned: RwLock<HashMap<String, bool>>,
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
        }
    }

    /// Whether ambiguous failures of safe requests are sent again at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the request (`headers`, and its complete body when kept) is safe to send twice,
    /// and why.
    pub fn judge(&self, headers: &HeaderMap, body: Option<&[u8]>) -> Option<SafeKind> {
        if !self.enabled {
            return None;
        }
        let call = from_headers(headers).or_else(|| body.and_then(from_body))?;
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
            .get(&tool)
            .copied()
            .unwrap_or(false)
            .then_some(SafeKind::AnnotatedTool)
    }

    /// Whether the answer to this request should be read for tool annotations: the request is a
    /// `tools/list`. Cheap for every other request: the header, or one substring search of the
    /// kept body before any parse.
    pub fn is_tools_list(&self, headers: &HeaderMap, body: Option<&[u8]>) -> bool {
        if !(self.enabled && self.learn) {
            return false;
        }
        if let Some(method) = headers.get(MCP_METHOD) {
            return method.as_bytes() == TOOLS_LIST.as_bytes();
        }
        let Some(body) = body else {
            return false;
        };
        memchr::memmem::find(body, TOOLS_LIST.as_bytes()).is_some()
            && from_body(body).is_some_and(|c| c.method == TOOLS_LIST)
    }

    /// Learns from a complete `tools/list` answer body (`application/json`, or the events of a
    /// `text/event-stream`). Returns how many tools it announced.
    pub fn learn_from(&self, is_sse: bool, body: &[u8]) -> usize {
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
            match learned.get_mut(name) {
                Some(known) => *known = safe,
                None if !full => {
                    learned.insert(name.to_owned(), safe);
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

/// The call in a body: one JSON-RPC request with an id. A notification, a batch or anything
/// that does not parse is none.
fn from_body(body: &[u8]) -> Option<Call> {
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        id: Option<Value>,
        params: Option<Params<'a>>,
    }
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        name: Option<std::borrow::Cow<'a, str>>,
    }
    let request: Request<'_> = serde_json::from_slice(body).ok()?;
    // `"id": null` is not a request id holdfast can rely on either.
    if request.id.is_none_or(|id| id.is_null()) {
        return None;
    }
    Some(Call {
        method: request.method.into_owned(),
        tool: request
            .params
            .and_then(|p| p.name)
            .map(std::borrow::Cow::into_owned),
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

    #[test]
    fn read_only_methods_are_safe_and_others_are_not() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        for method in READ_ONLY_METHODS {
            let body = format!(r#"{{"jsonrpc":"2.0","id":"a","method":"{method}"}}"#);
            assert_eq!(
                safety.judge(&none, Some(body.as_bytes())),
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
            assert_eq!(safety.judge(&none, Some(body.as_bytes())), None, "{body}");
        }
        assert_eq!(safety.judge(&none, None), None);
    }

    #[test]
    fn tools_are_learned_from_their_annotations() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        assert_eq!(safety.judge(&none, Some(call("lookup").as_bytes())), None);
        assert_eq!(safety.learn_from(false, TOOLS.as_bytes()), 4);
        for (tool, expected) in [
            ("lookup", Some(SafeKind::AnnotatedTool)),
            ("put", Some(SafeKind::AnnotatedTool)),
            ("charge", None),
            ("plain", None),
            ("unknown", None),
        ] {
            assert_eq!(
                safety.judge(&none, Some(call(tool).as_bytes())),
                expected,
                "{tool}"
            );
        }
        // A later announcement without the hint takes it back.
        let again =
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"lookup","inputSchema":{}}]}}"#;
        assert_eq!(safety.learn_from(false, again.as_bytes()), 1);
        assert_eq!(safety.judge(&none, Some(call("lookup").as_bytes())), None);
    }

    #[test]
    fn an_sse_answer_teaches_too() {
        let safety = safety(&[], &[]);
        let sse = format!(
            "id: 0\ndata: \n\nevent: message\ndata: {}\n\n",
            TOOLS.replace('\n', "")
        );
        assert_eq!(safety.learn_from(true, sse.as_bytes()), 4);
        assert_eq!(
            safety.judge(&HeaderMap::new(), Some(call("lookup").as_bytes())),
            Some(SafeKind::AnnotatedTool)
        );
        // An error answer teaches nothing.
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#;
        assert_eq!(safety.learn_from(false, error), 0);
    }

    #[test]
    fn configuration_adds_and_removes_tools() {
        let safety = safety(&["plain"], &["lookup"]);
        safety.learn_from(false, TOOLS.as_bytes());
        let none = HeaderMap::new();
        assert_eq!(
            safety.judge(&none, Some(call("plain").as_bytes())),
            Some(SafeKind::ConfiguredTool)
        );
        // Never, whatever the server announced.
        assert_eq!(safety.judge(&none, Some(call("lookup").as_bytes())), None);
    }

    #[test]
    fn headers_name_the_call_without_a_body() {
        let safety = safety(&[], &[]);
        safety.learn_from(false, TOOLS.as_bytes());
        let mut headers = HeaderMap::new();
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
        headers.insert(MCP_NAME, HeaderValue::from_static("put"));
        assert_eq!(safety.judge(&headers, None), Some(SafeKind::AnnotatedTool));
        headers.insert(MCP_METHOD, HeaderValue::from_static("resources/read"));
        assert_eq!(safety.judge(&headers, None), Some(SafeKind::ReadOnlyMethod));
        assert!(!safety.is_tools_list(&headers, None));
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/list"));
        assert!(safety.is_tools_list(&headers, None));
    }

    #[test]
    fn a_tools_list_is_recognised_from_its_body() {
        let safety = safety(&[], &[]);
        let none = HeaderMap::new();
        let list = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
        assert!(safety.is_tools_list(&none, Some(list)));
        // The name in an argument is not the method.
        let echo = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"tools/list"}}}"#;
        assert!(!safety.is_tools_list(&none, Some(echo)));
        assert!(!safety.is_tools_list(&none, None));
    }

    #[test]
    fn off_means_nothing_is_safe_or_learned() {
        let safety = Idempotency::new(false, true, &["plain".to_string()], &[]);
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(safety.judge(&HeaderMap::new(), Some(ping)), None);
        let list = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
        assert!(!safety.is_tools_list(&HeaderMap::new(), Some(list)));
    }
}
