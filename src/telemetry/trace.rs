//! OpenTelemetry traces (`[tracing] enabled`): one server span per client request, a client
//! span per upstream attempt under it, and events for what holdfast did in between.
//!
//! With tracing off nothing here runs: the proxy holds no [`Tracing`], a request no
//! [`RequestSpan`], and a client's `traceparent` passes to the server untouched. With it on,
//! the client's W3C `traceparent`/`tracestate` is continued (a request without one starts a
//! trace, sampled at `tracing.sample_ratio`; a client's sampled flag decides for its own), and
//! each attempt carries its own span's `traceparent` to the server, so the server's spans hang
//! under the attempt that reached it.
//!
//! Attribute names follow the OpenTelemetry HTTP conventions (`http.request.method`,
//! `http.response.status_code`, `http.request.resend_count`, `error.type`, ...) and the MCP ones
//! (`mcp.method.name`, `gen_ai.tool.name`), with values as bounded as the metrics' labels: the
//! MCP method from the known set, a tool's name only when holdfast knows the tool by name.
//! holdfast's own are under `holdfast.`. A span's name is its MCP method (and known tool:
//! `tools/call add`) once that is read, else the HTTP method, as both conventions say.

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span};
use opentelemetry_sdk::Resource;
use tokio_util::task::AbortOnDropHandle;

use super::export::{self, Flush};
use super::otlp;
use crate::config;
use crate::metrics::SpanCounts;

/// Where spans go when neither `tracing.endpoint` nor an `OTEL_EXPORTER_OTLP_*` variable says:
/// a collector on the same host or pod, as the OTLP specification's default.
const DEFAULT_ENDPOINT: &str = "http://localhost:4318/v1/traces";

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "the OTLP endpoint {endpoint:?} (from {from}) is not an http:// or https:// URL: {why}"
    )]
    Endpoint {
        endpoint: String,
        from: &'static str,
        why: String,
    },
    #[error("the system's CA certificates for the https:// OTLP endpoint")]
    Roots(#[source] crate::tls::TlsError),
    #[error("{0}")]
    Headers(String),
}

/// Tracing, on: the tracer, and the task exporting its spans (stopped when this is dropped).
pub struct Tracing {
    tracer: SdkTracer,
    /// Kept: the tracer's processor lives in it.
    _provider: SdkTracerProvider,
    propagator: TraceContextPropagator,
    flush: Flush,
    /// Where spans go, for the start's log line.
    endpoint: http::Uri,

    _exporter: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Tracing {
    /// Starts tracing as `cfg` says (the exporter task on the current runtime), counting spans
    /// in `counts`.
    pub fn start(cfg: &config::Tracing, counts: SpanCounts) -> Result<Tracing, TraceError> {
        let endpoint = endpoint(cfg.endpoint.as_ref(), |name| std::env::var(name).ok())?;
        let tls = match endpoint.scheme_str() {
            Some("https") => {
                let roots = crate::tls::system_roots().map_err(TraceError::Roots)?;
                let trust = crate::tls::Trust::Roots(roots);
                Some(crate::tls::client_config(trust, None, false))
            }
            _ => None,
        };
        let headers =
            otlp::env_headers(|name| std::env::var(name).ok()).map_err(TraceError::Headers)?;
        let resource = resource(cfg.service_name.as_deref());
        let sender = export::Sender::new(tls, cfg.export_timeout);
        let exporter = otlp::Otlp::new(endpoint.clone(), headers, sender, &resource);
        let (queue, task, flush) = export::queue(cfg.queue_size, exporter, counts);
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        Ok(Tracing {
            tracer: provider.tracer("holdfast"),
            _provider: provider,
            propagator: TraceContextPropagator::new(),
            flush,
            endpoint,

            _exporter: AbortOnDropHandle::new(tokio::spawn(task.run())),
        })
    }

    /// Where spans go.
    pub fn endpoint(&self) -> &http::Uri {
        &self.endpoint
    }

    /// Exports the spans finished so far, within `within` (holdfast is stopping): false if that
    /// did not finish in time.
    pub async fn flush(&self, within: Duration) -> bool {
        self.flush.now(within).await
    }

    /// The server span of a request, begun now: a child of the client's `traceparent` in
    /// `headers`, if it sent one.
    pub fn serve(&self, req: &Incoming<'_>) -> Box<RequestSpan> {
        let parent = self.propagator.extract(&Extracting(req.headers));
        let mut span = self
            .tracer
            .span_builder(http_method_name(req.method))
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        // A span sampled out is not recorded: nothing is made for it (its attributes, the
        // request's tool name) but the context its attempts pass on.
        let recording = span.is_recording();
        if recording {
            span.set_attributes([
                KeyValue::new("http.request.method", method_value(req.method)),
                KeyValue::new("url.path", req.path.to_owned()),
                KeyValue::new("network.protocol.version", protocol_version(req.version)),
                KeyValue::new("client.address", req.client.to_string()),
            ]);
            if let Ok(id) = req.request_id.to_str() {
                span.set_attribute(KeyValue::new("holdfast.request_id", id.to_owned()));
            }
        }
        Box::new(RequestSpan {
            cx: parent.with_span(span),
            attempt: None,
            attempts: 0,
            recording,
        })
    }
}

/// What the server span of a request is begun from.
pub struct Incoming<'a> {
    pub method: &'a Method,
    /// The path, never the query (it may carry tokens).
    pub path: &'a str,
    pub version: Version,
    /// The client, after the trusted proxies in front.
    pub client: IpAddr,
    pub headers: &'a HeaderMap,
    pub request_id: &'a HeaderValue,
}

/// One request's spans: its server span, and the attempt going now.
pub struct RequestSpan {
    /// The server span, as the context its attempts are children of.
    cx: Context,
    attempt: Option<Span>,
    /// Attempts begun so far.
    attempts: u32,
    /// The trace is recorded (sampled in).
    recording: bool,
}

/// See [`RequestSpan::cut_handle`].
pub struct CutHandle {
    cx: Context,
    recording: bool,
}

impl CutHandle {
    /// Ends the server span of a request that got no answer: `status` as counted (499, or 503
    /// for holdfast's drain), `action` as the access log's.
    pub fn cut(self, status: u16, action: &'static str) {
        let span = self.cx.span();
        if self.recording {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            span.set_attribute(KeyValue::new("holdfast.action", action));
            if status >= 500 {
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
                span.set_status(Status::error(""));
            }
        }
        span.end();
    }
}

/// What an attempt's span tells of its end.
pub enum AttemptEnd {
    /// An answer with this status came (a router's or the application's).
    Answered(u16),
    /// No answer: why, as holdfast names it (`connect_refused`, `timeout`, ...).
    Failed(&'static str),
}

/// What the server span tells of the request once its answer is known.
pub struct Answered<'a> {
    /// The status its client got.
    pub status: u16,
    /// How it came to it (the access log's `action`).
    pub action: &'static str,
    pub mcp_method: Option<&'static str>,
    /// A `tools/call`'s tool, bounded as the access log's.
    pub tool: Option<&'a str>,
}

impl RequestSpan {
    /// Records that holdfast did `name` with the request (`held`, `replayed`, ...), with
    /// `attributes`.
    pub fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.cx.span().add_event(name, attributes);
    }

    /// A second handle on the server span, for whoever must end it if this is dropped with the
    /// request unanswered (its client gone, holdfast's drain cut it): the span ends once, with
    /// what the handle says, whichever of the two goes first.
    pub fn cut_handle(&self) -> CutHandle {
        CutHandle {
            cx: self.cx.clone(),
            recording: self.recording,
        }
    }

    /// Whether the trace is recorded: what is told only to a recorded span need not be made
    /// otherwise.
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Begins an attempt's client span (ending the one before, if it is still open) and writes
    /// its `traceparent` (and the trace's `tracestate`) into `headers`, the attempt's request.
    pub fn attempt(
        &mut self,
        tracing: &Tracing,
        method: &Method,
        uri: &http::Uri,
        headers: &mut HeaderMap,
    ) {
        if let Some(mut open) = self.attempt.take() {
            open.end();
        }
        let mut span = tracing
            .tracer
            .span_builder(http_method_name(method))
            .with_kind(SpanKind::Client)
            .start_with_context(&tracing.tracer, &self.cx);
        if self.recording {
            span.set_attributes([
                KeyValue::new("http.request.method", method_value(method)),
                KeyValue::new("url.path", uri.path().to_owned()),
            ]);
            if let Some(host) = uri.host() {
                span.set_attribute(KeyValue::new("server.address", host.to_owned()));
            }
            if let Some(port) = uri.port_u16() {
                span.set_attribute(KeyValue::new("server.port", i64::from(port)));
            }
            if self.attempts > 0 {
                let resends = i64::from(self.attempts);
                span.set_attribute(KeyValue::new("http.request.resend_count", resends));
            }
        }
        self.attempts += 1;
        let cx = Context::new().with_remote_span_context(span.span_context().clone());
        tracing
            .propagator
            .inject_context(&cx, &mut Replacing(headers));
        self.attempt = Some(span);
    }

    /// Ends the attempt going now with `end`.
    pub fn attempt_ended(&mut self, end: AttemptEnd) {
        let Some(mut span) = self.attempt.take() else {
            return;
        };
        if !self.recording {
            return span.end();
        }
        match end {
            AttemptEnd::Answered(status) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                // A client span's 4xx and 5xx are errors (the HTTP conventions).
                if status >= 400 {
                    span.set_attribute(KeyValue::new("error.type", status.to_string()));
                    span.set_status(Status::error(""));
                }
            }
            AttemptEnd::Failed(why) => {
                span.set_attribute(KeyValue::new("error.type", why));
                span.set_status(Status::error(why));
            }
        }
        span.end();
    }

    /// Tells the server span how the request was answered.
    pub fn answered(&mut self, a: &Answered<'_>) {
        if !self.recording {
            return;
        }
        let span = self.cx.span();
        let status = i64::from(a.status);
        span.set_attribute(KeyValue::new("http.response.status_code", status));
        span.set_attribute(KeyValue::new("holdfast.action", a.action));
        // A server span's 5xx is an error; its 4xx is the client's (the HTTP conventions).
        if a.status >= 500 {
            span.set_attribute(KeyValue::new("error.type", a.status.to_string()));
            span.set_status(Status::error(""));
        }
        if let Some(method) = a.mcp_method {
            span.set_attribute(KeyValue::new("mcp.method.name", method));
            let name: Cow<'static, str> = match a.tool {
                Some(tool) => {
                    span.set_attribute(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
                    format!("{method} {tool}").into()
                }
                None => method.into(),
            };
            span.update_name(name);
        }
    }

    /// Ends the request's spans: its answer went out whole (`bytes_out`), or, with `None`,
    /// it was cut.
    pub fn end(mut self: Box<Self>, bytes_out: Option<u64>) {
        if let Some(mut open) = self.attempt.take() {
            open.end();
        }
        let span = self.cx.span();
        if let (Some(bytes), true) = (bytes_out, self.recording) {
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            span.set_attribute(KeyValue::new("http.response.body.size", bytes));
        }
        span.end();
    }
}

/// The client's trace headers, read from its request.
struct Extracting<'a>(&'a HeaderMap);

impl opentelemetry::propagation::Extractor for Extracting<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Headers written in place of any of the same name the client sent; an empty `tracestate`
/// removes the client's instead of sending an empty one.
struct Replacing<'a>(&'a mut HeaderMap);

impl Injector for Replacing<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            return;
        };
        match HeaderValue::try_from(value) {
            Ok(v) if !v.is_empty() => {
                self.0.insert(name, v);
            }
            _ => {
                self.0.remove(name);
            }
        }
    }
}

/// A span's name from an HTTP method: the method for the known ones, `HTTP` for any other (the
/// HTTP conventions: a client's made-up method must not make span names unbounded).
fn http_method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "HTTP",
    }
}

/// `http.request.method`: the method, or `_OTHER` for one HTTP does not define (the HTTP
/// conventions: a client's made-up method must not make the attribute unbounded).
fn method_value(method: &Method) -> &'static str {
    match http_method_name(method) {
        "HTTP" => "_OTHER",
        known => known,
    }
}

fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_2 => "2",
        Version::HTTP_10 => "1.0",
        _ => "1.1",
    }
}

/// `service.name`: `tracing.service_name`, else `OTEL_SERVICE_NAME`, else `holdfast`; and
/// whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
fn resource(service_name: Option<&str>) -> Resource {
    let builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    match service_name {
        Some(name) => builder.with_service_name(name.to_owned()),
        None if std::env::var_os("OTEL_SERVICE_NAME").is_some() => builder,
        None => builder.with_service_name("holdfast"),
    }
    .build()
}

/// The traces URL: `tracing.endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended, else [`DEFAULT_ENDPOINT`] (the
/// OTLP exporter specification's order). Resolved here, not in the exporter, to know whether
/// it needs TLS and to name it in the start's log line.
fn endpoint(
    configured: Option<&http::Uri>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<http::Uri, TraceError> {
    if let Some(uri) = configured {
        return Ok(uri.clone());
    }
    let nonempty = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let (text, from) = if let Some(url) = nonempty("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    } else if let Some(base) = nonempty("OTEL_EXPORTER_OTLP_ENDPOINT") {
        let base = base.trim().trim_end_matches('/').to_owned();
        (format!("{base}/v1/traces"), "OTEL_EXPORTER_OTLP_ENDPOINT")
    } else {
        (DEFAULT_ENDPOINT.to_owned(), "the default")
    };
    config::parse_tracing_endpoint(&text).map_err(|why| TraceError::Endpoint {
        endpoint: text,
        from,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_comes_from_the_config_then_the_otel_variables_then_the_default() {
        let said: http::Uri = "http://c:1/x".parse().unwrap();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                let found = pairs.iter().find(|(n, _)| *n == name);
                found.map(|(_, v)| (*v).to_owned())
            }
        };
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:2/custom"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://b:3/"),
        ]);
        assert_eq!(endpoint(Some(&said), both).unwrap(), said);
        assert_eq!(endpoint(None, both).unwrap(), "http://t:2/custom");
        let base = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://b:3/")]);
        assert_eq!(endpoint(None, base).unwrap(), "https://b:3/v1/traces");
        assert_eq!(endpoint(None, env(&[])).unwrap(), DEFAULT_ENDPOINT);
        let bad = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]);
        let e = endpoint(None, bad).unwrap_err().to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
    }

    #[test]
    fn an_injected_tracestate_replaces_the_clients_or_removes_it_when_empty() {
        let mut headers = HeaderMap::new();
        headers.insert("tracestate", HeaderValue::from_static("client=1"));
        Replacing(&mut headers).set("tracestate", String::new());
        assert!(headers.get("tracestate").is_none());
        Replacing(&mut headers).set("traceparent", "00-ab-cd-01".into());
        assert_eq!(headers["traceparent"], "00-ab-cd-01");
    }

    #[test]
    fn made_up_methods_do_not_name_spans() {
        let custom = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(http_method_name(&custom), "HTTP");
        assert_eq!(http_method_name(&Method::POST), "POST");
    }
}
