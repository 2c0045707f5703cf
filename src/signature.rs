//! Router signatures: what a router's own answer looks like (Traefik's route-missing 404, its
//! `no available server` 503, nginx's 404 page, ...), the built-in presets, and the raw
//! `[[routes.signatures]]` entries users add. Its own module so that configuration (which
//! validates them) and classification (which matches them) both build on it without depending on
//! each other.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::StatusCode;
use serde::{Deserialize, Serialize};

/// One user-defined router signature (`[[routes.signatures]]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSignature {
    /// Name used in logs.
    pub name: String,
    /// Status to match: 404 (route missing) or a 5xx (router unavailable).
    pub status: u16,
    /// Exact `Content-Type` value (case-insensitive); absent means any, `""` means none sent.
    pub content_type: Option<String>,
    /// The whole body, exactly.
    pub body: Option<String>,
    /// A substring of the body.
    pub body_contains: Option<String>,
    /// Headers that must be present (`value` absent) or equal (`value` set).
    pub headers: Vec<RawHeaderMatch>,
    /// Whether a request answered this way provably never reached the application, so it may
    /// be held and sent again. Default: yes for a 404 (the router found no route), no for a 5xx
    /// (routers send those after the backend read the request too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_safe: Option<bool>,
}

/// A header condition of a signature.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHeaderMatch {
    /// Header name.
    pub name: String,
    /// Exact value, or any value when absent.
    pub value: Option<String>,
}

/// A router's recognisable answer.
#[derive(Debug, Clone)]
pub struct Signature {
    /// Name for logs.
    pub name: String,
    /// Status that must match.
    pub status: StatusCode,
    /// `None`: any; `Some("")`: no Content-Type header; otherwise equal, ignoring ASCII case.
    pub content_type: Option<String>,
    /// Body condition.
    pub body: BodyMatch,
    /// Header conditions: present (`None`) or equal (`Some`).
    pub headers: Vec<(HeaderName, Option<HeaderValue>)>,
    /// Whether the router's answer proves the request never reached the application.
    pub replay_safe: bool,
}

/// How a signature matches the body.
#[derive(Debug, Clone)]
pub enum BodyMatch {
    /// Any body (not read).
    Any,
    /// Exactly these bytes.
    Exact(Bytes),
    /// Contains these bytes.
    Contains(Bytes),
}

impl Signature {
    /// 404 signatures say "no route"; 5xx ones say "no server".
    pub fn is_route_missing(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
    }

    /// Body bytes that must be read to decide (0 when the body does not matter).
    pub fn body_len_needed(&self) -> usize {
        match &self.body {
            BodyMatch::Any => 0,
            BodyMatch::Exact(b) | BodyMatch::Contains(b) => b.len(),
        }
    }

    /// Whether a response matches. `body` is the complete body when it was read; a signature
    /// with a body condition never matches an unread (too large) body.
    pub fn matches(&self, status: StatusCode, headers: &HeaderMap, body: Option<&[u8]>) -> bool {
        if status != self.status {
            return false;
        }
        let ct_ok = match (&self.content_type, headers.get(CONTENT_TYPE)) {
            (None, _) => true,
            (Some(want), None) => want.is_empty(),
            (Some(want), Some(got)) => got.as_bytes().eq_ignore_ascii_case(want.as_bytes()),
        };
        let headers_ok = self.headers.iter().all(|(name, want)| {
            let mut values = headers.get_all(name).iter();
            match want {
                None => values.next().is_some(),
                Some(v) => values.any(|got| got == v),
            }
        });
        let body_ok = match (&self.body, body) {
            (BodyMatch::Any, _) => true,
            (_, None) => false,
            (BodyMatch::Exact(want), Some(got)) => got == &want[..],
            (BodyMatch::Contains(want), Some(got)) => {
                want.is_empty() || got.windows(want.len()).any(|w| w == &want[..])
            }
        };
        ct_ok && headers_ok && body_ok
    }

    /// Validates a user-defined signature.
    pub fn from_raw(raw: &RawSignature) -> Result<Signature, String> {
        let status = StatusCode::from_u16(raw.status)
            .map_err(|_| format!("status {} is not an HTTP status", raw.status))?;
        if status != StatusCode::NOT_FOUND && !status.is_server_error() {
            return Err(format!(
                "status {} cannot be a router signature: use 404 (route missing) or a 5xx (router unavailable)",
                raw.status
            ));
        }
        let body = match (&raw.body, &raw.body_contains) {
            (Some(_), Some(_)) => return Err("set `body` or `body_contains`, not both".into()),
            (Some(b), None) => BodyMatch::Exact(Bytes::from(b.clone())),
            (None, Some(b)) => BodyMatch::Contains(Bytes::from(b.clone())),
            (None, None) => BodyMatch::Any,
        };
        let mut headers = Vec::new();
        for h in &raw.headers {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("`{}` is not a valid header name", h.name))?;
            let value = match &h.value {
                Some(v) => Some(
                    HeaderValue::from_str(v)
                        .map_err(|_| format!("`{v}` is not a valid header value"))?,
                ),
                None => None,
            };
            headers.push((name, value));
        }
        if raw.content_type.is_none() && matches!(body, BodyMatch::Any) && headers.is_empty() {
            // A bare status would turn every application 404 (or 5xx) into a router's answer.
            return Err(
                "a signature needs at least one of content_type, body, body_contains or headers"
                    .into(),
            );
        }
        Ok(Signature {
            name: if raw.name.is_empty() {
                format!("custom-{}", raw.status)
            } else {
                raw.name.clone()
            },
            status,
            content_type: raw.content_type.clone(),
            body,
            headers,
            // A route-missing 404 is the router answering by itself. A 5xx may follow a request
            // the backend read (a router's 502 after a reset, a 503 from a backend's own load
            // shedding behind it): replayed only when the user says it never is.
            replay_safe: raw.replay_safe.unwrap_or(status == StatusCode::NOT_FOUND),
        })
    }
}

/// What every error page nginx writes itself has at its foot.
const NGINX_PAGE: &[u8] = b"<hr><center>nginx";

/// Built-in router signatures (shared/mcp-notes.md, "What routers send when the route is missing").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Traefik, no router matched (Go's `http.NotFound`).
    Traefik404,
    /// Traefik, router without a healthy server.
    Traefik503,
    /// Traefik, dial error (`Bad Gateway`).
    Traefik502,
    /// Traefik, upstream timeout (`Gateway Timeout`). Rewritten to 503, but never replayed: the
    /// request may have been sent and be running.
    Traefik504,
    /// nginx's built-in 404 page (no matching location).
    Nginx404,
    /// nginx's built-in 502 page (its upstream refused, reset or closed): never replay-safe, as
    /// Traefik's 502.
    Nginx502,
    /// nginx's built-in 503 page (no live upstream, a rate limit).
    Nginx503,
    /// nginx's built-in 504 page (its upstream did not answer in time): never replay-safe.
    Nginx504,
    /// The Kubernetes default backend (ingress-gce, ingress-nginx's default-http-backend).
    IngressGce404,
    /// Envoy's empty no-route 404. Off by default: an application's empty 404 behind an Envoy
    /// sidecar looks the same.
    Envoy404,
}

impl Preset {
    const ALL: [Preset; 10] = [
        Preset::Traefik404,
        Preset::Traefik503,
        Preset::Traefik502,
        Preset::Traefik504,
        Preset::Nginx404,
        Preset::Nginx502,
        Preset::Nginx503,
        Preset::Nginx504,
        Preset::IngressGce404,
        Preset::Envoy404,
    ];

    /// Config name.
    pub fn name(&self) -> &'static str {
        match self {
            Preset::Traefik404 => "traefik-404",
            Preset::Traefik503 => "traefik-503",
            Preset::Traefik502 => "traefik-502",
            Preset::Traefik504 => "traefik-504",
            Preset::Nginx404 => "nginx-404",
            Preset::Nginx502 => "nginx-502",
            Preset::Nginx503 => "nginx-503",
            Preset::Nginx504 => "nginx-504",
            Preset::IngressGce404 => "ingress-gce-404",
            Preset::Envoy404 => "envoy-404",
        }
    }

    /// Every preset name.
    pub fn names() -> Vec<&'static str> {
        Preset::ALL.iter().map(Preset::name).collect()
    }

    /// Looks a preset up by its config name.
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The signature.
    pub fn signature(&self) -> Signature {
        let text_utf8 = Some("text/plain; charset=utf-8".to_string());
        let nosniff = (
            HeaderName::from_static("x-content-type-options"),
            Some(HeaderValue::from_static("nosniff")),
        );
        let (status, content_type, body, headers, replay_safe) = match self {
            Preset::Traefik404 => (
                StatusCode::NOT_FOUND,
                text_utf8,
                BodyMatch::Exact(Bytes::from_static(b"404 page not found\n")),
                vec![nosniff],
                true,
            ),
            Preset::Traefik503 => (
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                BodyMatch::Exact(Bytes::from_static(b"no available server\n")),
                vec![],
                true,
            ),
            // Traefik writes the bare status text. A dial error never sent the request, but
            // Traefik answers the same 502 when the backend closed after reading it: not safe.
            Preset::Traefik502 => (
                StatusCode::BAD_GATEWAY,
                None,
                BodyMatch::Exact(Bytes::from_static(b"Bad Gateway")),
                vec![],
                false,
            ),
            Preset::Traefik504 => (
                StatusCode::GATEWAY_TIMEOUT,
                None,
                BodyMatch::Exact(Bytes::from_static(b"Gateway Timeout")),
                vec![],
                false,
            ),
            Preset::Nginx404 => (
                StatusCode::NOT_FOUND,
                Some("text/html".to_string()),
                BodyMatch::Contains(Bytes::from_static(NGINX_PAGE)),
                vec![],
                true,
            ),
            // nginx's own error pages, `<hr><center>nginx/1.22.1</center>` (or `nginx</center>`
            // with server_tokens off) at their foot. A 502 also follows a request the upstream
            // read and then dropped, a 504 one it is still running; a 503 may be an upstream's
            // own page passed through with proxy_intercept_errors. None is replay-safe: a
            // request safe to run twice is held anyway, any other gets the 503 at once.
            Preset::Nginx502 | Preset::Nginx503 | Preset::Nginx504 => (
                match self {
                    Preset::Nginx502 => StatusCode::BAD_GATEWAY,
                    Preset::Nginx503 => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::GATEWAY_TIMEOUT,
                },
                Some("text/html".to_string()),
                BodyMatch::Contains(Bytes::from_static(NGINX_PAGE)),
                vec![],
                false,
            ),
            Preset::IngressGce404 => (
                StatusCode::NOT_FOUND,
                None,
                BodyMatch::Contains(Bytes::from_static(b"default backend - 404")),
                vec![],
                true,
            ),
            Preset::Envoy404 => (
                StatusCode::NOT_FOUND,
                None,
                BodyMatch::Exact(Bytes::new()),
                vec![(
                    HeaderName::from_static("server"),
                    Some(HeaderValue::from_static("envoy")),
                )],
                true,
            ),
        };
        Signature {
            name: self.name().into(),
            status,
            content_type,
            body,
            headers,
            replay_safe,
        }
    }
}
