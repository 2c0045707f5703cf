//! SSE through holdfast: events flow frame by frame, the stream is marked unbuffered, outlives
//! every whole-request timeout, is cut when it stalls or when the upstream dies, and is counted
//! in `holdfast_sse_streams_active` while it lives.
//!
//! The upstream here hands the test one [`EventSender`] per request, so the test decides when
//! each event leaves the upstream and can check it arrived at the client before sending the next.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::support::http::{
    get, host_of, response, send, send_h2, BoxError, ChannelBody, TestBody, Upstream,
};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// The upstream's end of one SSE response: each `Ok` frame is sent as it is pushed, an `Err`
/// makes the upstream abort the response, and dropping the sender ends it cleanly.
pub(crate) type EventSender = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// Name of the SSE gauge. It drops when hyper drops the response body, which happens just after
/// the client saw the end, with no event the test could await: tests wait for it with
/// [`Holdfast::metric_until`].
pub(crate) const SSE_ACTIVE: &str = "holdfast_sse_streams_active";

/// The text of event `n`.
pub(crate) fn event(n: usize) -> String {
    format!("id: {n}\ndata: event {n}\n\n")
}

/// Pushes event `n` out of the upstream.
pub(crate) async fn push(tx: &EventSender, n: usize) {
    tx.send(Ok(Frame::data(Bytes::from(event(n)))))
        .await
        .expect("the upstream's response body is still being read");
}

/// An upstream answering every request with an SSE stream (`content-type: text/event-stream`
/// plus `extra` headers) whose events the test sends through the [`EventSender`] it receives for
/// each request.
pub(crate) async fn sse_upstream(
    extra: &'static [(&'static str, &'static str)],
) -> (Upstream, mpsc::UnboundedReceiver<EventSender>) {
    let (streams_tx, streams_rx) = mpsc::unbounded_channel();
    let upstream = Upstream::start(move |_seen| {
        let (tx, rx) = mpsc::channel(16);
        let _ = streams_tx.send(tx);
        async move {
            let mut resp = Response::new(TestBody::new(ChannelBody(rx)));
            let headers = resp.headers_mut();
            headers.insert("content-type", "text/event-stream".parse().unwrap());
            headers.insert("cache-control", "no-cache".parse().unwrap());
            for (name, value) in extra {
                headers.insert(*name, value.parse().unwrap());
            }
            resp
        }
    })
    .await;
    (upstream, streams_rx)
}

/// Which HTTP version the test client speaks to holdfast.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Client {
    /// HTTP/1.1.
    H1,
    /// HTTP/2 with prior knowledge (h2c).
    H2,
}

/// Opens an SSE stream on holdfast's `/mcp` as an MCP client's GET does.
pub(crate) async fn open(holdfast: &Holdfast, client: Client) -> Response<Incoming> {
    let url = holdfast.url("/mcp");
    let req = Request::get(&url).header("accept", "text/event-stream");
    let resp = match client {
        Client::H1 => {
            let req = req.header("host", host_of(&url));
            within(send(req.body(Full::default()).unwrap())).await
        }
        Client::H2 => within(send_h2(req.body(Full::default()).unwrap())).await,
    };
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    resp
}

/// Reads SSE events from a response body, whatever the frame boundaries.
pub(crate) struct Events {
    body: Incoming,
    buf: BytesMut,
}

impl Events {
    /// Reads `resp`'s body.
    pub(crate) fn new(resp: Response<Incoming>) -> Events {
        Events {
            body: resp.into_body(),
            buf: BytesMut::new(),
        }
    }

    /// The next complete event (up to and including its blank line). Panics if the body ends or
    /// fails first, or if nothing arrives in time (a buffering proxy).
    pub(crate) async fn next(&mut self) -> String {
        within(async {
            loop {
                if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                    let event = self.buf.split_to(end + 2);
                    return String::from_utf8(event.to_vec()).unwrap();
                }
                match self.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                    }
                    Some(Err(e)) => panic!("the stream failed before an event arrived: {e}"),
                    None => panic!("the stream ended before an event arrived"),
                }
            }
        })
        .await
    }

    /// Reads to the end: `Ok` for a clean end (with no partial event left over), `Err` for a
    /// broken stream.
    pub(crate) async fn end(mut self) -> Result<(), hyper::Error> {
        within(async {
            loop {
                match self.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => {
                        assert!(
                            self.buf.is_empty(),
                            "data after the last event: {:?}",
                            self.buf
                        );
                        return Ok(());
                    }
                }
            }
        })
        .await
    }
}

/// Events cross holdfast one at a time: each is read at the client before the upstream is told
/// to send the next, which a proxy that buffers the body cannot pass.
async fn frame_by_frame(client: Client) {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;

    let resp = open(&holdfast, client).await;
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    let tx = within(streams.recv()).await.unwrap();
    let mut events = Events::new(resp);
    for n in 1..=3 {
        push(&tx, n).await;
        assert_eq!(events.next().await, event(n));
    }
    drop(tx);
    events.end().await.expect("a clean end");
}

#[tokio::test]
async fn events_flow_frame_by_frame() {
    frame_by_frame(Client::H1).await;
}

#[tokio::test]
async fn events_flow_frame_by_frame_over_h2() {
    frame_by_frame(Client::H2).await;
}

#[tokio::test]
async fn x_accel_buffering_is_added_to_sse_only() {
    let upstream = Upstream::start(|seen| async move {
        match seen.uri.as_str() {
            "/sse" => response(200, &[("content-type", "text/event-stream")], event(1)),
            "/sse-charset" => response(
                200,
                &[("content-type", "text/event-stream; charset=utf-8")],
                event(1),
            ),
            "/sse-own-value" => response(
                200,
                &[
                    ("content-type", "text/event-stream"),
                    ("x-accel-buffering", "yes"),
                ],
                event(1),
            ),
            _ => response(200, &[("content-type", "application/json")], "{}"),
        }
    })
    .await;
    let holdfast = Holdfast::start(&upstream.url()).await;

    for path in ["/sse", "/sse-charset"] {
        let got = within(get(&holdfast.url(path))).await;
        assert_eq!(got.header("x-accel-buffering"), Some("no"), "{path}");
        assert_eq!(got.text(), event(1), "{path}");
    }

    // The upstream's own value is its decision: kept, and not doubled.
    let got = within(get(&holdfast.url("/sse-own-value"))).await;
    let values: Vec<_> = got.headers.get_all("x-accel-buffering").iter().collect();
    assert_eq!(values, ["yes"]);

    let got = within(get(&holdfast.url("/json"))).await;
    assert_eq!(got.header("x-accel-buffering"), None);
    assert_eq!(got.text(), "{}");
}

#[tokio::test]
async fn a_compressed_event_stream_answering_a_call_passes_as_it_came() {
    // A front proxy that compresses event streams (nginx with gzip_types text/event-stream, as
    // Debian's configuration invites) between holdfast and the server: holdfast cannot read the
    // events, so it cannot tell an answered stream from an unanswered one, nor add an event to
    // it. The stream passes untouched; it is not mistaken for a server going away.
    const GZIPPED: &[u8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03not events holdfast can read";
    let upstream = Upstream::start(|_| async move {
        response(
            200,
            &[
                ("content-type", "text/event-stream"),
                ("content-encoding", "gzip"),
            ],
            GZIPPED,
        )
    })
    .await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t"}}"#;
    let url = holdfast.url("/mcp");
    let req = Request::post(&url)
        .header("host", host_of(&url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("accept-encoding", "gzip")
        .body(Full::new(Bytes::from_static(call.as_bytes())))
        .unwrap();
    let resp = within(send(req)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("content-encoding").unwrap(), "gzip");
    let body = within(resp.into_body().collect()).await.unwrap().to_bytes();
    assert_eq!(&body[..], GZIPPED);
    assert_eq!(
        holdfast
            .metric_or_zero("holdfast_upstream_failures_total{reason=\"unanswered\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_long_stream_outlives_the_response_and_idle_timeouts() {
    const EVENTS: usize = 25;
    const EVERY: Duration = Duration::from_millis(100);
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = raw_config(&upstream.url());
    raw.client.response_timeout_secs = 0.5;
    raw.streams.idle_timeout_secs = 1.0;
    let holdfast = Holdfast::start_with(raw).await;

    let mut events = Events::new(open(&holdfast, Client::H1).await);
    let tx = within(streams.recv()).await.unwrap();
    // The upstream paces itself like a server sending progress: one event every 100 ms, far
    // inside the idle timeout, for five times the response timeout and twice the idle timeout
    // (the sleeps make it last that long: nothing to check about it).
    let pacer = tokio::spawn(async move {
        for n in 1..=EVENTS {
            tokio::time::sleep(EVERY).await;
            push(&tx, n).await;
        }
    });
    for n in 1..=EVENTS {
        assert_eq!(events.next().await, event(n));
    }
    events.end().await.expect("a clean end");
    pacer.await.unwrap();
    // Neither timeout fired on it, not even after the stream's end.
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
    for series in [
        "holdfast_response_aborts_total{reason=\"idle_timeout\"}",
        "holdfast_response_aborts_total{reason=\"upstream_error\"}",
        "holdfast_upstream_failures_total{reason=\"response_timeout\"}",
    ] {
        assert_eq!(holdfast.metric(series).await, 0.0, "{series}");
    }
}

#[tokio::test]
async fn a_stalled_stream_is_cut_after_the_idle_timeout() {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let mut raw = raw_config(&upstream.url());
    raw.streams.idle_timeout_secs = 0.5;
    let holdfast = Holdfast::start_with(raw).await;

    let mut events = Events::new(open(&holdfast, Client::H1).await);
    let tx = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));

    // The upstream stays connected and silent: the test keeps `tx` and sends nothing more.
    let stalled = Instant::now();
    let result = events.end().await;
    assert!(
        result.is_err(),
        "a stalled stream must break, not end cleanly"
    );
    assert!(
        stalled.elapsed() >= Duration::from_millis(250),
        "cut after {:?}, long before the 0.5 s idle timeout",
        stalled.elapsed()
    );
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
    assert_eq!(
        holdfast
            .metric("holdfast_response_aborts_total{reason=\"idle_timeout\"}")
            .await,
        1.0
    );
    // The upstream's response is let go too, not left open until the upstream gives up.
    within(tx.closed()).await;
}

/// The upstream fails its response mid-stream: the client must see a broken stream, never a
/// clean end that would read as "the server finished".
async fn upstream_error_breaks_the_stream(client: Client) {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;

    let mut events = Events::new(open(&holdfast, client).await);
    let tx = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));
    tx.send(Err("the MCP server crashed".into())).await.unwrap();

    let result = events.end().await;
    assert!(
        result.is_err(),
        "a broken upstream stream must break downstream"
    );
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
    assert_eq!(
        holdfast
            .metric("holdfast_response_aborts_total{reason=\"upstream_error\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn an_upstream_error_mid_stream_breaks_the_client_stream() {
    upstream_error_breaks_the_stream(Client::H1).await;
}

#[tokio::test]
async fn an_upstream_error_mid_stream_breaks_the_client_stream_over_h2() {
    upstream_error_breaks_the_stream(Client::H2).await;
}

#[tokio::test]
async fn the_upstream_going_away_mid_stream_breaks_the_client_stream() {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;

    let mut events = Events::new(open(&holdfast, Client::H1).await);
    let tx = within(streams.recv()).await.unwrap();
    push(&tx, 1).await;
    assert_eq!(events.next().await, event(1));

    // The container is gone: every upstream connection closes mid-response.
    upstream.stop().await;
    let result = events.end().await;
    assert!(result.is_err(), "a vanished upstream must break the stream");
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
}

#[tokio::test]
async fn the_sse_gauge_counts_live_streams() {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    assert_eq!(holdfast.metric(SSE_ACTIVE).await, 0.0);

    // The gauge goes up before the response head leaves holdfast: no waiting needed.
    let mut first = Events::new(open(&holdfast, Client::H1).await);
    let first_tx = within(streams.recv()).await.unwrap();
    assert_eq!(holdfast.metric(SSE_ACTIVE).await, 1.0);
    let mut second = Events::new(open(&holdfast, Client::H2).await);
    let second_tx = within(streams.recv()).await.unwrap();
    assert_eq!(holdfast.metric(SSE_ACTIVE).await, 2.0);

    push(&first_tx, 1).await;
    assert_eq!(first.next().await, event(1));
    drop(first_tx);
    first.end().await.expect("a clean end");
    holdfast.metric_until(SSE_ACTIVE, |v| v == 1.0).await;

    push(&second_tx, 1).await;
    assert_eq!(second.next().await, event(1));
    drop(second_tx);
    second.end().await.expect("a clean end");
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
}

/// The client drops its stream (a closed tab, a reconnect): holdfast lets go of it, its count
/// and the upstream's response, instead of holding them until the idle timeout.
async fn client_going_away(client: Client) {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    let holdfast = Holdfast::start(&upstream.url()).await;

    let resp = open(&holdfast, client).await;
    let tx = within(streams.recv()).await.unwrap();
    assert_eq!(holdfast.metric(SSE_ACTIVE).await, 1.0);

    // h1: the client closes its connection; h2: the client resets the stream (RST_STREAM).
    drop(resp);
    holdfast.metric_until(SSE_ACTIVE, |v| v == 0.0).await;
    within(tx.closed()).await;
}

#[tokio::test]
async fn a_client_going_away_ends_the_stream_and_its_count() {
    client_going_away(Client::H1).await;
}

#[tokio::test]
async fn a_client_going_away_ends_the_stream_and_its_count_over_h2() {
    client_going_away(Client::H2).await;
}
