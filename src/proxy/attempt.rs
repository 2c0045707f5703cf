//! One attempt at the upstream: send, peek where a signature could match, classify. The
//! [`Upstream`] owns what that takes: the client, how answers are read, the response timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use http::header::CONTENT_LENGTH;
use http::StatusCode;
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::answer::{Answer, Peeked};
use super::{Reading, Target};
use crate::classify::{self, FailReason, Outcome, Verdict};
use crate::errors::{find_cause, ErrorChain};
use crate::hold::{OutageRoutes, RouteOutage};
use crate::replay::ReplayBody;
use crate::upstream::{Client, SendError, UpstreamBody};

/// The upstream as one attempt meets it.
pub(super) struct Upstream {
    pub(super) client: Arc<Client>,
    /// How its answers are read: what the classifier is given.
    pub(super) reading: Reading,
    /// `client.response_timeout_secs`: the wait for a response head after the upload.
    pub(super) response_timeout: Duration,
    /// `streams.idle_timeout_secs`, for a peek at an answer's body.
    pub(super) stream_idle: Duration,
    /// The upstream as configured, for the log.
    pub(super) url: Arc<str>,
    /// The outages: a failed connection notes its cause for the upstream-wide one's first line.
    pub(super) hold: Arc<OutageRoutes>,
}

impl Upstream {
    /// The outage state of the route `target` takes: the Host it sends upstream, and the
    /// endpoint its path falls under.
    pub(super) fn route_of(&self, target: &Target) -> Arc<RouteOutage> {
        self.hold.route(
            target.headers.get(http::header::HOST),
            self.reading.routes.endpoint_of(target.client.path()),
        )
    }

    /// One attempt at the upstream and its verdict. The response comes back with verdicts that
    /// pass it through.
    /// `route` is the request's route while an outage is open anywhere (else no route is past
    /// its horizon).
    ///
    /// Not an async fn (which keeps its arguments twice): this future is allocated for every
    /// attempt, and kept within glibc's per-thread cache (1 032 bytes) it costs no trip into
    /// the allocator's bins. Nothing in it lives across an await that need not.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn attempt<'a>(
        &'a self,
        target: &'a Target,
        route: Option<&'a RouteOutage>,
        body: ReplayBody,
    ) -> impl std::future::Future<Output = (Verdict, Option<Answer>)> + Send + 'a {
        async move {
            // The upstream connection speaks HTTP/1.1 whatever the client spoke, unless it is
            // TLS and the upstream picked h2 by ALPN: hyper's client then sends the request as
            // HTTP/2. The head is lent, not copied: the exchange keeps it for a replay.
            let head = crate::upstream::Head {
                method: &target.method,
                uri: &target.uri,
                headers: &target.headers,
            };
            // The response timeout counts from the end of the upload, not from its start.
            let uploaded = body.completion();
            // The horizon matters only for a 404 (and costs a lock): asked only then.
            let cx = |route_expected, status: Option<StatusCode>| classify::Context {
                signatures: &self.reading.signatures,
                route_expected,
                beyond_horizon: status == Some(StatusCode::NOT_FOUND)
                    && route.is_some_and(|r| r.beyond_horizon(self.reading.horizon)),
            };
            // Matched where it is made: a named result would keep its room across the peek.
            let resp = match tokio::select! {
                sent = self.client.send(head, body) => Ok(sent),
                () = uploaded.elapsed_after_upload(self.response_timeout) => Err(()),
            } {
                Err(()) => {
                    return (
                        classify::classify(&Outcome::ResponseTimeout, &cx(true, None)),
                        None,
                    )
                }
                Ok(Err(err)) => return (self.send_failed(&err, &cx(true, None)), None),
                Ok(Ok(resp)) => resp,
            };
            let (head, body) = resp.into_parts();
            // 101 answers an upgrade, and holdfast never asks for one (`Upgrade` is
            // hop-by-hop): an unsolicited 101 is a protocol error, not something to hand a
            // client. (hyper reads 100 and 103 Early Hints itself and passes neither: the
            // final answer follows.)
            if head.status == StatusCode::SWITCHING_PROTOCOLS {
                tracing::debug!("the upstream answered 101 to a request that asked for no upgrade");
                return (Verdict::Failed(FailReason::Protocol), None);
            }
            let peek = match self.peek_if_signed(&head, body).await {
                Ok(peek) => peek,
                Err(reason) => return (Verdict::Failed(reason), None),
            };
            let verdict = classify::classify(
                &Outcome::Response {
                    status: head.status,
                    headers: &head.headers,
                    body: peek.complete.as_deref(),
                },
                &cx(
                    self.reading
                        .routes
                        .is_expected(target.client.path(), Instant::now),
                    Some(head.status),
                ),
            );
            (verdict, Some((head, peek)))
        }
    }

    /// A send that failed: its verdict, and what it says in the log.
    fn send_failed(&self, err: &SendError, cx: &classify::Context<'_>) -> Verdict {
        let verdict = classify::classify(&Outcome::Failed(err.failed()), cx);
        if verdict == Verdict::Failed(FailReason::UpstreamTls) {
            // A configuration error: say what is wrong, every time, loudly.
            tracing::error!(
                upstream = %self.url,
                error = %ErrorChain(err),
                "TLS to the upstream failed; check its certificate against client.ca \
                 (or the system roots) and its name, and client.cert/client.key"
            );
            return verdict;
        }
        tracing::debug!(error = %ErrorChain(err), ?verdict, "upstream request failed");
        // Only a failed connection opens the upstream-wide outage whose first line this is
        // for; any other cause would wait there for an unrelated outage.
        let connect = matches!(verdict, Verdict::Missing(m) if m.reason.is_connect_failure());
        if connect && !self.hold.upstream().is_active() {
            self.hold.upstream().note_cause(|| {
                match find_cause::<crate::upstream::ConnectError>(err) {
                    Some(connect) => ErrorChain(connect).to_string(),
                    None => ErrorChain(err).to_string(),
                }
            });
        }
        verdict
    }

    /// The response body, peeked at when its status is one a signature could match (only then:
    /// boxed, it is the rare path). A body that breaks or stalls before its small end arrives is
    /// the reason to answer 502: nothing reached the client yet, and the request did reach the
    /// upstream.
    async fn peek_if_signed(
        &self,
        head: &http::response::Parts,
        body: crate::upstream::UpstreamBody,
    ) -> Result<Peeked, FailReason> {
        if !self
            .reading
            .signatures
            .iter()
            .any(|s| s.status == head.status)
        {
            return Ok(Peeked {
                complete: None,
                prefix: None,
                rest: body,
            });
        }
        Box::pin(self.peek(&head.headers, body)).await.map_err(|err| {
            tracing::debug!(error = %ErrorChain(err.as_ref()), "upstream body failed while peeking");
            if err.is::<super::body::IdleTimeout>() {
                FailReason::ResponseTimeout
            } else {
                FailReason::UpstreamReset
            }
        })
    }

    /// Reads a candidate error body, up to `max_peek_bytes`. A larger body (by Content-Length or
    /// by what arrives) is not matched and passes through intact: the bytes read so far are kept
    /// as a prefix.
    pub(super) async fn peek(
        &self,
        headers: &http::HeaderMap,
        mut body: UpstreamBody,
    ) -> Result<Peeked, crate::errors::BoxError> {
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.reading.max_peek_bytes as u64) {
            return Ok(Peeked {
                complete: None,
                prefix: None,
                rest: body,
            });
        }
        let mut buf = BytesMut::new();
        let deadline = Instant::now() + self.stream_idle;
        loop {
            if body.is_end_stream() {
                return Ok(Peeked {
                    complete: Some(buf.freeze()),
                    prefix: None,
                    rest: body,
                });
            }
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(frame) => frame,
                Err(_) => return Err(Box::new(super::body::IdleTimeout(self.stream_idle))),
            };
            match frame {
                None => {
                    return Ok(Peeked {
                        complete: Some(buf.freeze()),
                        prefix: None,
                        rest: body,
                    })
                }
                Some(Err(e)) => return Err(Box::new(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                    // Trailers on an error body are dropped: no router sends them.
                    if buf.len() > self.reading.max_peek_bytes {
                        return Ok(Peeked {
                            complete: None,
                            prefix: Some(buf.freeze()),
                            rest: body,
                        });
                    }
                }
            }
        }
    }
}
