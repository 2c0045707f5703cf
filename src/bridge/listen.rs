//! `subscriptions/listen` of a 2026-07-28 client on a 2025 session (docs/design/era-bridge.md
//! 1.3, 3.4), as pure functions: what the client asked for, what the server can honour, the
//! acknowledgement, and which of the session's GET-stream notifications reach the listen and in
//! what shape. A 2025 server sends every change of the session on one GET stream and resource
//! updates only for URIs subscribed with `resources/subscribe`; a 2026 listen asks for kinds and
//! URIs, and each notification it gets names it (`_meta` subscriptionId).

use serde_json::{json, Map, Value};

/// Most URIs one listen subscribes to (each is a `resources/subscribe` upstream); beyond, the
/// rest are not honoured (the acknowledgement says which are).
pub const MAX_URIS: usize = 64;

/// The `_meta` key naming the listen a notification belongs to.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// What a listen wants, or what the server honours of it (`SubscriptionFilter`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// URIs whose `notifications/resources/updated` are wanted.
    pub uris: Vec<String>,
}

impl Filter {
    /// The filter of a `subscriptions/listen` request's `params` (absent kinds: not wanted).
    pub fn of_request(params: Option<&Value>) -> Filter {
        let asked = params.and_then(|p| p.get("notifications"));
        let flag = |key: &str| asked.and_then(|a| a.get(key)) == Some(&Value::Bool(true));
        let uris = asked
            .and_then(|a| a.get("resourceSubscriptions"))
            .and_then(Value::as_array)
            .map(|list| {
                let mut uris: Vec<String> = list
                    .iter()
                    .filter_map(|u| u.as_str().map(str::to_owned))
                    .take(MAX_URIS)
                    .collect();
                uris.dedup();
                uris
            })
            .unwrap_or_default();
        Filter {
            tools: flag("toolsListChanged"),
            prompts: flag("promptsListChanged"),
            resources: flag("resourcesListChanged"),
            uris,
        }
    }

    /// What a server with `capabilities` (its `initialize` result's) can send of this filter:
    /// list changes of the lists it says change, URIs when it takes subscriptions.
    pub fn honoured(&self, capabilities: &Value) -> Filter {
        let has = |kind: &str, what: &str| capabilities[kind][what] == Value::Bool(true);
        Filter {
            tools: self.tools && has("tools", "listChanged"),
            prompts: self.prompts && has("prompts", "listChanged"),
            resources: self.resources && has("resources", "listChanged"),
            uris: if has("resources", "subscribe") {
                self.uris.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// Whether a notification the server sent on the session belongs in this listen.
    fn admits(&self, method: &str, params: Option<&Value>) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            // The spec lets the URI updated be a sub-resource of one subscribed (below it: not
            // `note://10` for `note://1`).
            "notifications/resources/updated" => params
                .and_then(|p| p.get("uri"))
                .and_then(Value::as_str)
                .is_some_and(|uri| self.uris.iter().any(|u| is_below(uri, u))),
            _ => false,
        }
    }

    /// The filter as the acknowledgement says it (kinds not honoured left out).
    fn to_json(&self) -> Value {
        let mut out = Map::new();
        for (key, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                out.insert(key.into(), Value::Bool(true));
            }
        }
        if !self.uris.is_empty() {
            out.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(out)
    }
}

/// Whether `uri` is `subscribed` or a sub-resource of it.
fn is_below(uri: &str, subscribed: &str) -> bool {
    match uri.strip_prefix(subscribed) {
        Some(rest) => {
            rest.is_empty() || subscribed.ends_with('/') || rest.starts_with(['/', '#', '?'])
        }
        None => false,
    }
}

/// The first message of a listen stream: `notifications/subscriptions/acknowledged` with what
/// is honoured.
pub fn acknowledgement(id: &Value, honoured: &Filter) -> Vec<u8> {
    let message = json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {SUBSCRIPTION_ID: id}, "notifications": honoured.to_json()},
    });
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// The graceful end of a listen stream: its `SubscriptionsListenResult`.
pub fn ended(id: &Value) -> Vec<u8> {
    let message = json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {"_meta": {SUBSCRIPTION_ID: id}, "resultType": "complete"},
    });
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// The message of the session's GET stream `data` as the listen `id` with `filter` gets it:
/// `None` for what it did not ask for (other kinds, other URIs, log messages, server requests,
/// anything unreadable).
pub fn notification(data: &[u8], filter: &Filter, id: &Value) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(data) else {
        return None;
    };
    if message.contains_key("id") {
        return None;
    }
    let method = message.get("method")?.as_str()?;
    if !filter.admits(method, message.get("params")) {
        return None;
    }
    let params = message
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    let meta = params.as_object_mut()?.entry("_meta").or_insert(json!({}));
    meta.as_object_mut()?
        .insert(SUBSCRIPTION_ID.into(), id.clone());
    Some(serde_json::to_vec(&message).expect("a JSON value serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_filter_is_read_from_the_request_and_cut_to_what_the_server_says_it_sends() {
        let params = json!({"notifications": {
            "toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": false,
            "resourceSubscriptions": ["note://1", 7, "note://2"],
        }});
        let asked = Filter::of_request(Some(&params));
        assert_eq!(
            asked,
            Filter {
                tools: true,
                prompts: true,
                resources: false,
                uris: vec!["note://1".into(), "note://2".into()],
            }
        );
        let caps = json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}});
        let honoured = asked.honoured(&caps);
        assert!(honoured.tools && !honoured.prompts && !honoured.resources);
        assert_eq!(honoured.uris.len(), 2);
        assert!(asked.honoured(&json!({})).uris.is_empty(), "no subscribe");
        assert_eq!(Filter::of_request(None), Filter::default());
    }

    #[test]
    fn the_acknowledgement_names_the_listen_and_what_is_honoured() {
        let honoured = Filter {
            tools: true,
            uris: vec!["note://1".into()],
            ..Filter::default()
        };
        let ack = parse(&acknowledgement(&json!("listen-1"), &honoured));
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID], "listen-1");
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true, "resourceSubscriptions": ["note://1"]})
        );
        let end = parse(&ended(&json!(9)));
        assert_eq!(end["id"], 9);
        assert_eq!(end["result"]["resultType"], "complete");
    }

    #[test]
    fn only_what_the_listen_asked_for_reaches_it_named_by_its_id() {
        let filter = Filter {
            prompts: true,
            uris: vec!["note://1".into()],
            ..Filter::default()
        };
        let id = json!("listen-3");
        let updated = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"note://1/part"}}"#;
        let out = parse(&notification(updated, &filter, &id).expect("a subscribed URI"));
        assert_eq!(out["params"]["uri"], "note://1/part");
        assert_eq!(out["params"]["_meta"][SUBSCRIPTION_ID], "listen-3");
        let prompts = br#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#;
        let out = parse(&notification(prompts, &filter, &id).expect("asked for"));
        assert_eq!(out["params"]["_meta"][SUBSCRIPTION_ID], "listen-3");
        for other in [
            &br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"note://2"}}"#[..],
            br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"note://10"}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,

            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":4,"method":"roots/list"}"#,
            b"not json",
            b"",
        ] {
            assert_eq!(notification(other, &filter, &id), None, "{other:?}");
        }
    }
}
