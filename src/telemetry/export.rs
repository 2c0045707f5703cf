//! Getting finished spans to the collector without a request ever waiting for it.
//!
//! A span that ends is put on a bounded queue ([`Queue`], the SDK's span processor) with one
//! `try_send`: when the queue is full the span is dropped and counted, never waited for. One
//! task ([`Exporter::run`]) takes spans off in batches and POSTs them (OTLP/HTTP, protobuf)
//! through holdfast's own HTTP client: the upstream connector's TCP and TLS, under
//! `tracing.export_timeout_secs`. A batch that fails is counted and let go: retrying would keep
//! a broken collector's spans in memory, and a trace missing spans is better than a proxy that
//! grows.
//!
//! Not the SDK's batch processor: it runs a thread of its own and blocks it on each export,
//! which a tokio HTTP client cannot run in, and it counts what it drops only in a log line.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client as Legacy;
use hyper_util::rt::TokioExecutor;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};

use crate::errors::BoxError;
use crate::metrics::SpanCounts;
use crate::upstream::UpstreamConnector;

/// Most spans in one export: what the SDK's batch processor sends at most, a POST of a few
/// hundred KiB.
const MAX_BATCH: usize = 512;

/// How long a batch waits for more spans after its first: exports stay few under load, and a
/// span reaches the collector within a second when there is little of it.
const BATCH_WAIT: Duration = Duration::from_secs(1);

/// Most bytes of a collector's answer read: it is a small protobuf, or an error page.
const MAX_ANSWER: usize = 64 * 1024;

/// The span processor: ended spans onto the queue, or dropped and counted.
#[derive(Debug)]
pub(super) struct Queue {
    spans: mpsc::Sender<SpanData>,
    counts: SpanCounts,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.counts.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The task that exports what the queue holds.
pub(super) struct Exporter<E> {
    spans: mpsc::Receiver<SpanData>,
    /// A flush asked (holdfast is stopping): everything queued is exported, then answered.
    flushes: mpsc::Receiver<oneshot::Sender<()>>,
    exporter: E,
    counts: SpanCounts,
}

/// Asks the exporter task to export what is queued now.
#[derive(Debug, Clone)]
pub(super) struct Flush(mpsc::Sender<oneshot::Sender<()>>);

impl Flush {
    /// Exports what is queued, within `within`: false if that did not finish in time.
    pub(super) async fn now(&self, within: Duration) -> bool {
        let (done, finished) = oneshot::channel();
        if self.0.send(done).await.is_err() {
            return false;
        }
        matches!(tokio::time::timeout(within, finished).await, Ok(Ok(())))
    }
}

/// A queue of `size` spans, the task that empties it through `exporter`, and its flush handle.
pub(super) fn queue<E: SpanExporter + 'static>(
    size: usize,
    exporter: E,
    counts: SpanCounts,
) -> (Queue, Exporter<E>, Flush) {
    let (tx, spans) = mpsc::channel(size);
    let (flush, flushes) = mpsc::channel(1);
    let queue = Queue {
        spans: tx,
        counts: counts.clone(),
    };
    let task = Exporter {
        spans,
        flushes,
        exporter,
        counts,
    };
    (queue, task, Flush(flush))
}

impl<E: SpanExporter> Exporter<E> {
    /// Exports batches until the queue's sender is gone.
    pub(super) async fn run(mut self) {
        loop {
            tokio::select! {
                first = self.spans.recv() => {
                    let Some(first) = first else { return };
                    let batch = self.gather(first).await;
                    self.export(batch).await;
                }
                Some(done) = self.flushes.recv() => {
                    let mut batch = Vec::new();
                    while let Ok(span) = self.spans.try_recv() {
                        batch.push(span);
                        if batch.len() == MAX_BATCH {
                            self.export(std::mem::take(&mut batch)).await;
                        }
                    }
                    if !batch.is_empty() {
                        self.export(batch).await;
                    }
                    let _ = done.send(());
                }
            }
        }
    }

    /// `first` and what else arrives within [`BATCH_WAIT`], up to [`MAX_BATCH`].
    async fn gather(&mut self, first: SpanData) -> Vec<SpanData> {
        let mut batch = vec![first];
        let wait = tokio::time::sleep(BATCH_WAIT);
        tokio::pin!(wait);
        while batch.len() < MAX_BATCH {
            tokio::select! {
                () = &mut wait => break,
                span = self.spans.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
            }
        }
        batch
    }

    async fn export(&mut self, batch: Vec<SpanData>) {
        let n = batch.len() as u64;
        match self.exporter.export(batch).await {
            Ok(()) => {
                self.counts.exported.inc_by(n);
            }
            Err(error) => {
                self.counts.failed.inc_by(n);
                tracing::warn!(spans = n, %error, "exporting spans failed; they are dropped");
            }
        }
    }
}

/// holdfast's HTTP client for the exporter: the upstream connector (the same resolution, TCP
/// and TLS), a pool of its own, a time limit on the whole exchange.
pub(super) struct Sender {
    client: Legacy<UpstreamConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Sender {
    /// A client that connects with `tls` (an `https://` endpoint) and gives each POST
    /// `timeout`, its answer included.
    pub(super) fn new(
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
        timeout: Duration,
    ) -> Self {
        let connector = UpstreamConnector::new(timeout, tls);
        let client = Legacy::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .build(connector);
        Sender { client, timeout }
    }

    /// POSTs `body` (an encoded ExportTraceServiceRequest) to `uri` with `headers`: the status
    /// the collector answered, its body read (at most [`MAX_ANSWER`]) and let go.
    pub(super) async fn post(
        &self,
        uri: &http::Uri,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<http::StatusCode, BoxError> {
        let mut request = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))?;
        request.headers_mut().extend(headers.clone());
        let exchange = async {
            let answer = self.client.request(request).await?;
            let status = answer.status();
            Limited::new(answer.into_body(), MAX_ANSWER)
                .collect()
                .await?;
            Ok::<_, BoxError>(status)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {:?}", self.timeout).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::{Arc, Mutex};

    /// An exporter that keeps what it was given, or fails every export.
    #[derive(Debug, Clone, Default)]
    struct Kept {
        spans: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.fail {
                return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "collector down".into(),
                ));
            }
            let mut spans = self.spans.lock().unwrap();
            spans.extend(batch.into_iter().map(|s| s.name.into_owned()));
            Ok(())
        }
    }

    fn tracer(queue: Queue) -> (SdkTracerProvider, opentelemetry_sdk::trace::SdkTracer) {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .build();
        let tracer = provider.tracer("test");
        (provider, tracer)
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_and_a_flush_exports_the_rest() {
        let kept = Kept::default();
        let counts = SpanCounts::default();
        let (queue, task, flush) = queue(2, kept.clone(), counts.clone());
        let (_provider, tracer) = tracer(queue);
        for name in ["a", "b", "c"] {
            tracer.start(name).end();
        }
        // The third found the queue full, before the task took anything.
        assert_eq!(counts.dropped.get(), 1);
        let _task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(task.run()));
        assert!(flush.now(Duration::from_secs(5)).await);
        assert_eq!(*kept.spans.lock().unwrap(), ["a", "b"]);
        assert_eq!(counts.exported.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_goes_after_its_wait_and_a_failed_one_is_counted_not_kept() {
        let kept = Kept {
            fail: true,
            ..Kept::default()
        };
        let counts = SpanCounts::default();
        let (queue, task, _flush) = queue(16, kept.clone(), counts.clone());
        let (_provider, tracer) = tracer(queue);
        let _task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(task.run()));
        tracer.start("a").end();
        tracer.start("b").end();
        // Paused time: the task gathers for BATCH_WAIT, then exports once.
        tokio::time::sleep(BATCH_WAIT + Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert_eq!(counts.failed.get(), 2);
        assert_eq!(counts.exported.get(), 0);
        assert!(kept.spans.lock().unwrap().is_empty());
    }
}
