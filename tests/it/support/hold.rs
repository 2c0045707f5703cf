//! Helpers of the hold-and-replay tests (`hold_*.rs`), which run a real holdfast in front of an
//! upstream that goes away and comes back on the same port.
//!
//! "Going away" is a reserved port: a socket bound on 127.0.0.1:0 that does not listen, so
//! connections to it are refused, and no other test can take the port meanwhile. "Coming back"
//! is the same socket starting to listen. Nothing there waits a fixed time for an event: where
//! holdfast offers no event to await (a request entering the hold), the tests poll the metric
//! that shows it, with a deadline. Real time passes only where a timeout or an outage's length
//! is the subject (fractions of a second, and one outage of 2.5 s). The clock is not paused:
//! holdfast's own timers (connect, response head, body idle) would then fire early whenever the
//! runtime idles waiting for loopback I/O.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::task::JoinHandle;

use crate::support::http::{call, host_of, post_json, response, Got, Seen, TestBody};
use crate::support::proxy::{raw_config, Holdfast, HOLD_OUTCOMES};

/// Long enough that no hold test ever reaches it unless it sets a shorter one.
pub const LONG_HOLD_SECS: f64 = 30.0;

pub fn call_body(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"count"}}}}"#)
}

/// A router in front of an application that is missing for the first `missing` requests: until
/// then it answers `status` with `headers` and `body` (after reading the whole request body, as
/// a router does), then the application echoes.
pub fn router_then_app(
    missing: usize,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
) -> impl Fn(Seen) -> std::pin::Pin<Box<dyn Future<Output = Response<TestBody>> + Send>>
       + Send
       + Sync
       + 'static {
    let count = Arc::new(AtomicUsize::new(0));
    move |seen: Seen| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n < missing {
                response(status, headers, body)
            } else {
                response(200, &[("content-type", "application/json")], seen.body)
            }
        })
    }
}

/// `holdfast_holds_total{outcome}`.
pub async fn holds(hf: &Holdfast, outcome: &str) -> f64 {
    hf.metric(&format!("holdfast_holds_total{{outcome=\"{outcome}\"}}"))
        .await
}

pub const HELD: &str = "holdfast_held_requests";
pub const REPLAYS: &str = "holdfast_replays_total";
pub const OUTAGES: &str = "holdfast_outages_total";

/// Every hold outcome is zero.
pub async fn assert_never_held(hf: &Holdfast) {
    for outcome in HOLD_OUTCOMES {
        assert_eq!(holds(hf, outcome).await, 0.0, "holds_total{{{outcome}}}");
    }
    assert_eq!(hf.metric(HELD).await, 0.0);
    assert_eq!(hf.metric(REPLAYS).await, 0.0);
}

/// A configuration whose holds last `timeout_secs`.
pub fn holding(upstream: &str, timeout_secs: f64) -> holdfast::config::RawConfig {
    let mut raw = raw_config(upstream);
    raw.hold.timeout_secs = timeout_secs;
    raw
}

/// POSTs `body` to `url` in the background.
pub fn spawn_post(url: String, body: String) -> JoinHandle<Got> {
    tokio::spawn(async move { post_json(&url, &body).await })
}

/// Sends `method` with `headers` and `body` to `url`.
pub async fn request(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Got {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header("host", host_of(url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    call(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
}
