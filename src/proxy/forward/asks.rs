//! A 2025 client's call that a 2026-07-28 server answers with input rounds
//! (src/bridge/asks.rs): the client is asked each input request on the call's stream, and the
//! call is sent again with its answers until the server gives the result. One task drives these
//! calls ([`Proxy::bridge_asks`]), each with the proxy current when it comes, since the client's
//! stream outlives the request's own future.

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use serde_json::{Map, Value};

use super::bridged::{copy, read_whole};
use super::Proxy;
use crate::bridge::asks::{self, Asks, MAX_ROUNDS};
use crate::bridge::Asking;
use crate::proxy::asking::{round_answer, Relayed, Start};
use crate::proxy::body::ProxyBody;
use crate::respond;

/// The methods a 2026-07-28 server may answer with an input round.
const ROUND_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

impl Proxy {
    /// The server's answer `resp` to the call `sent` (`start` says how to go on if it asks for
    /// input), as the 2025 client gets it: passed while the server only answers, the client
    /// asked what the server asks when it asks. Other answers pass as they are.
    pub(super) async fn watch_for_rounds(
        &self,
        method: &str,
        resp: Response<ProxyBody>,
        start: Start,
    ) -> Response<ProxyBody> {
        if !ROUND_METHODS.contains(&method) || !resp.status().is_success() {
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        if crate::proxy::headers::is_event_stream(&parts.headers) {
            parts.headers.remove(http::header::CONTENT_LENGTH);
            let watched = Relayed::watching(body, start);
            return Response::from_parts(parts, ProxyBody::new(watched));
        }
        // An input round is small; an answer too long to read whole is the call's result, as
        // it is.
        let length = parts.headers.get(http::header::CONTENT_LENGTH);
        let length = length.and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if length.is_some_and(|n| n > crate::bridge::MAX_EVENT) {
            return Response::from_parts(parts, body);
        }
        let Ok(bytes) = read_whole(body).await else {
            return respond::bad_gateway(crate::classify::FailReason::Protocol, parts.version);
        };
        match round_answer(&bytes) {
            Some(first) => {
                respond::event_stream(ProxyBody::new(Relayed::written(start.ask(first))))
            }
            None => respond::rewritten(parts, bytes),
        }
    }

    /// Drives the calls whose clients are to be asked for input, each with the proxy current
    /// when it comes, for as long as holdfast runs.
    pub async fn bridge_asks(current: std::sync::Arc<crate::proxy::current::Current>) {
        let Some(mut asked) = current.get().bridge.take_asking() else {
            return;
        };
        while let Some(asking) = asked.recv().await {
            let proxy = current.get();
            tokio::spawn(async move { proxy.ask_client(asking).await });
        }
    }

    /// Asks the client of `asking` each round's questions and calls again with its answers,
    /// until the server answers; the answer (or why there is none) ends the client's stream.
    async fn ask_client(&self, asking: Asking) {
        let (out, client_id) = (asking.out.clone(), asking.client_id.clone());
        let last = match self.rounds_with_client(&asking).await {
            Ok(reply) => asks::final_answer(reply, &client_id),
            Err(why) => {
                tracing::info!(why, "bridge: a call's input round did not finish");
                asks::failed(&client_id, why)
            }
        };
        let _ = out.send(crate::sse::data_event(&last)).await;
    }

    /// The server's final reply to the call of `asking`, after as many rounds as it asks.
    async fn rounds_with_client(&self, asking: &Asking) -> Result<Value, &'static str> {
        let mut result = asking.first.clone();
        for _ in 0..MAX_ROUNDS {
            let Some(round) = asks::round_of(&result) else {
                let reply = serde_json::json!({"jsonrpc": "2.0", "id": null, "result": result});
                return Ok(reply);
            };
            let mut responses = Map::new();
            for (key, asked) in round.requests {
                responses.insert(key, self.ask_once(asking, &asked).await?);
            }
            let again = asks::retry(
                &asking.sent,
                self.bridge.next_id(),
                responses,
                round.state.as_deref(),
            );
            let (resp, _) = self
                .inner(copy(&asking.head), again.into(), asking.peer)
                .await;
            let reply = relay_reply(resp, &asking.out).await?;
            match reply.get("result") {
                Some(next) => result = next.clone(),
                None => return Ok(reply),
            }
        }
        Err("the server asked for input more times than holdfast answers (16 rounds)")
    }

    /// Asks the client one input request: its answer's result.
    async fn ask_once(&self, asking: &Asking, asked: &Value) -> Result<Value, &'static str> {
        let id = Asks::new_id();
        let request =
            asks::client_request(&id, asked).ok_or("an input request without a method")?;
        let answered = (self.bridge.asks())
            .wait(id, &asking.token)
            .ok_or("holdfast has too many questions waiting for their clients' answers")?;
        asking
            .out
            .send(crate::sse::data_event(&request))
            .await
            .map_err(|_| "the client closed the call's stream")?;
        let answer = tokio::select! {
            answer = tokio::time::timeout(self.timeouts.stream_idle, answered) => answer
                .map_err(|_| "the client did not answer the server's request in time")?
                .map_err(|_| "the question was let go")?,
            () = asking.out.closed() => return Err("the client closed the call's stream"),
        };
        match answer.get("result") {
            Some(result) => Ok(result.clone()),
            None => Err("the client refused the server's request"),
        }
    }
}

/// The JSON-RPC response in the server's answer to a retry; the events before it (progress,
/// log messages) go to the client's stream as they come.
async fn relay_reply(
    resp: Response<ProxyBody>,
    out: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<Value, &'static str> {
    let is_sse = crate::proxy::headers::is_event_stream(resp.headers());
    let status = resp.status();
    let mut body = resp.into_body();
    if !is_sse {
        let bytes = read_whole(body)
            .await
            .map_err(|_| "the server's answer was unreadable")?;
        return match serde_json::from_slice(&bytes) {
            Ok(message @ Value::Object(_)) => Ok(message),
            _ if status.is_success() => Err("the server's answer to the call was not JSON-RPC"),
            _ => Err("the server refused the call's retry"),
        };
    }
    let mut parser = crate::sse::Parser::new(crate::bridge::MAX_EVENT);
    loop {
        // A client gone (its stream closed, the call cancelled) closes the server's stream.
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = out.closed() => return Err("the client closed the call's stream"),
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|_| "the server's stream broke")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for ev in parser.events(&data) {
            if !ev.has_data || ev.cut {
                continue;
            }
            let message: Value = serde_json::from_str(&ev.data).unwrap_or_default();
            if message.get("id").is_some() && message.get("method").is_none() {
                return Ok(message);
            }
            let mut passed = bytes::BytesMut::new();
            crate::proxy::bridged::write_event(&mut passed, &ev, ev.data.as_bytes());
            out.send(passed.freeze())
                .await
                .map_err(|_| "the client closed the call's stream")?;
        }
    }
    Err("the server's stream ended without the call's answer")
}
