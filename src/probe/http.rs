//! The probe's HTTP client: one request at a time, each under a time budget of its own, with
//! the failure kept as holdfast's proxy would name it (refused, DNS, TLS, timeout).
//!
//! It connects through the proxy's own [`UpstreamConnector`], so what the probe reports for a
//! failed connection is what holdfast would meet: the same resolution, the same TLS settings,
//! the same error kinds.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as Legacy;
use hyper_util::rt::TokioExecutor;

use crate::errors::ErrorChain;
use crate::upstream::{ConnectError, ConnectErrorKind, UpstreamConnector};

/// Most body bytes read of any answer: enough for a `tools/list` page or an error page's text.
const MAX_BODY: usize = 1024 * 1024;

/// One answer, read as far as the step needed.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body (an event stream's raw bytes too), at most [`MAX_BODY`].
    pub body: Bytes,
    /// An event stream's events with data, in order (empty for any other answer).
    pub events: Vec<Event>,
    /// The budget ran out while the body was still coming (normal for an event stream).
    pub cut_by_budget: bool,
    /// Milliseconds from sending to the last byte read.
    pub ms: f64,
}

impl Answer {
    /// The `Content-Type` without parameters, in lower case.
    pub fn media_type(&self) -> Option<String> {
        media_type(&self.headers)
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn is_event_stream(&self) -> bool {
        self.media_type().as_deref() == Some("text/event-stream")
    }
}

/// A `Content-Type`'s media type, without parameters, in lower case.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let media = value.split(';').next().unwrap_or("").trim();
    Some(media.to_ascii_lowercase())
}

pub use crate::sse::Event;

/// Why no answer came.
#[derive(Debug)]
pub enum Failure {
    /// The connection (or its TLS handshake) failed: of `kind`, with the cause as the OS or
    /// rustls said it.
    Connect {
        kind: ConnectErrorKind,
        cause: String,
    },
    /// Connected, but no response head within the budget.
    Timeout,
    /// The server answered something that is not HTTP, or closed before a head.
    Protocol(String),
}

/// A request to send.
pub struct Outgoing<'a> {
    pub method: Method,
    pub uri: &'a Uri,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Option<Bytes>,
}

/// The client, with the operator's own headers (`-H`) added to every request.
pub struct Client {
    inner: Legacy<UpstreamConnector, Full<Bytes>>,
    extra: HeaderMap,
}

impl Client {
    /// A client whose connections (resolve, TCP, TLS) take at most `connect_timeout`; TLS with
    /// `tls` for `https://` URLs.
    pub fn new(
        connect_timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
        extra: HeaderMap,
    ) -> Client {
        let connector = UpstreamConnector::new(connect_timeout, tls);
        let inner = Legacy::builder(TokioExecutor::new())
            // One request per connection: each step measures its own connect.
            .pool_max_idle_per_host(0)
            .build(connector);
        Client { inner, extra }
    }

    /// Sends `out` and reads its answer within `budget`: the head must come in time, the body
    /// is read until it ends, `enough` says so for an event, or the budget runs out.
    pub async fn send(
        &self,
        out: Outgoing<'_>,
        budget: Duration,
        mut enough: impl FnMut(&Event) -> bool,
    ) -> Result<Answer, Failure> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + budget;
        let mut req = Request::builder().method(out.method).uri(out.uri.clone());
        let headers = req.headers_mut().expect("a valid builder");
        for (name, value) in out.headers {
            headers.insert(name, value);
        }
        for (name, value) in &self.extra {
            headers.insert(name.clone(), value.clone());
        }
        let req = req
            .body(Full::new(out.body.unwrap_or_default()))
            .expect("method and URI were validated");
        let resp = match tokio::time::timeout_at(deadline, self.inner.request(req)).await {
            Err(_) => return Err(Failure::Timeout),
            Ok(Err(e)) => return Err(failure(&e)),
            Ok(Ok(resp)) => resp,
        };
        let (parts, mut body) = resp.into_parts();
        let sse = media_type(&parts.headers).as_deref() == Some("text/event-stream");
        let mut bytes = BytesMut::new();
        let mut parser = crate::sse::Parser::new(MAX_BODY);
        let mut events = Vec::new();
        let mut cut_by_budget = false;
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    cut_by_budget = true;
                    break;
                }
                Ok(None) | Ok(Some(Err(_))) => break,
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let room = MAX_BODY.saturating_sub(bytes.len());
            bytes.extend_from_slice(&data[..data.len().min(room)]);
            if sse {
                // Events with data only: a priming event (an id alone) says nothing to a probe.
                let mut fresh = parser.events(&data);
                fresh.retain(|e| e.has_data);
                let done = fresh.iter().any(&mut enough);
                events.extend(fresh);
                if done {
                    break;
                }
            }
            if bytes.len() >= MAX_BODY {
                break;
            }
        }
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: bytes.freeze(),
            events,
            cut_by_budget,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// What a failed request says, in holdfast's terms (the classifier's own cause search).
fn failure(e: &hyper_util::client::legacy::Error) -> Failure {
    match crate::errors::find_cause::<ConnectError>(e) {
        // The cause without holdfast's own "connecting to the upstream failed" prefix.
        Some(connect) => Failure::Connect {
            kind: connect.kind(),
            cause: std::error::Error::source(connect)
                .map(|c| ErrorChain(c).to_string())
                .unwrap_or_default(),
        },
        None => Failure::Protocol(ErrorChain(e).to_string()),
    }
}
