//! The health check of `hold.probe_path`: one GET to the upstream, made by holdfast itself,
//! whose answer says whether the application is there.
//!
//! Without it, the probe of an outage is the oldest held request itself (holdfast never invents
//! an MCP request). A port that accepts connections before anything serves them (docker-proxy
//! publishes the port before the container's process listens) passes the TCP probe, and that
//! request then meets a reset: for a tool call, a 502. With a health path the oldest held
//! request waits until the application has answered it.
//!
//! Up means: an answer that is not a router's (no signature matches) with a status below 500.
//! A 404 is up too (the application answers, even if not at that path); a router's
//! route-missing 404 is not.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, ACCEPT, HOST};
use http::{Method, Request, Uri};
use http_body_util::BodyExt;

use crate::hold::Checked;
use crate::replay::BodyHandle;
use crate::signature::Signature;
use crate::upstream::Client;

/// Longest wait for the health answer's head and its (small) body.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Body bytes read from a health answer to check it against the router signatures.
const HEALTH_PEEK: usize = 4096;

/// `GET hold.probe_path` on the upstream (or a pause's presence check: `OPTIONS` on the first
/// endpoint, which runs nothing on an MCP server).
pub(super) struct HealthCheck {
    pub(super) client: Arc<Client>,
    pub(super) method: Method,
    /// The upstream's scheme and authority with the probe path.
    pub(super) uri: Uri,
    /// The Host when a route has none of its own.
    pub(super) upstream_host: HeaderValue,
    pub(super) signatures: Vec<Signature>,
}

impl crate::hold::Health for HealthCheck {
    fn check<'a>(
        &'a self,
        host: Option<&'a HeaderValue>,
    ) -> Pin<Box<dyn Future<Output = Checked> + Send + 'a>> {
        Box::pin(async move {
            // No answer in time is no answer.
            tokio::time::timeout(HEALTH_TIMEOUT, self.ask(host))
                .await
                .unwrap_or(Checked::NoAnswer)
        })
    }
}

impl HealthCheck {
    async fn ask(&self, host: Option<&HeaderValue>) -> Checked {
        let body = BodyHandle::from_bytes(Bytes::new())
            .attempt()
            .expect("an empty body can be sent");
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        let headers = req.headers_mut();
        headers.insert(HOST, host.unwrap_or(&self.upstream_host).clone());
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        let Ok(resp) = self.client.request(req).await else {
            return Checked::NoAnswer;
        };
        let (head, mut body) = resp.into_parts();
        if head.status.is_server_error() && !self.signatures.iter().any(|s| s.status == head.status)
        {
            return Checked::NotUp(head.status);
        }
        // Read what a signature needs to look at; a body that breaks or is longer proves the
        // application no less (routers send short answers).
        let mut read = BytesMut::new();
        while read.len() <= HEALTH_PEEK {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                    }
                }
                Some(Err(_)) => return Checked::NoAnswer,
                None => break,
            }
        }
        let routers = self
            .signatures
            .iter()
            .any(|s| s.matches(head.status, &head.headers, Some(&read)));
        if routers || head.status.is_server_error() {
            Checked::NotUp(head.status)
        } else {
            Checked::Up
        }
    }
}
