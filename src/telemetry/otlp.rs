//! OTLP/HTTP trace export, protobuf encoded here, straight from the SDK's finished spans.
//!
//! Not `opentelemetry-otlp`: its exporter converts each span into the generated protobuf types
//! (every attribute's key and value copied again, the resource's attributes cloned per batch)
//! and prost then walks that tree for lengths at every level. Measured with tracing on
//! (benches/RESULTS.md, 2026-12-06 eighth session): 33k instructions per proxied request went to
//! that conversion and encoding alone, about as much as proxying the request. This encoder
//! writes the same `ExportTraceServiceRequest` in one pass over the spans, with the resource and
//! scope encoded once at start; the tests decode it with the official definitions
//! (tests/python/otlp_receiver.py, `opentelemetry-proto` from PyPI).
//!
//! The messages written (opentelemetry/proto/collector/trace/v1, trace/v1, common/v1,
//! resource/v1): ExportTraceServiceRequest{1: ResourceSpans}; ResourceSpans{1: Resource,
//! 2: ScopeSpans}; Resource{1: KeyValue}; ScopeSpans{1: InstrumentationScope, 2: Span};
//! InstrumentationScope{1: name, 2: version}; Span{1: trace_id, 2: span_id, 3: trace_state,
//! 4: parent_span_id, 5: name, 6: kind, 7: start (fixed64), 8: end (fixed64), 9: KeyValue,
//! 10: dropped attributes, 11: Event, 12: dropped events, 15: Status, 16: flags (fixed32)};
//! Event{1: time (fixed64), 2: name, 3: KeyValue, 4: dropped attributes}; Status{2: message,
//! 3: code}; KeyValue{1: key, 2: AnyValue}; AnyValue{1: string, 2: bool, 3: int64, 4: double,
//! 5: ArrayValue{1: AnyValue}}. holdfast makes no span links, so none are written.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::export::Sender;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`: whether the
/// parent is known to be remote, and is.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// A protobuf message being written.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire)));
    }

    /// A length-delimited field: bytes, a string. Empty ones are left out (proto3's default).
    fn bytes(&mut self, field: u32, b: &[u8]) {
        if !b.is_empty() {
            self.key(field, LEN);
            self.varint(b.len() as u64);
            self.buf.extend_from_slice(b);
        }
    }

    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, VARINT);
            self.varint(v);
        }
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn fixed32(&mut self, field: u32, v: u32) {
        self.key(field, FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A nested message written by `f`; its length goes before it once it is known (the
    /// message's bytes move by the length's few bytes: cheaper than measuring it first).
    fn message(&mut self, field: u32, f: impl FnOnce(&mut Writer)) {
        self.key(field, LEN);
        let start = self.buf.len();
        f(self);
        let mut len = (self.buf.len() - start) as u64;
        let mut head = [0u8; 10];
        let mut n = 0;
        while len >= 0x80 {
            head[n] = (len as u8) | 0x80;
            len >>= 7;
            n += 1;
        }
        head[n] = len as u8;
        n += 1;
        let end = self.buf.len();
        self.buf.resize(end + n, 0);
        self.buf.copy_within(start..end, start + n);
        self.buf[start..start + n].copy_from_slice(&head[..n]);
    }

    fn key_value(&mut self, field: u32, kv: &KeyValue) {
        self.message(field, |w| {
            w.bytes(1, kv.key.as_str().as_bytes());
            w.message(2, |w| w.any_value(&kv.value));
        });
    }

    fn any_value(&mut self, value: &Value) {
        match value {
            Value::String(s) => {
                // Written even when empty: an attribute's empty string is a value.
                self.key(1, LEN);
                self.varint(s.as_str().len() as u64);
                self.buf.extend_from_slice(s.as_str().as_bytes());
            }
            Value::Bool(b) => {
                self.key(2, VARINT);
                self.varint(u64::from(*b));
            }
            Value::I64(i) => {
                self.key(3, VARINT);
                self.varint(*i as u64);
            }
            Value::F64(f) => self.fixed64(4, f.to_bits()),
            Value::Array(array) => self.message(5, |w| w.array(array)),
            // A kind of value a later API adds: written as its text, never lost.
            other => {
                let text = other.to_string();
                self.key(1, LEN);
                self.varint(text.len() as u64);
                self.buf.extend_from_slice(text.as_bytes());
            }
        }
    }

    fn array(&mut self, array: &Array) {
        match array {
            Array::Bool(v) => v
                .iter()
                .for_each(|b| self.message(1, |w| w.any_value(&Value::Bool(*b)))),
            Array::I64(v) => v
                .iter()
                .for_each(|i| self.message(1, |w| w.any_value(&Value::I64(*i)))),
            Array::F64(v) => v
                .iter()
                .for_each(|f| self.message(1, |w| w.any_value(&Value::F64(*f)))),
            Array::String(v) => v.iter().for_each(|s| {
                self.message(1, |w| {
                    w.key(1, LEN);
                    w.varint(s.as_str().len() as u64);
                    w.buf.extend_from_slice(s.as_str().as_bytes());
                })
            }),
            other => {
                let text = Value::Array(other.clone()).to_string();
                self.message(1, |w| w.any_value(&Value::from(text)));
            }
        }
    }

    fn span(&mut self, span: &SpanData) {
        let cx = &span.span_context;
        self.bytes(1, &cx.trace_id().to_bytes());
        self.bytes(2, &cx.span_id().to_bytes());
        self.bytes(3, cx.trace_state().header().as_bytes());
        if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
            self.bytes(4, &span.parent_span_id.to_bytes());
        }
        self.bytes(5, span.name.as_bytes());
        self.uint(6, kind(&span.span_kind));
        self.fixed64(7, nanos(span.start_time));
        self.fixed64(8, nanos(span.end_time));
        for kv in &span.attributes {
            self.key_value(9, kv);
        }
        self.uint(10, u64::from(span.dropped_attributes_count));
        for event in &span.events.events {
            self.message(11, |w| {
                w.fixed64(1, nanos(event.timestamp));
                w.bytes(2, event.name.as_bytes());
                for kv in &event.attributes {
                    w.key_value(3, kv);
                }
                w.uint(4, u64::from(event.dropped_attributes_count));
            });
        }
        self.uint(12, u64::from(span.events.dropped_count));
        self.message(15, |w| match &span.status {
            Status::Unset => {}
            Status::Ok => w.uint(3, 1),
            Status::Error { description } => {
                w.bytes(2, description.as_bytes());
                w.uint(3, 2);
            }
        });
        let remote = if span.parent_span_is_remote {
            IS_REMOTE
        } else {
            0
        };
        let flags = u32::from(cx.trace_flags().to_u8()) | HAS_IS_REMOTE | remote;
        self.fixed32(16, flags);
    }
}

/// A span kind's number in the protocol.
fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn nanos(t: SystemTime) -> u64 {
    let since = t.duration_since(SystemTime::UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What every batch starts with, encoded once: the resource, and the scope of holdfast's spans.
struct Preamble {
    /// `Resource` (field 1 of ResourceSpans), key and length included.
    resource: Vec<u8>,
    /// `InstrumentationScope` (field 1 of ScopeSpans), key and length included.
    scope: Vec<u8>,
}

impl Preamble {
    fn new(resource: &Resource, scope: &str, version: &str) -> Preamble {
        let mut r = Writer::default();
        r.message(1, |w| {
            for (key, value) in resource.iter() {
                w.key_value(1, &KeyValue::new(key.clone(), value.clone()));
            }
        });
        let mut s = Writer::default();
        s.message(1, |w| {
            w.bytes(1, scope.as_bytes());
            w.bytes(2, version.as_bytes());
        });
        Preamble {
            resource: r.buf,
            scope: s.buf,
        }
    }
}

/// One `ExportTraceServiceRequest` of `spans`.
fn encode(preamble: &Preamble, spans: &[SpanData]) -> Vec<u8> {
    let mut w = Writer {
        buf: Vec::with_capacity(256 + spans.len() * 512),
    };
    w.message(1, |w| {
        w.buf.extend_from_slice(&preamble.resource);
        w.message(2, |w| {
            w.buf.extend_from_slice(&preamble.scope);
            for span in spans {
                w.message(2, |w| w.span(span));
            }
        });
    });
    w.buf
}

/// The exporter: batches encoded here, POSTed to the traces URL.
pub(super) struct Otlp {
    endpoint: http::Uri,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`, sent with every export.
    headers: HeaderMap,
    sender: Sender,
    preamble: Preamble,
}

impl std::fmt::Debug for Otlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Otlp")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Otlp {
    /// Exports to `endpoint` through `sender`, with `headers`, the spans of `resource`.
    pub(super) fn new(
        endpoint: http::Uri,
        headers: HeaderMap,
        sender: Sender,
        resource: &Resource,
    ) -> Otlp {
        Otlp {
            endpoint,
            headers,
            sender,
            preamble: Preamble::new(resource, "holdfast", env!("CARGO_PKG_VERSION")),
        }
    }
}

impl SpanExporter for Otlp {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = Bytes::from(encode(&self.preamble, &batch));
        drop(batch);
        let status = self
            .sender
            .post(&self.endpoint, &self.headers, body)
            .await
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        if status.is_success() {
            Ok(())
        } else {
            Err(OTelSdkError::InternalFailure(format!(
                "the collector answered {status}"
            )))
        }
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The headers of `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`, as
/// the OTLP exporter specification writes them: `key=value,key2=value2`, values URL-encoded.
pub(super) fn env_headers(env: impl Fn(&str) -> Option<String>) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    let (name, text) = match env("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
        Some(t) => ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", t),
        None => match env("OTEL_EXPORTER_OTLP_HEADERS") {
            Some(t) => ("OTEL_EXPORTER_OTLP_HEADERS", t),
            None => return Ok(headers),
        },
    };
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("{name}: {pair:?} is not key=value with a header name and value");
        let (key, value) = pair.split_once('=').ok_or_else(bad)?;
        let key = HeaderName::from_bytes(key.trim().as_bytes()).map_err(|_| bad())?;
        let value = percent_decode(value.trim()).ok_or_else(bad)?;
        let value = HeaderValue::from_str(&value).map_err(|_| bad())?;
        headers.append(key, value);
    }
    Ok(headers)
}

/// `%XX` escapes decoded; `None` for a broken escape or what is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_lengths_are_protobufs() {
        let mut w = Writer::default();
        w.varint(300);
        assert_eq!(w.buf, [0xac, 0x02]);
        // A nested message longer than 127 bytes gets a two-byte length before it.
        let mut w = Writer::default();
        w.message(3, |w| w.bytes(1, &[7; 200]));
        assert_eq!(&w.buf[..5], &[3 << 3 | 2, 0xcb, 0x01, 1 << 3 | 2, 0xc8]);
        assert_eq!(w.buf.len(), 5 + 1 + 200);
        // Negative integers are ten-byte two's complement varints.
        let mut w = Writer::default();
        w.any_value(&Value::I64(-1));
        assert_eq!(w.buf.len(), 1 + 10);
    }

    #[test]
    fn exporter_headers_come_from_the_otel_variables_decoded() {
        let env = |traces: Option<&'static str>, all: Option<&'static str>| {
            move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS" => traces.map(str::to_owned),
                "OTEL_EXPORTER_OTLP_HEADERS" => all.map(str::to_owned),
                _ => None,
            }
        };
        let h = env_headers(env(None, Some("api-key=a%20b, x-team = core"))).unwrap();
        assert_eq!(h["api-key"], "a b");
        assert_eq!(h["x-team"], "core");
        let h = env_headers(env(Some("only=this"), Some("api-key=x"))).unwrap();
        assert_eq!(h.len(), 1);
        let e = env_headers(env(None, Some("novalue"))).unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{e}");
        assert!(env_headers(env(None, Some("k=%zz"))).is_err());
    }
}
