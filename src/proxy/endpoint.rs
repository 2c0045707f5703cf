//! A legacy (2024-11-05 HTTP+SSE) server's `endpoint` event, pointed back through holdfast.
//!
//! Such a server's GET stream starts with an `endpoint` event naming where clients POST. A
//! relative URL passes unchanged. An absolute one naming the upstream's own address (e.g.
//! `http://127.0.0.1:8000/messages?session_id=1`) would send clients around holdfast, to an
//! address they may not reach and that no hold protects: it is rewritten to the origin the
//! client used. The stream is not buffered: complete events go on as they arrive; only a
//! partial event waits for its end, and only until the first `endpoint` event (or
//! [`MAX_SCANNED`] bytes without one, a modern server's GET stream): then every frame passes
//! untouched.
//!
//! The event also proves the upstream a legacy server, and names its two paths: the stream's own
//! (`/sse`) and the one clients POST to (`/messages`). Both become expected routes
//! ([`LegacyPaths`]), so a router's route-missing 404 on them is masked while the server restarts.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::body::ProxyBody;
use crate::classify::LegacyPaths;
use crate::errors::BoxError;
use crate::sse;

/// Bytes of a stream looked at for the `endpoint` event before giving up.
pub const MAX_SCANNED: usize = 16 * 1024;

pin_project_lite::pin_project! {
    /// An SSE response body whose first `endpoint` event is rewritten.
    pub struct EndpointRewrite {
        #[pin]
        inner: ProxyBody,
        // While still looking.
        scan: Option<Scan>,
        // A frame that arrived while a partial event waited, sent after it.
        queued: Option<Frame<Bytes>>,
    }
}

struct Scan {
    /// `scheme://authority` of the upstream, lower case (built once, shared by every stream).
    upstream: Arc<str>,
    /// `scheme://host` the client used.
    client: String,
    /// The one event reader (`crate::sse`), over the stream since its start.
    parser: sse::Parser,
    /// The stream's bytes since the end of its last complete event, not sent on yet.
    pending: BytesMut,
    scanned: usize,
    /// Where the paths an `endpoint` event shows are recorded.
    legacy: Legacy,
}

/// The stream's own path, and where a legacy server's paths go.
pub struct Legacy {
    /// The client-facing path of the GET that opened the stream.
    pub stream_path: String,
    /// The expected routes' record of legacy paths.
    pub paths: Arc<LegacyPaths>,
}

impl EndpointRewrite {
    /// Rewrites URLs starting with `upstream` (`http://127.0.0.1:8000`, lower case) to start
    /// with `client`, and records the paths an `endpoint` event shows in `legacy`.
    pub fn new(inner: ProxyBody, upstream: Arc<str>, client: String, legacy: Legacy) -> Self {
        Self {
            inner,
            scan: Some(Scan {
                upstream,
                client,
                parser: sse::Parser::new(MAX_SCANNED),
                pending: BytesMut::new(),
                scanned: 0,
                legacy,
            }),
            queued: None,
        }
    }
}

impl Scan {
    /// Takes in `data`; returns what can go to the client now, and whether scanning is over.
    fn feed(&mut self, data: &[u8]) -> (Bytes, bool) {
        let base = self.pending.len();
        self.pending.extend_from_slice(data);
        self.scanned += data.len();
        // Where the events `data` completes end in `pending`: the last one before the first
        // `endpoint` event, and that event's span and URL.
        let mut last_end = 0;
        let mut endpoint = None;
        self.parser.feed_at(data, |event, end| {
            if endpoint.is_some() {
                return;
            }
            if event.event == "endpoint" {
                endpoint = Some((last_end, base + end, event.data));
            } else {
                last_end = base + end;
            }
        });
        let mut out = BytesMut::new();
        if let Some((start, end, url)) = endpoint {
            out.extend_from_slice(&self.pending[..start]);
            out.extend_from_slice(&self.rewrite(&self.pending[start..end]));
            out.extend_from_slice(&self.pending[end..]);
            self.pending.clear();
            self.record(&self.pointed(&url));
            return (out.freeze(), true);
        }
        out.extend_from_slice(&self.pending.split_to(last_end));
        if self.scanned > MAX_SCANNED {
            out.extend_from_slice(&self.pending.split());
            return (out.freeze(), true);
        }
        (out.freeze(), false)
    }

    /// Records the stream's path and the path the `endpoint` event's URL (as the client gets
    /// it) names as a legacy server's.
    fn record(&self, url: &str) {
        let legacy = &self.legacy;
        let post = endpoint_path(url, &self.client, &legacy.stream_path);
        let mut added = legacy.paths.add(&legacy.stream_path);
        if let Some(post) = &post {
            added |= legacy.paths.add(post);
        }
        if added {
            tracing::info!(
                stream = %legacy.stream_path,
                messages = post.as_deref().unwrap_or("(another origin)"),
                "the upstream is a legacy HTTP+SSE server: a router's route-missing 404 on its paths is masked from now on"
            );
        }
    }

    /// `url` pointed at the client's origin when it names the upstream, else as it is.
    fn pointed(&self, url: &str) -> String {
        let n = self.upstream.len();
        let names_upstream = url.len() >= n
            && url.is_char_boundary(n)
            && url[..n].eq_ignore_ascii_case(&self.upstream)
            && matches!(url.as_bytes().get(n), None | Some(b'/' | b'?' | b'#'));
        if names_upstream {
            format!("{}{}", self.client, &url[n..])
        } else {
            url.to_owned()
        }
    }

    /// The event with each `data:` line that names the upstream pointed at the client's origin;
    /// every other byte (line ends, other fields, comments, a second space) as it came.
    fn rewrite(&self, event: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(event.len() + self.client.len());
        for (line, end) in sse::lines(event) {
            match line.strip_prefix(b"data:") {
                Some(value) => {
                    // One space after the colon belongs to the field, anything after it to
                    // the value (as the event reader reads it).
                    let (space, value) = match value.strip_prefix(b" ") {
                        Some(rest) => (&b" "[..], rest),
                        None => (&b""[..], value),
                    };
                    out.extend_from_slice(b"data:");
                    out.extend_from_slice(space);
                    match std::str::from_utf8(value) {
                        Ok(url) => out.extend_from_slice(self.pointed(url).as_bytes()),
                        Err(_) => out.extend_from_slice(value),
                    }
                }
                None => out.extend_from_slice(line),
            }
            out.extend_from_slice(end);
        }
        out
    }
}

/// The client-facing path an `endpoint` event's URL names (pointed at the client already): a
/// path on the client's own origin, absolute or relative to `stream_path`. `None` for a URL on
/// another origin, or one with dot segments (not worth resolving: no server sends them).
fn endpoint_path(url: &str, client: &str, stream_path: &str) -> Option<String> {
    let on_client = url.len() >= client.len()
        && url.is_char_boundary(client.len())
        && url[..client.len()].eq_ignore_ascii_case(client)
        && matches!(
            url.as_bytes().get(client.len()),
            None | Some(b'/' | b'?' | b'#')
        );
    let reference = if on_client { &url[client.len()..] } else { url };
    let end = reference.find(['?', '#']).unwrap_or(reference.len());
    let reference = &reference[..end];
    let path = if on_client && reference.is_empty() {
        "/".to_owned()
    } else if reference.starts_with("//") {
        return None;
    } else if reference.starts_with('/') {
        reference.to_owned()
    } else if reference.contains(':') {
        // An absolute URL on another origin (or a scheme-like first segment): not ours.
        return None;
    } else {
        let dir = &stream_path[..stream_path.rfind('/').map_or(0, |i| i + 1)];
        format!("{}{reference}", if dir.is_empty() { "/" } else { dir })
    };
    let dots = path
        .split('/')
        .any(|segment| segment == "." || segment == "..");
    (!dots).then_some(path)
}

impl Body for EndpointRewrite {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Some(frame) = this.queued.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        loop {
            let Some(scan) = this.scan.as_mut() else {
                return this.inner.as_mut().poll_frame(cx);
            };
            let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
            let data = match frame {
                Some(Ok(frame)) => frame.into_data(),
                other => {
                    // The end or an error: what waited goes first (an error then ends the
                    // stream as a cut, the client sees the bytes that did arrive).
                    let pending = scan.pending.split().freeze();
                    *this.scan = None;
                    if pending.is_empty() {
                        return Poll::Ready(other);
                    }
                    if let Some(Err(e)) = other {
                        tracing::debug!(error = %e, "a stream broke while its endpoint was read");
                    }
                    return Poll::Ready(Some(Ok(Frame::data(pending))));
                }
            };
            let data = match data {
                Ok(data) => data,
                // Trailers: what waited goes first, then they.
                Err(trailers) => {
                    let pending = scan.pending.split().freeze();
                    *this.scan = None;
                    if pending.is_empty() {
                        return Poll::Ready(Some(Ok(trailers)));
                    }
                    *this.queued = Some(trailers);
                    return Poll::Ready(Some(Ok(Frame::data(pending))));
                }
            };
            let (out, done) = scan.feed(&data);
            if done {
                *this.scan = None;
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.queued.is_none()
            && self.scan.as_ref().is_none_or(|s| s.pending.is_empty())
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // Rewriting changes the length.
        SizeHint::default()
    }
}

impl super::Destination {
    /// A GET's event stream, with a legacy server's absolute `endpoint` URL naming the upstream
    /// pointed at the origin the client used, and its paths recorded among the expected
    /// `routes` (src/proxy/endpoint.rs).
    pub(super) fn endpoint_rewrite(
        &self,
        resp: http::Response<ProxyBody>,
        client_host: &http::HeaderValue,
        path: &str,
        routes: &crate::classify::ExpectedRoutes,
    ) -> http::Response<ProxyBody> {
        let Ok(host) = client_host.to_str() else {
            return resp;
        };
        let client = format!("{}://{host}", self.client_proto);
        let upstream = self.origin.clone();
        let legacy = Legacy {
            stream_path: path.to_owned(),
            paths: routes.legacy(),
        };
        resp.map(|body| {
            http_body_util::BodyExt::boxed_unsync(EndpointRewrite::new(
                body, upstream, client, legacy,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn scan() -> Scan {
        Scan {
            upstream: Arc::from("http://127.0.0.1:8000"),
            client: "https://mcp.example".into(),
            parser: sse::Parser::new(MAX_SCANNED),
            pending: BytesMut::new(),
            scanned: 0,
            legacy: legacy(),
        }
    }

    fn legacy() -> Legacy {
        Legacy {
            stream_path: "/sse".into(),
            paths: Arc::default(),
        }
    }

    /// Feeds `chunks` to a fresh scan; what the client gets, and whether the scan ended.
    fn through(chunks: &[&str]) -> (String, bool) {
        let mut s = scan();
        let mut out = Vec::new();
        let mut done = false;
        for c in chunks {
            assert!(!done, "fed after the scan ended");
            let (bytes, d) = s.feed(c.as_bytes());
            out.extend_from_slice(&bytes);
            done = d;
        }
        (String::from_utf8(out).unwrap(), done)
    }

    #[test]
    fn an_absolute_endpoint_naming_the_upstream_points_at_the_client_origin() {
        let (out, done) = through(&[
            ": hi\n\nevent: endpoint\ndata: http://127.0.0.1:8000/messages?session_id=1\n\nevent: message\ndata: {}\n\n",
        ]);
        assert!(done);
        assert_eq!(
            out,
            ": hi\n\nevent: endpoint\ndata: https://mcp.example/messages?session_id=1\n\nevent: message\ndata: {}\n\n"
        );
    }

    #[test]
    fn an_event_split_over_frames_waits_only_for_its_own_end() {
        let mut s = scan();
        let (first, done) = s.feed(b"event: message\ndata: 1\n\nevent: endp");
        assert_eq!(
            (&first[..], done),
            (&b"event: message\ndata: 1\n\n"[..], false)
        );
        let (second, done) = s.feed(b"oint\r\ndata: HTTP://127.0.0.1:8000/m\r\n\r\n");
        assert!(done);
        assert_eq!(
            &second[..],
            b"event: endpoint\r\ndata: https://mcp.example/m\r\n\r\n"
        );
    }

    /// Lines ended by a lone CR (and a BOM at the stream's start), as the SSE format allows:
    /// the same event, rewritten, its line ends kept.
    #[test]
    fn a_stream_with_lone_cr_line_ends_is_read_too() {
        let (out, done) = through(&[
            "\u{feff}: hi\r\revent: endpoint\rdata: http://127.0.0.1:8000/m?s=1\r",
            "\rdata: later\r\r",
        ]);
        assert!(done);
        assert_eq!(
            out,
            "\u{feff}: hi\r\revent: endpoint\rdata: https://mcp.example/m?s=1\r\rdata: later\r\r"
        );
    }

    #[test]
    fn relative_and_foreign_urls_pass_unchanged() {
        for data in [
            "/messages?session_id=1",
            "http://127.0.0.1:80001/x",
            "http://other.example/messages",
            "http://127.0.0.1:8000.evil.example/x",
        ] {
            let event = format!("event: endpoint\ndata: {data}\n\n");
            assert_eq!(through(&[&event]), (event.clone(), true), "{data}");
        }
    }

    #[test]
    fn a_stream_without_an_endpoint_event_is_let_go_after_the_scan_limit() {
        let event = "data: x\n\n".repeat(MAX_SCANNED / 9 + 2);
        let (out, done) = through(&[&event]);
        assert!(done);
        assert_eq!(out, event);
    }

    /// A body of fixed frames.
    struct Chunks(std::collections::VecDeque<&'static str>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
            )
        }
    }

    fn rewriting(chunks: &[&'static str]) -> EndpointRewrite {
        EndpointRewrite::new(
            BodyExt::boxed_unsync(Chunks(chunks.iter().copied().collect())),
            Arc::from("http://127.0.0.1:8000"),
            "http://proxy:8080".into(),
            legacy(),
        )
    }

    #[test]
    fn the_endpoint_event_names_the_legacy_paths() {
        let mut s = scan();
        let paths = s.legacy.paths.clone();
        assert!(!paths.contains("/sse"));
        s.feed(b"event: endpoint\ndata: http://127.0.0.1:8000/messages?session_id=1\n\n");
        assert!(paths.contains("/sse"), "the stream's own path");
        assert!(
            paths.contains("/messages"),
            "where clients POST, without the query"
        );
        assert!(!paths.contains("/messages?session_id=1"));
    }

    #[test]
    fn endpoint_paths_absolute_relative_and_foreign() {
        let c = "https://mcp.example";
        let path = |url: &str, stream: &str| endpoint_path(url, c, stream);
        assert_eq!(path("/messages?s=1", "/sse").as_deref(), Some("/messages"));
        assert_eq!(
            path("https://mcp.example/m/x#f", "/sse").as_deref(),
            Some("/m/x")
        );
        assert_eq!(
            path("HTTPS://MCP.EXAMPLE?s=1", "/sse").as_deref(),
            Some("/")
        );
        assert_eq!(
            path("messages?s=1", "/api/sse").as_deref(),
            Some("/api/messages")
        );
        assert_eq!(path("messages", "sse").as_deref(), Some("/messages"));
        assert_eq!(path("https://other.example/messages", "/sse"), None);
        assert_eq!(path("https://mcp.example.evil/messages", "/sse"), None);
        assert_eq!(path("//other.example/messages", "/sse"), None);
        assert_eq!(path("/a/../admin", "/sse"), None);
        assert_eq!(path("./messages", "/sse"), None);
    }

    #[tokio::test]
    async fn as_a_body_it_keeps_every_byte_and_flushes_a_partial_event_at_the_end() {
        let body = rewriting(&["event: endpoint\ndata: http://127.0.0.1:8000/a\n", "\nrest"]);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(
            &all[..],
            b"event: endpoint\ndata: http://proxy:8080/a\n\nrest"
        );
        let all = rewriting(&["event: endp"])
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&all[..], b"event: endp");
    }
}
