//! Input rounds the other way (docs/design/era-bridge.md 3.6): a 2026-07-28 server answers a
//! call with `resultType: "input_required"` where a 2025 server would have sent its client a
//! request (elicitation, sampling, roots) on the call's stream. A 2025 client knows no input
//! rounds; it answers requests. So holdfast asks it each input request as a request of its own
//! on the call's stream, waits for the client's answer (a JSON-RPC response it POSTs on its
//! session), and calls again with the answers (`inputResponses`) and the round's
//! `requestState`, until the server gives the result, which ends the client's stream.
//!
//! This module holds the requests waiting for the client's answers and the pure steps; the
//! exchanges are src/proxy/forward/asks.rs's.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

/// Most questions waiting for their clients' answers at once.
const MAX_WAITING: usize = 1024;

/// Most rounds one call may take before holdfast gives up on it (a server that never stops
/// asking).
pub const MAX_ROUNDS: usize = 16;

/// The prefix of the ids of holdfast's own requests to a 2025 client.
const ID_PREFIX: &str = "hf-ask-";

/// What an answer of `input_required` asks: each input request by its key, and the state to
/// send back.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    pub requests: Vec<(String, Value)>,
    pub state: Option<String>,
}

/// The round a result asks for, if it is an input round.
pub fn round_of(result: &Value) -> Option<Round> {
    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return None;
    }
    let requests = match result.get("inputRequests") {
        Some(Value::Object(r)) => r.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => Vec::new(),
    };
    let state = result
        .get("requestState")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(Round { requests, state })
}

/// The request holdfast sends the client for the input request `asked` (`{method, params}`).
pub fn client_request(id: &str, asked: &Value) -> Option<Vec<u8>> {
    let method = asked.get("method")?.as_str()?;
    let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
    if let Some(params) = asked.get("params") {
        message["params"] = params.clone();
    }
    Some(serde_json::to_vec(&message).expect("a JSON value serializes"))
}

/// The request `sent` (as the server got it) again, with a new id, the client's `responses`
/// and the round's `state`.
pub fn retry(sent: &[u8], id: u64, responses: Map<String, Value>, state: Option<&str>) -> Vec<u8> {
    let mut message: Value = serde_json::from_slice(sent).unwrap_or_default();
    message["id"] = Value::from(id);
    if !message["params"].is_object() {
        message["params"] = json!({});
    }
    let params = &mut message["params"];
    params["inputResponses"] = Value::Object(responses);
    match state {
        Some(state) => params["requestState"] = Value::from(state),
        None => {
            if let Some(p) = params.as_object_mut() {
                p.remove("requestState");
            }
        }
    }
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// The final message of the client's stream: `reply` (a JSON-RPC response of the server's) with
/// the client's id back.
pub fn final_answer(mut reply: Value, client_id: &Value) -> Vec<u8> {
    reply["id"] = client_id.clone();
    serde_json::to_vec(&reply).expect("a JSON value serializes")
}

/// An error answer to the client's call.
pub fn failed(client_id: &Value, why: &str) -> Vec<u8> {
    let message =
        json!({"jsonrpc": "2.0", "id": client_id, "error": {"code": -32603, "message": why}});
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// A question waiting for its client's answer.
struct Waiting {
    /// The session it was asked on: only that session's answer is taken.
    token: Vec<u8>,
    answer: oneshot::Sender<Value>,
}

/// The questions waiting for answers, by the id holdfast gave them.
#[derive(Default)]
pub struct Asks {
    waiting: Mutex<HashMap<String, Waiting>>,
}

impl Asks {
    /// A new id for a question, unguessable (the client's answer names it).
    pub fn new_id() -> String {
        super::random_name::<12>(ID_PREFIX)
    }

    /// Waits for the answer to question `id`, asked on session `token`. Questions whose waiter
    /// went away are let go first; `None` beyond [`MAX_WAITING`].
    pub fn wait(&self, id: String, token: &[u8]) -> Option<oneshot::Receiver<Value>> {
        let mut waiting = lock(&self.waiting);
        waiting.retain(|_, w| !w.answer.is_closed());
        if waiting.len() >= MAX_WAITING {
            return None;
        }
        let (answer, answered) = oneshot::channel();
        let token = token.to_vec();
        waiting.insert(id, Waiting { token, answer });
        Some(answered)
    }

    /// Hands a client's `message` on session `token` to the question it answers: whether one
    /// was waiting for it.
    pub fn answer(&self, token: &[u8], message: Value) -> bool {
        let Some(id) = message.get("id").and_then(Value::as_str) else {
            return false;
        };
        if !id.starts_with(ID_PREFIX) {
            return false;
        }
        let mut waiting = lock(&self.waiting);
        if waiting.get(id).is_none_or(|w| w.token != token) {
            return false;
        }
        let id = id.to_owned();
        let waiter = waiting.remove(&id).expect("checked above");
        waiter.answer.send(message).is_ok()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_round_is_read_and_its_requests_asked_of_the_client() {
        let result = json!({
            "resultType": "input_required",
            "inputRequests": {"k": {"method": "elicitation/create", "params": {"message": "Ok?"}}},
            "requestState": "s1",
        });
        let round = round_of(&result).expect("a round");
        assert_eq!(round.state.as_deref(), Some("s1"));
        assert_eq!(round.requests.len(), 1);
        let asked: Value =
            serde_json::from_slice(&client_request("hf-ask-1", &round.requests[0].1).unwrap())
                .unwrap();
        assert_eq!(
            asked,
            json!({"jsonrpc": "2.0", "id": "hf-ask-1", "method": "elicitation/create",
                   "params": {"message": "Ok?"}})
        );
        assert_eq!(round_of(&json!({"resultType": "complete"})), None);
        assert_eq!(round_of(&json!({"content": []})), None);
        assert_eq!(
            client_request("x", &json!({"params": {}})),
            None,
            "no method"
        );
    }

    #[test]
    fn a_retry_carries_the_answers_and_the_state_with_a_new_id() {
        let sent = br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"confirm"}}"#;
        let mut responses = Map::new();
        responses.insert("k".into(), json!({"action": "accept"}));
        let again: Value = serde_json::from_slice(&retry(sent, 9, responses, Some("s1"))).unwrap();
        assert_eq!(again["id"], 9);
        assert_eq!(again["params"]["name"], "confirm");
        assert_eq!(again["params"]["inputResponses"]["k"]["action"], "accept");
        assert_eq!(again["params"]["requestState"], "s1");
        let last: Value = serde_json::from_slice(&final_answer(
            json!({"jsonrpc": "2.0", "id": 9, "result": {}}),
            &json!("c"),
        ))
        .unwrap();
        assert_eq!(last["id"], "c");
        let error: Value = serde_json::from_slice(&failed(&json!(1), "no")).unwrap();
        assert_eq!(error["error"]["message"], "no");
    }

    #[tokio::test]
    async fn only_the_asking_session_answers_a_question_and_only_once() {
        let asks = Asks::default();
        let id = Asks::new_id();
        assert!(id.starts_with(ID_PREFIX) && id.len() > 20, "{id}");
        let answered = asks.wait(id.clone(), b"t1").unwrap();
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept"}});
        assert!(!asks.answer(b"t2", answer.clone()), "another session's");
        assert!(asks.answer(b"t1", answer.clone()));
        assert!(!asks.answer(b"t1", answer), "answered once");
        assert_eq!(answered.await.unwrap()["result"]["action"], "accept");
        assert!(!asks.answer(b"t1", json!({"id": "other", "result": {}})));
    }
}
