//! Every response holdfast makes up itself. Nowhere else in the crate picks a status code.
//!
//! The 503 is the heart of holdfast: MCP clients read a 404 as "session gone" and give up on the
//! server, but keep their session through a 503. It always carries `Retry-After`,
//! `Cache-Control: no-store` and a `holdfast-reason` header naming why; when the request was a
//! single JSON-RPC request with an id, the body is a JSON-RPC error with that id, so SDKs that
//! surface error bodies show a useful message.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};

use crate::classify::{FailReason, RewriteReason};
use crate::proxy::body::ProxyBody;
use crate::upstream::ClientBodyFault;

/// Header naming why holdfast answered itself.
pub const REASON_HEADER: &str = "holdfast-reason";

/// JSON-RPC error code of a synthetic 503 (implementation-defined server error range).
pub const JSONRPC_UNAVAILABLE: i64 = -32000;

/// 503: the backend is missing; retry after `retry_after`.
///
/// `request_body` is the complete request body when known: if it is a single JSON-RPC request
/// with an id, the answer is a JSON-RPC error with that id.
pub fn unavailable(
    reason: RewriteReason,
    retry_after: Duration,
    request_body: Option<&[u8]>,
) -> Response<ProxyBody> {
    let secs = retry_after.as_secs().max(1);
    let message = format!(
        "MCP server temporarily unavailable ({}); retry in {secs} s",
        reason.as_str()
    );
    let mut resp = match request_body.and_then(crate::jsonrpc::request_id) {
        Some(id) => {
            let data = serde_json::json!({ "reason": reason.as_str(), "retryAfterSeconds": secs });
            let body =
                crate::jsonrpc::error_reply(&id, JSONRPC_UNAVAILABLE, &message, data.clone());
            let mut resp = build(
                StatusCode::SERVICE_UNAVAILABLE,
                "application/json",
                body.into(),
            );
            // Kept for `stamp`, which writes the request's id into `data`.
            resp.extensions_mut().insert(Synthetic {
                rpc: Some(Arc::new(RpcError {
                    id,
                    code: JSONRPC_UNAVAILABLE,
                    message,
                    data,
                })),
            });
            resp
        }
        None => build(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            format!("{message}\n").into(),
        ),
    };
    let h = resp.headers_mut();
    h.insert(RETRY_AFTER, HeaderValue::from(secs));
    h.insert(REASON_HEADER, HeaderValue::from_static(reason.as_str()));
    resp
}

/// 502: the request may have reached the application and then failed, or TLS to the upstream
/// failed (a configuration error). Never replayed.
pub fn bad_gateway(reason: FailReason, version: Version) -> Response<ProxyBody> {
    let text = match reason {
        FailReason::UpstreamTls => format!(
            "TLS to the upstream failed ({}): its certificate is not trusted or not for its name, \
             or it refused holdfast's; see holdfast's log\n",
            reason.as_str()
        ),
        FailReason::Unanswered => format!("{}\n", unanswered_text()),
        _ => format!(
            "upstream failed after the request was sent ({}); it may have been executed\n",
            reason.as_str()
        ),
    };
    let mut resp = build(
        StatusCode::BAD_GATEWAY,
        "text/plain; charset=utf-8",
        text.into(),
    );
    resp.headers_mut()
        .insert(REASON_HEADER, HeaderValue::from_static(reason.as_str()));
    close_on_http1(&mut resp, version);
    resp
}

/// 400 for a body the client sent malformed or cut short, 408 for one it let stall, once the
/// upload had begun (nginx and HAProxy answer the same): the client's failure, so not the 502
/// that says the upstream failed. The connection closes on HTTP/1.x: where the next request
/// would begin in it is unknown.
pub fn client_body(fault: ClientBodyFault, version: Version) -> Response<ProxyBody> {
    let (status, reason, text) = match fault {
        ClientBodyFault::Malformed => (
            StatusCode::BAD_REQUEST,
            "client_body",
            "bad request: the request body is malformed or ended before its length",
        ),
        ClientBodyFault::Stalled => (
            StatusCode::REQUEST_TIMEOUT,
            "client_body_timeout",
            "request timeout: the request body stopped arriving",
        ),
    };
    let mut resp = build(
        status,
        "text/plain; charset=utf-8",
        format!("{text} ({reason})\n").into(),
    );
    resp.headers_mut()
        .insert(REASON_HEADER, HeaderValue::from_static(reason));
    close_on_http1(&mut resp, version);
    resp
}

/// 400: the request cannot be forwarded at all.
pub fn bad_request(why: &str, version: Version) -> Response<ProxyBody> {
    let mut resp = build(
        StatusCode::BAD_REQUEST,
        "text/plain; charset=utf-8",
        format!("bad request: {why}\n").into(),
    );
    close_on_http1(&mut resp, version);
    resp
}

/// 503 for a DELETE whose session end the shared store (`sessions.store`) could not record:
/// the server ended the session, but every other replica would bring it back. The client's
/// retry finds the server's 404, holdfast re-establishes the session, and the DELETE ends it
/// again, recorded this time.
pub fn session_end_unrecorded() -> Response<ProxyBody> {
    let mut resp = build(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        "the session's end could not be recorded in sessions.store; retry the DELETE\n".into(),
    );
    let h = resp.headers_mut();
    h.insert(RETRY_AFTER, HeaderValue::from(1u64));
    h.insert(REASON_HEADER, HeaderValue::from_static("session_store"));
    resp
}

/// The reason a holdfast gives for refusing its own hand-off (its sender, `proxy/handoff.rs`,
/// reads it to try the next peer).
pub const HANDOFF_SELF: &str = "handoff_self";

/// 421 for a hand-off that came back to the holdfast that sent it (`proxy/handoff.rs`): the
/// sender tries its next peer.
pub fn handoff_to_self() -> Response<ProxyBody> {
    let mut resp = build(
        StatusCode::MISDIRECTED_REQUEST,
        "text/plain; charset=utf-8",
        "this holdfast sent the hand-off itself\n".into(),
    );
    resp.headers_mut()
        .insert(REASON_HEADER, HeaderValue::from_static(HANDOFF_SELF));
    resp
}

/// 502 from the era bridge: the server's answer to a request of the bridge's own (the
/// `initialize` opening a session for 2026-07-28 clients) could not be used. `why` says what it
/// lacked; nothing of the client's request was sent.
pub fn bridge_failed(why: &str) -> Response<ProxyBody> {
    let mut resp = build(
        StatusCode::BAD_GATEWAY,
        "text/plain; charset=utf-8",
        format!("the era bridge could not open a session on the server: {why}\n").into(),
    );
    resp.headers_mut()
        .insert(REASON_HEADER, HeaderValue::from_static("bridge"));
    resp
}

/// 202 with no body: a notification taken (the era bridge's answer to one a 2026-07-28 client
/// sends, which has nothing to go to).
pub fn accepted() -> Response<ProxyBody> {
    empty(StatusCode::ACCEPTED)
}

/// `status` with no body (the era bridge's answers for what has nothing behind it upstream).
pub fn empty(status: StatusCode) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

/// 200 with an event stream holdfast writes itself (the era bridge's listens and resumed input
/// rounds): not cached, not buffered by an nginx in front.
pub fn event_stream(body: ProxyBody) -> Response<ProxyBody> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        crate::proxy::headers::X_ACCEL_BUFFERING,
        HeaderValue::from_static("no"),
    );
    resp
}

/// `parts` with `body` whole: an upstream answer whose body holdfast rewrote (the era bridge's
/// translations). Its length is the new body's.
pub fn rewritten(mut parts: http::response::Parts, body: Bytes) -> Response<ProxyBody> {
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Response::from_parts(parts, full(body))
}

/// 200 with a text body (admin endpoints).
pub fn ok_text(content_type: &'static str, body: String) -> Response<ProxyBody> {
    build(StatusCode::OK, content_type, body.into())
}

/// 503 from the admin port while not ready.
pub fn not_ready() -> Response<ProxyBody> {
    build(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        "not ready\n".into(),
    )
}

/// 404 from the admin port for unknown paths.
pub fn admin_not_found() -> Response<ProxyBody> {
    build(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "not found: try GET /metrics, /healthz, /readyz, /status, or POST /pause, /resume\n".into(),
    )
}

/// 405 from the admin port for a known path asked with a method it does not take (`GET
/// /pause`): `Allow` names the ones it takes.
pub fn admin_method_not_allowed(allow: &'static str) -> Response<ProxyBody> {
    let mut resp = build(
        StatusCode::METHOD_NOT_ALLOWED,
        "text/plain; charset=utf-8",
        format!("method not allowed: this endpoint takes {allow}\n").into(),
    );
    resp.headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    resp
}

/// `body` as an `application/json` answer: the admin port's (`/status`, `/pause`, `/resume`),
/// the era bridge's own JSON-RPC answers.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    build(status, "application/json", format!("{body}\n").into())
}

fn build(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.extensions_mut().insert(Synthetic::default());
    resp
}

fn full(body: Bytes) -> ProxyBody {
    Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Marks a response as holdfast's own (every one [`build`] makes; an answer passed through from
/// the server has none), with the parts of its JSON-RPC error body when it has one.
#[derive(Clone, Default)]
struct Synthetic {
    rpc: Option<Arc<RpcError>>,
}

/// What a JSON-RPC error body was written from, to write it again with the request's id.
struct RpcError {
    id: crate::jsonrpc::Id,
    code: i64,
    message: String,
    data: serde_json::Value,
}

/// Gives holdfast's own answer to a request its id, so that a user can quote it: in `header`,
/// and in a JSON-RPC error body as `error.data.requestId`. An answer passed through from the
/// server is left exactly as the server sent it: only responses made here carry the mark this
/// looks for.
pub fn stamp(resp: &mut Response<ProxyBody>, header: &http::HeaderName, id: &HeaderValue) {
    let Some(synthetic) = resp.extensions_mut().remove::<Synthetic>() else {
        return;
    };
    resp.headers_mut().insert(header.clone(), id.clone());
    let Some(rpc) = synthetic.rpc else {
        return;
    };
    let mut data = rpc.data.clone();
    if let Some(fields) = data.as_object_mut() {
        let id = crate::proxy::request_id::as_str(id);
        fields.insert("requestId".into(), id.into());
    }
    let body = crate::jsonrpc::error_reply(&rpc.id, rpc.code, &rpc.message, data);
    resp.headers_mut().remove(http::header::CONTENT_LENGTH);
    *resp.body_mut() = full(body.into());
}

/// On HTTP/1.x the connection's state is unknown after a failure mid-request (the request body
/// may be half read): close it. HTTP/2 streams are independent, so it is left alone there.
fn close_on_http1(resp: &mut Response<ProxyBody>, version: Version) {
    if version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
}

/// JSON-RPC error code of the error holdfast adds to an event stream that ended without the
/// answer to its request (implementation-defined server error range, as the 503's).
pub const JSONRPC_UNANSWERED: i64 = -32000;

/// The event that ends an event stream which the server closed without answering the request it
/// carried (`id`): a JSON-RPC error with that id, so the client's call fails now instead of
/// waiting out its own timeout. The request reached the server and may have run. `request_id`:
/// the request's id (`request_id.header`), quoted in the data as [`stamp`] quotes it.
pub fn unanswered_event(id: &crate::jsonrpc::Id, request_id: Option<&HeaderValue>) -> Bytes {
    let mut data = serde_json::json!({ "reason": FailReason::Unanswered.as_str() });
    if let Some(request_id) = request_id {
        data["requestId"] = crate::proxy::request_id::as_str(request_id).into();
    }
    let error = crate::jsonrpc::error_reply(id, JSONRPC_UNANSWERED, &unanswered_text(), data);
    Bytes::from(format!("event: message\ndata: {error}\n\n"))
}

/// What the client of an event stream ended without its answer is told, as a 502 or as the
/// added event's error message.
fn unanswered_text() -> String {
    format!(
        "the MCP server ended its event stream without answering the request ({}): it was \
         probably shutting down; the request may have been executed",
        FailReason::Unanswered.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(resp: Response<ProxyBody>) -> Bytes {
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn unavailable_echoes_jsonrpc_id() {
        let req = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#;
        let resp = unavailable(
            RewriteReason::ConnectRefused,
            Duration::from_secs(3),
            Some(req),
        );
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[RETRY_AFTER], "3");
        assert_eq!(resp.headers()[CACHE_CONTROL], "no-store");
        assert_eq!(resp.headers()[REASON_HEADER], "connect_refused");
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body_of(resp).await).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["code"], JSONRPC_UNAVAILABLE);
        assert_eq!(v["error"]["data"]["reason"], "connect_refused");
    }

    #[tokio::test]
    async fn unavailable_is_text_for_everything_else() {
        for body in [
            &br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#[..],
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            b"not json",
        ] {
            let resp = unavailable(RewriteReason::Dns, Duration::from_secs(2), Some(body));
            assert_eq!(resp.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
            assert!(String::from_utf8(body_of(resp).await.to_vec())
                .unwrap()
                .contains("(dns)"));
        }
        let resp = unavailable(RewriteReason::Dns, Duration::from_millis(10), None);
        assert_eq!(
            resp.headers()[RETRY_AFTER],
            "1",
            "Retry-After is at least 1 s"
        );
    }

    #[tokio::test]
    async fn stamp_names_the_request_in_holdfasts_answers_only() {
        let header = http::HeaderName::from_static("x-request-id");
        let id = HeaderValue::from_static("req-7");
        let req = br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#;
        let mut resp = unavailable(RewriteReason::Dns, Duration::from_secs(2), Some(req));
        stamp(&mut resp, &header, &id);
        assert_eq!(resp.headers()["x-request-id"], "req-7");
        let v: serde_json::Value = serde_json::from_slice(&body_of(resp).await).unwrap();
        assert_eq!(v["id"], "a");
        assert_eq!(v["error"]["data"]["requestId"], "req-7");
        assert_eq!(v["error"]["data"]["reason"], "dns");
        assert_eq!(v["error"]["data"]["retryAfterSeconds"], 2);

        let mut resp = bad_gateway(FailReason::UpstreamReset, Version::HTTP_11);
        stamp(&mut resp, &header, &id);
        assert_eq!(resp.headers()["x-request-id"], "req-7");
        assert!(String::from_utf8(body_of(resp).await.to_vec())
            .unwrap()
            .contains("upstream failed"));

        // An answer passed through (made anywhere but here) is not touched.
        let mut passed = Response::new(full(Bytes::from_static(b"{}")));
        stamp(&mut passed, &header, &id);
        assert!(passed.headers().get("x-request-id").is_none());
        assert_eq!(body_of(passed).await, "{}");
    }

    #[test]
    fn connection_close_only_on_http1() {
        let r = bad_gateway(FailReason::UpstreamReset, Version::HTTP_11);
        assert_eq!(r.headers()[CONNECTION], "close");
        let r = bad_gateway(FailReason::UpstreamReset, Version::HTTP_2);
        assert!(r.headers().get(CONNECTION).is_none());
    }
}
