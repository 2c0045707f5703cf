//! Which MCP method a POST carries, for `holdfast_mcp_requests_total{method}`.
//!
//! The label set is bounded: the methods a client sends a server in the MCP specification
//! (2025-11-25, and the final 2026-07-28 revision's `server/discover` and
//! `subscriptions/listen`), plus `other` for anything else — a method
//! the spec does not name, a JSON-RPC response (a client answering a server's request), a
//! batch, a body that is not JSON, or one holdfast did not keep (larger than
//! `hold.max_body_bytes`). A client-chosen string never becomes a label.
//!
//! The method comes from the 2026-07-28 `Mcp-Method` header when the client sends it, else from
//! the kept copy of the body. Reading the body is a scan for the top-level `"method"` key, not
//! a parse: every SDK writes it before `params`, so the scan stops within the first few dozen
//! bytes, and an ordinary request pays no JSON parse for a metric.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// A bounded MCP method name.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum McpMethod {
    Initialize,
    Ping,
    ToolsList,
    ToolsCall,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    PromptsList,
    PromptsGet,
    CompletionComplete,
    LoggingSetLevel,
    TasksGet,
    TasksResult,
    TasksList,
    TasksCancel,
    NotificationsInitialized,
    NotificationsCancelled,
    NotificationsProgress,
    NotificationsRootsListChanged,
    /// 2026-07-28: what replaced the handshake.
    ServerDiscover,
    /// 2026-07-28: the long SSE stream that replaced the GET stream.
    SubscriptionsListen,
    /// Anything else (see the module documentation).
    Other,
}

impl McpMethod {
    /// Every value, `Other` last: pre-created series and counter slots follow this order.
    pub const ALL: [McpMethod; 24] = [
        McpMethod::Initialize,
        McpMethod::Ping,
        McpMethod::ToolsList,
        McpMethod::ToolsCall,
        McpMethod::ResourcesList,
        McpMethod::ResourcesTemplatesList,
        McpMethod::ResourcesRead,
        McpMethod::ResourcesSubscribe,
        McpMethod::ResourcesUnsubscribe,
        McpMethod::PromptsList,
        McpMethod::PromptsGet,
        McpMethod::CompletionComplete,
        McpMethod::LoggingSetLevel,
        McpMethod::TasksGet,
        McpMethod::TasksResult,
        McpMethod::TasksList,
        McpMethod::TasksCancel,
        McpMethod::NotificationsInitialized,
        McpMethod::NotificationsCancelled,
        McpMethod::NotificationsProgress,
        McpMethod::NotificationsRootsListChanged,
        McpMethod::ServerDiscover,
        McpMethod::SubscriptionsListen,
        McpMethod::Other,
    ];

    /// The method's name as the spec spells it (`other` for [`McpMethod::Other`]).
    pub fn as_str(self) -> &'static str {
        match self {
            McpMethod::Initialize => "initialize",
            McpMethod::Ping => "ping",
            McpMethod::ToolsList => "tools/list",
            McpMethod::ToolsCall => "tools/call",
            McpMethod::ResourcesList => "resources/list",
            McpMethod::ResourcesTemplatesList => "resources/templates/list",
            McpMethod::ResourcesRead => "resources/read",
            McpMethod::ResourcesSubscribe => "resources/subscribe",
            McpMethod::ResourcesUnsubscribe => "resources/unsubscribe",
            McpMethod::PromptsList => "prompts/list",
            McpMethod::PromptsGet => "prompts/get",
            McpMethod::CompletionComplete => "completion/complete",
            McpMethod::LoggingSetLevel => "logging/setLevel",
            McpMethod::TasksGet => "tasks/get",
            McpMethod::TasksResult => "tasks/result",
            McpMethod::TasksList => "tasks/list",
            McpMethod::TasksCancel => "tasks/cancel",
            McpMethod::NotificationsInitialized => "notifications/initialized",
            McpMethod::NotificationsCancelled => "notifications/cancelled",
            McpMethod::NotificationsProgress => "notifications/progress",
            McpMethod::NotificationsRootsListChanged => "notifications/roots/list_changed",
            McpMethod::ServerDiscover => "server/discover",
            McpMethod::SubscriptionsListen => "subscriptions/listen",
            McpMethod::Other => "other",
        }
    }

    /// The method named exactly `name`, or `Other`.
    pub fn from_name(name: &[u8]) -> McpMethod {
        McpMethod::ALL[..McpMethod::ALL.len() - 1]
            .iter()
            .copied()
            .find(|m| m.as_str().as_bytes() == name)
            .unwrap_or(McpMethod::Other)
    }

    /// The method of the one JSON-RPC message in `body`: its top-level `"method"` member, found
    /// by the reader's fast scan ([`crate::jsonrpc::method_scan`]).
    pub fn of_body(body: &[u8]) -> McpMethod {
        crate::jsonrpc::method_scan(body).map_or(McpMethod::Other, McpMethod::from_name)
    }
}

impl EncodeLabelValue for McpMethod {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::McpMethod::{self, *};

    fn of(body: &str) -> McpMethod {
        McpMethod::of_body(body.as_bytes())
    }

    #[test]
    fn every_name_round_trips_and_other_is_not_a_name() {
        for m in McpMethod::ALL {
            let expected = if m == Other { Other } else { m };
            assert_eq!(McpMethod::from_name(m.as_str().as_bytes()), expected);
        }
        // The final 2026-07-28 revision's methods are known, not `other`.
        assert_eq!(
            of(r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#),
            ServerDiscover
        );
        assert_eq!(
            McpMethod::from_name(b"subscriptions/listen"),
            SubscriptionsListen
        );
        assert_eq!(McpMethod::from_name(b"other"), Other);
        assert_eq!(McpMethod::from_name(b"tools/CALL"), Other);
        assert_eq!(McpMethod::from_name(b""), Other);
    }

    #[test]
    fn the_top_level_method_is_found_wherever_it_stands() {
        assert_eq!(
            of(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#),
            ToolsCall
        );
        // After params, and params holding a "method" of their own at every depth.
        assert_eq!(
            of(
                r#"{"params":{"method":"ping","a":[{"method":"initialize"}]},"method":"tools/list","id":2}"#
            ),
            ToolsList
        );
        // Strings that look like structure, and escaped quotes, are skipped whole.
        assert_eq!(
            of(r#"{"id":"{\"method\":\"ping\"}","x":"]}","method":"prompts/get"}"#),
            PromptsGet
        );
        assert_eq!(
            of(" \n{ \"method\" :\t\"notifications/initialized\" }"),
            NotificationsInitialized
        );
        // A method's name in an argument is not the method (a tools/list is what the proxy
        // reads an answer for tool annotations after).
        assert_eq!(
            of(
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"tools/list"}}}"#
            ),
            ToolsCall
        );
    }

    #[test]
    fn what_is_not_one_spec_method_is_other() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"vendor/secret-name"}"#,
            r#"{"method":"tools\/call"}"#,
            r#"{"method":7}"#,
            r#"{"params":{"method":"ping"}}"#,
            r#"{"method":"ping"#,
            "not json",
            "",
        ] {
            assert_eq!(of(body), Other, "{body}");
        }
    }
}
