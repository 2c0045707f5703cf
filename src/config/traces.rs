//! `[tracing]`: OpenTelemetry traces (src/telemetry/trace.rs), off unless `enabled`.
//!
//! Only what holdfast decides is here. Where spans go when `endpoint` is not said, and the
//! exporter's extra headers (an API key), come from the standard `OTEL_EXPORTER_OTLP_*`
//! variables as every OpenTelemetry SDK reads them; the service's name from `OTEL_SERVICE_NAME`
//! when `service_name` is not said.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// Spans kept waiting for export when nothing says otherwise: a few seconds of a busy sidecar's
/// requests (each is 1 span plus 1 per attempt), a few hundred KiB at most.
pub const DEFAULT_QUEUE: usize = 2048;

/// Most spans that may wait: beyond this, a stuck collector would cost real memory.
const MAX_QUEUE: usize = 1 << 20;

/// `[tracing]` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTracing {
    /// Export spans at all.
    pub enabled: bool,
    /// The OTLP/HTTP traces URL, whole (`http://collector:4318/v1/traces`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The share of traces started here that are recorded, 0 to 1. A client's sampled flag
    /// decides for a trace it began.
    pub sample_ratio: f64,
    /// `service.name` of holdfast's spans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Most finished spans waiting for export; more are dropped and counted.
    pub queue_size: usize,
    /// Longest one export (a batch's POST, its answer included) may take.
    #[serde(deserialize_with = "super::duration::secs")]
    pub export_timeout_secs: f64,
}

impl Default for RawTracing {
    fn default() -> Self {
        RawTracing {
            enabled: false,
            endpoint: None,
            sample_ratio: 1.0,
            service_name: None,
            queue_size: DEFAULT_QUEUE,
            export_timeout_secs: 10.0,
        }
    }
}

/// Validated `[tracing]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    pub enabled: bool,
    /// `None`: the `OTEL_EXPORTER_OTLP_*` variables, else `http://localhost:4318/v1/traces`.
    pub endpoint: Option<http::Uri>,
    pub sample_ratio: f64,
    pub service_name: Option<String>,
    pub queue_size: usize,
    pub export_timeout: Duration,
}

impl Default for Tracing {
    fn default() -> Self {
        Tracing {
            enabled: false,
            endpoint: None,
            sample_ratio: 1.0,
            service_name: None,
            queue_size: DEFAULT_QUEUE,
            export_timeout: Duration::from_secs(10),
        }
    }
}

/// An OTLP/HTTP endpoint: an absolute `http` or `https` URL.
pub fn parse_endpoint(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("expected a URL such as http://collector:4318/v1/traces: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!(
            "expected an http:// or https:// URL with a host, such as \
             http://collector:4318/v1/traces, got {text:?}"
        )),
    }
}

impl Validator<'_> {
    /// Checks `[tracing]`; `None` when a problem was recorded.
    pub(super) fn tracing(&mut self, raw: &RawTracing) -> Option<Tracing> {
        let endpoint = match raw.endpoint.as_deref().map(parse_endpoint) {
            None => None,
            Some(Ok(uri)) => Some(uri),
            Some(Err(e)) => return self.fail("tracing.endpoint", e),
        };
        if !(0.0..=1.0).contains(&raw.sample_ratio) {
            let got = raw.sample_ratio;
            return self.fail(
                "tracing.sample_ratio",
                format!("expected a share from 0 to 1 (0.1 records one trace in ten), got {got}"),
            );
        }
        if !(1..=MAX_QUEUE).contains(&raw.queue_size) {
            let got = raw.queue_size;
            return self.fail(
                "tracing.queue_size",
                format!("expected 1 to {MAX_QUEUE} spans, got {got}"),
            );
        }
        let service_name = match raw.service_name.as_deref().map(str::trim) {
            Some("") => return self.fail("tracing.service_name", "is empty".into()),
            name => name.map(str::to_owned),
        };
        let export_timeout = self.secs("tracing.export_timeout_secs", raw.export_timeout_secs)?;
        Some(Tracing {
            enabled: raw.enabled,
            endpoint,
            sample_ratio: raw.sample_ratio,
            service_name,
            queue_size: raw.queue_size,
            export_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_an_absolute_http_url() {
        let uri = parse_endpoint(" https://otel.example:4318/v1/traces ").unwrap();
        assert_eq!(uri.host(), Some("otel.example"));
        for bad in [
            "collector:4318",
            "/v1/traces",
            "grpc://c:4317",
            "http://",
            "",
        ] {
            let e = parse_endpoint(bad).unwrap_err();
            assert!(e.contains("expected"), "{bad:?}: {e}");
        }
    }
}
