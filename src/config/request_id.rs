//! `[request_id]`: the header that carries each request's id (src/proxy/request_id.rs).
//!
//! One header name, checked here once: a name that is not a header name, or one whose value
//! holdfast or HTTP itself owns (hop-by-hop, framing, the session id, holdfast's own headers),
//! would either not reach the server or break the request it rides on.

use http::HeaderName;
use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// The header a request id travels in when nothing says otherwise: what Envoy, nginx's
/// `$request_id` recipes, Heroku and most tracing setups use.
pub const DEFAULT_HEADER: &str = "x-request-id";

/// `[request_id]` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRequestId {
    /// The header's name (any case; sent lower case).
    pub header: String,
}

impl Default for RawRequestId {
    fn default() -> Self {
        RawRequestId {
            header: DEFAULT_HEADER.into(),
        }
    }
}

/// The `--request-id-header` flag.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RawRequestIdFlags {
    /// `--request-id-header`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

impl RawRequestIdFlags {
    /// No flag of the section given.
    pub fn is_empty(&self) -> bool {
        self.header.is_none()
    }
}

/// Validated `[request_id]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    /// The header a request's id is read from, sent in and answered with.
    pub header: HeaderName,
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId {
            header: HeaderName::from_static(DEFAULT_HEADER),
        }
    }
}

/// Names a request id cannot travel in: HTTP's connection-level and framing headers (removed
/// or rewritten on the way), `Host`, and the headers holdfast reads or writes itself.
const RESERVED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "retry-after",
    "traceparent",
    "tracestate",
];

/// The header name `text` names, or why it cannot carry request ids.
pub fn parse_header(text: &str) -> Result<HeaderName, String> {
    let name = HeaderName::from_bytes(text.trim().as_bytes()).map_err(|_| {
        format!(
            "expected an HTTP header name such as {DEFAULT_HEADER:?} (letters, digits and \
             !#$%&'*+-.^_`|~ only), got {text:?}"
        )
    })?;
    if RESERVED.contains(&name.as_str()) || name.as_str().starts_with("holdfast-") {
        return Err(format!(
            "{name:?} cannot carry request ids: HTTP or holdfast uses it for something else; \
             pick another name such as {DEFAULT_HEADER:?}"
        ));
    }
    Ok(name)
}

impl Validator<'_> {
    /// Checks `[request_id]`; `None` when a problem was recorded.
    pub(super) fn request_id(&mut self, raw: &RawRequestId) -> Option<RequestId> {
        match parse_header(&raw.header) {
            Ok(header) => Some(RequestId { header }),
            Err(e) => self.fail("request_id.header", e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_name_in_any_case_is_taken_lower_case() {
        assert_eq!(parse_header("X-Request-ID").unwrap(), "x-request-id");
        assert_eq!(
            parse_header(" x-correlation-id ").unwrap(),
            "x-correlation-id"
        );
        assert_eq!(
            parse_header(DEFAULT_HEADER).unwrap(),
            RequestId::default().header
        );
    }

    #[test]
    fn what_is_not_a_name_or_is_taken_is_refused_with_the_reason() {
        for bad in ["", "x request id", "x-id:", "é-id", "a,b"] {
            let e = parse_header(bad).unwrap_err();
            assert!(e.contains("expected an HTTP header name"), "{bad:?}: {e}");
        }
        for taken in [
            "Connection",
            "host",
            "Mcp-Session-Id",
            "holdfast-reason",
            "traceparent",
        ] {
            let e = parse_header(taken).unwrap_err();
            assert!(e.contains("cannot carry request ids"), "{taken:?}: {e}");
        }
    }
}
