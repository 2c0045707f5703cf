//! Input rounds (docs/design/era-bridge.md 1.4, 3.4, build order step 4): a 2025 server asks
//! its client for input (`elicitation/create`, `sampling/createMessage`, `roots/list`) with a
//! request on the stream answering a call; a 2026-07-28 client gets no requests from a server,
//! it gets an answer of `resultType: "input_required"` naming what is asked, and calls again
//! with the same request, its `inputResponses` and the round's `requestState`.
//!
//! The bridge ends the client's stream there with that answer and parks the rest of the upstream
//! stream ([`Parked`]) under a random handle, which is the `requestState`. The retry brings it
//! back: the client's response goes to the server as the answer to its request, on the same
//! session, and the parked stream goes on as the retry's answer. Nothing runs twice: the call
//! the server is in the middle of is the same one. A retry whose round is gone (holdfast
//! restarted, another replica, waited past `streams.idle_timeout_secs`) is refused: the call
//! cannot be resumed, and the client calls again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::wire::{Ask, Sent};
use super::{CancelOnDrop, Principal};
use crate::errors::BoxError;
use crate::sse;

/// Most rounds parked at once: each holds an upstream stream open.
const MAX_PARKED: usize = 256;

/// What a retry carries: the round's handle and the client's responses.
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub state: String,
    pub responses: Map<String, Value>,
}

/// The round a request resumes, if it names one (`params.requestState`).
pub fn retry_of(body: &[u8]) -> Option<Retry> {
    let message: Value = serde_json::from_slice(body).ok()?;
    let params = message.get("params")?;
    let state = params.get("requestState")?.as_str()?.to_owned();
    let responses = match params.get("inputResponses") {
        Some(Value::Object(r)) => r.clone(),
        _ => Map::new(),
    };
    Some(Retry { state, responses })
}

/// The server's answer to `ask` from the client's `responses`: its response, or an error when
/// the client gave none.
pub fn answer_to_ask(ask: &Ask, responses: &Map<String, Value>) -> Vec<u8> {
    let message = match responses.get(&ask.method) {
        Some(result) => json!({"jsonrpc": "2.0", "id": ask.id, "result": result}),
        None => json!({"jsonrpc": "2.0", "id": ask.id, "error": {
            "code": -32603,
            "message": "the client answered the input round without a response to this request",
        }}),
    };
    serde_json::to_vec(&message).expect("a JSON value serializes")
}

/// The answer to a retry whose round is gone.
pub fn round_gone(client_id: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": client_id, "error": {
        "code": -32602,
        "message": "holdfast no longer has this input round (it restarted, or the round waited \
                    longer than streams.idle_timeout_secs): call again without requestState",
    }})
}

/// The rest of an upstream stream, parked while its client answers the server's request.
pub struct Parked {
    /// The stream, read up to the request.
    pub body: http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>,
    pub parser: sse::Parser,
    /// Events that came after the request in the same read, still to translate.
    pub after: Vec<sse::Event>,
    pub ask: Ask,
    pub sent: Sent,
    /// The head the answer goes upstream with (the call's: session, version, credentials).
    pub head: http::Request<()>,
    pub peer: std::net::SocketAddr,
    /// Armed: a round nobody resumes cancels the call when it is let go.
    pub cancel: Option<CancelOnDrop>,
    pub principal: Principal,
    /// When it is let go unresumed.
    pub until: Instant,
}

/// The parked rounds, by handle.
#[derive(Default)]
pub struct Rounds {
    parked: Mutex<HashMap<String, Parked>>,
}

impl Rounds {
    /// A new, unguessable handle: the round's `requestState`.
    pub fn handle() -> String {
        super::random_name::<18>("hf1.")
    }

    /// Parks `parked` under `handle`; rounds past their time are let go first (and cancelled),
    /// and beyond [`MAX_PARKED`] the one closest to its end.
    pub fn park(&self, handle: String, parked: Parked) {
        let gone = {
            let mut map = lock(&self.parked);
            let mut gone = sweep(&mut map, Instant::now());
            if map.len() >= MAX_PARKED {
                let first = map
                    .iter()
                    .min_by_key(|(_, p)| p.until)
                    .map(|(h, _)| h.clone());
                gone.extend(first.and_then(|first| map.remove(&first)));
            }
            map.insert(handle, parked);
            gone
        };
        drop(gone);
    }

    /// The round `handle` names, if it is parked, in time, and `principal`'s.
    pub fn take(&self, handle: &str, principal: &Principal) -> Option<Parked> {
        let (taken, gone) = {
            let mut map = lock(&self.parked);
            let gone = sweep(&mut map, Instant::now());
            let theirs = map.get(handle).is_some_and(|p| p.principal == *principal);
            (theirs.then(|| map.remove(handle)).flatten(), gone)
        };
        drop(gone);
        taken
    }

    /// Lets the round `handle` go if its time is up (it was not resumed): dropped, it cancels
    /// its call. For a timer set when it was parked.
    pub fn expire(&self, handle: &str) {
        let gone = {
            let mut map = lock(&self.parked);
            let late = map.get(handle).is_some_and(|p| p.until <= Instant::now());
            late.then(|| map.remove(handle)).flatten()
        };
        if gone.is_some() {
            tracing::debug!("bridge: an input round nobody resumed let go");
        }
    }

    /// Rounds parked now.
    pub fn len(&self) -> usize {
        lock(&self.parked).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Takes out the rounds past their time (dropped by the caller, outside the lock).
fn sweep(map: &mut HashMap<String, Parked>, now: Instant) -> Vec<Parked> {
    let late: Vec<String> = map
        .iter()
        .filter(|(_, p)| p.until <= now)
        .map(|(h, _)| h.clone())
        .collect();
    late.iter().filter_map(|h| map.remove(h)).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_names_its_round_and_its_response_answers_the_server() {
        let body = br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x",
            "requestState":"hf1.x","inputResponses":{"elicitation/create":{"action":"decline"}}}}"#;
        let retry = retry_of(body).expect("a retry");
        assert_eq!(retry.state, "hf1.x");
        let ask = Ask {
            id: json!(0),
            method: "elicitation/create".into(),
            params: None,
        };
        let answer: Value = serde_json::from_slice(&answer_to_ask(&ask, &retry.responses)).unwrap();
        assert_eq!(
            answer,
            json!({"jsonrpc": "2.0", "id": 0, "result": {"action": "decline"}})
        );
        let none: Value = serde_json::from_slice(&answer_to_ask(&ask, &Map::new())).unwrap();
        assert_eq!(none["error"]["code"], -32603);
        assert_eq!(
            retry_of(br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{}}"#),
            None
        );
        assert_eq!(round_gone(&json!(8))["error"]["code"], -32602);
    }

    fn parked(who: &str, until: Instant) -> Parked {
        use http_body_util::BodyExt;
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", who.parse().unwrap());
        Parked {
            body: http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
            parser: sse::Parser::new(64),
            after: Vec::new(),
            ask: Ask {
                id: json!(0),
                method: "roots/list".into(),
                params: None,
            },
            sent: Sent {
                upstream_id: 1,
                client_id: json!(1),
                method: "tools/call".into(),
                log_level: None,
            },
            head: http::Request::new(()),
            peer: ([127, 0, 0, 1], 1).into(),
            cancel: None,
            principal: Principal::of(&headers, None),
            until,
        }
    }

    #[test]
    fn a_round_is_resumed_once_only_by_its_principal_and_only_in_time() {
        let rounds = Rounds::default();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        let a = parked("Bearer a", later).principal;
        let b = parked("Bearer b", later).principal;
        rounds.park("h1".into(), parked("Bearer a", later));
        assert!(rounds.take("h1", &b).is_none(), "another principal's");
        assert!(rounds.take("h1", &a).is_some());
        assert!(rounds.take("h1", &a).is_none(), "resumed once");
        rounds.park("late".into(), parked("Bearer a", Instant::now()));
        rounds.park("h2".into(), parked("Bearer a", later));
        assert_eq!(rounds.len(), 1, "the round past its time let go");
        assert!(rounds.take("late", &a).is_none());
        for n in 0..MAX_PARKED + 5 {
            rounds.park(format!("n{n}"), parked("Bearer a", later));
        }
        assert_eq!(rounds.len(), MAX_PARKED, "capped");
        // The timer set at parking lets go a round past its time, and only such a one.
        let fresh = Rounds::default();
        fresh.park("due".into(), parked("Bearer a", Instant::now()));
        fresh.park("later".into(), parked("Bearer a", later));
        fresh.expire("due");
        fresh.expire("later");
        assert_eq!(fresh.len(), 1);
        assert!(fresh.take("later", &a).is_some());
    }

    #[test]
    fn handles_are_unguessable_and_not_repeated() {
        let (a, b) = (Rounds::handle(), Rounds::handle());
        assert_ne!(a, b);
        assert!(a.starts_with("hf1.") && a.len() > 20, "{a}");
    }
}
