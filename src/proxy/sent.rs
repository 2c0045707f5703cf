//! An answer's body on its way to the client, watched to its end for what is told of a request
//! only then: its access-log line (with the bytes that went out), an event stream's end (how
//! long it lived, its events, why it ended), and the end of its trace's server span.
//!
//! Only with the access log or tracing on: otherwise the answer goes out as it is.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use opentelemetry::KeyValue;
use tokio::time::Instant;

use super::access::{StreamEnded, Tail};
use super::body::{IdleTimeout, ProxyBody};
use super::ending::{Ending, Phase};
use crate::errors::BoxError;
use crate::telemetry::trace::RequestSpan;

/// Why an event stream ended, as its line and its span say. A bounded set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The server ended it.
    UpstreamEnded,
    /// holdfast's shutdown ended it (cleanly: the client may resume it elsewhere).
    Shutdown,
    /// No event arrived within `streams.idle_timeout_secs`.
    IdleTimeout,
    /// Reading it from the server failed.
    UpstreamError,
    /// The client went away.
    ClientGone,
}

impl StreamEnd {
    /// The `reason` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamEnd::UpstreamEnded => "upstream_ended",
            StreamEnd::Shutdown => "shutdown",
            StreamEnd::IdleTimeout => "idle_timeout",
            StreamEnd::UpstreamError => "upstream_error",
            StreamEnd::ClientGone => "client_gone",
        }
    }

    /// Why a stream that failed with `error` ended.
    fn of_error(error: &BoxError) -> StreamEnd {
        if error.is::<IdleTimeout>() {
            StreamEnd::IdleTimeout
        } else {
            StreamEnd::UpstreamError
        }
    }
}

/// Room kept per line while counting a stream's events: the count needs no field's value.
const EVENT_LINE_CAP: usize = 16;

/// An event stream being counted.
struct Counted {
    opened: Instant,
    events: crate::sse::Parser,
    count: u64,
    ending: Arc<Ending>,
}

/// What is told when the body ends.
struct Ends {
    access: Option<Tail>,
    span: Option<Box<RequestSpan>>,
    /// An event stream's count.
    stream: Option<Box<Counted>>,
}

impl Ends {
    /// Tells the end: `bytes_out` went to the client, and the body ended for `end` (for
    /// anything but a stream, only whether it went out whole matters).
    fn tell(self, bytes_out: u64, end: StreamEnd) {
        let stream = self.stream.map(|s| StreamEnded {
            // A clean end while holdfast shuts down is holdfast's doing.
            reason: match end {
                StreamEnd::UpstreamEnded if s.ending.phase() > Phase::Serving => {
                    StreamEnd::Shutdown
                }
                end => end,
            }
            .as_str(),
            events: s.count,
            lived: s.opened.elapsed(),
        });
        if let Some(span) = self.span {
            if let (Some(s), true) = (&stream, span.is_recording()) {
                let attributes = vec![
                    KeyValue::new("holdfast.reason", s.reason),
                    KeyValue::new(
                        "holdfast.events",
                        i64::try_from(s.events).unwrap_or(i64::MAX),
                    ),
                ];
                span.event("stream ended", attributes);
            }
            let whole = stream.is_some() || end == StreamEnd::UpstreamEnded;
            span.end(whole.then_some(bytes_out));
        }
        if let Some(tail) = self.access {
            tail.write(bytes_out, stream.as_ref());
        }
    }
}

/// The answer `resp`, watched to its end for the access log's `tail` and the trace's `span`
/// (an event stream's when `is_sse`). With neither, `resp` as it is.
pub(super) fn watched(
    resp: Response<ProxyBody>,
    access: Option<Tail>,
    span: Option<Box<RequestSpan>>,
    is_sse: bool,
    ending: &Arc<Ending>,
) -> Response<ProxyBody> {
    if access.is_none() && span.is_none() {
        return resp;
    }
    let stream = is_sse.then(|| {
        Box::new(Counted {
            opened: Instant::now(),
            events: crate::sse::Parser::new(EVENT_LINE_CAP),
            count: 0,
            ending: ending.clone(),
        })
    });
    let ends = Ends {
        access,
        span,
        stream,
    };
    resp.map(|inner| {
        Sent {
            inner,
            bytes_out: 0,
            ends: Some(ends),
        }
        .boxed_unsync()
    })
}

pin_project_lite::pin_project! {
    /// An answer's body on its way to the client, counted; what is told at its end is told
    /// when it ends or is dropped.
    struct Sent {
        #[pin]
        inner: ProxyBody,
        bytes_out: u64,
        ends: Option<Ends>,
    }

    impl PinnedDrop for Sent {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped before its end: the client went away (or its connection did).
            if let Some(ends) = this.ends.take() {
                ends.tell(*this.bytes_out, StreamEnd::ClientGone);
            }
        }
    }
}

impl Body for Sent {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        let end = match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    *this.bytes_out += data.len() as u64;
                    if let Some(stream) = this.ends.as_mut().and_then(|e| e.stream.as_mut()) {
                        let count = &mut stream.count;
                        stream.events.feed(data, |_| *count += 1);
                    }
                }
                // The connection may never poll again once the body says it has ended.
                this.inner
                    .is_end_stream()
                    .then_some(StreamEnd::UpstreamEnded)
            }
            Some(Err(e)) => Some(StreamEnd::of_error(e)),
            None => Some(StreamEnd::UpstreamEnded),
        };
        if let Some(end) = end {
            if let Some(ends) = this.ends.take() {
                ends.tell(*this.bytes_out, end);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stream_ends_are_named() {
        let idle: BoxError = Box::new(IdleTimeout(Duration::from_secs(1)));
        assert_eq!(StreamEnd::of_error(&idle), StreamEnd::IdleTimeout);
        let other: BoxError = "reset".into();
        assert_eq!(StreamEnd::of_error(&other).as_str(), "upstream_error");
    }
}
