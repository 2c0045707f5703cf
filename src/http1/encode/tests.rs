use super::*;
use http_body_util::{BodyExt, Full};

#[test]
fn size_lines_are_upper_case_hex() {
    for (n, want) in [
        (0, "0"),
        (1, "1"),
        (15, "F"),
        (16, "10"),
        (4096, "1000"),
        (usize::MAX, "FFFFFFFFFFFFFFFF"),
    ] {
        assert_eq!(
            SizeLine::new(n).as_bytes(),
            format!("{want}\r\n").as_bytes()
        );
    }
}

/// Writes the message to a buffer that takes at most `step` bytes per write and, as a
/// socket does, writes of several parts.
async fn written<B>(w: BodyWriter<B>, step: usize) -> Result<Vec<u8>, Error>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    Ok(written_to(w, Trickle::new(step, true)).await?.out)
}

async fn written_to<B>(mut w: BodyWriter<B>, mut sink: Trickle) -> Result<Trickle, Error>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut count = 0;
    std::future::poll_fn(|cx| w.poll_write(cx, &mut sink, &mut count)).await?;
    assert_eq!(count as usize, sink.out.len());
    Ok(sink)
}

struct Trickle {
    out: Vec<u8>,
    step: usize,
    vectored: bool,
    /// The parts handed over by each write: `1` for a plain one.
    calls: Vec<usize>,
}

impl Trickle {
    fn new(step: usize, vectored: bool) -> Self {
        Trickle {
            out: Vec::new(),
            step,
            vectored,
            calls: Vec::new(),
        }
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.calls.push(1);
        let n = buf.len().min(self.step);
        self.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        assert!(self.vectored, "a vectored write to a plain writer");
        self.calls.push(bufs.len());
        let mut room = self.step;
        for buf in bufs {
            let n = buf.len().min(room);
            self.out.extend_from_slice(&buf[..n]);
            room -= n;
        }
        Poll::Ready(Ok(self.step - room))
    }
    fn is_write_vectored(&self) -> bool {
        self.vectored
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A head and a small body leave in one plain write (a `send`, not a `writev`), copied
/// together; a body too large to copy leaves with the head in one vectored write; a writer
/// that cannot gather gets the parts one by one. The bytes are the same every way.
#[tokio::test]
async fn a_small_message_is_written_in_one_plain_write_a_large_one_vectored() {
    let head = b"POST /mcp HTTP/1.1\r\ncontent-length: 1024\r\n\r\n".to_vec();
    let body = Bytes::from(vec![b'x'; 1024]);
    let message = [&head[..], &body[..]].concat();
    let w = BodyWriter::new(head.clone(), Framing::Length(1024), Full::new(body.clone()));
    let sink = written_to(w, Trickle::new(usize::MAX, true)).await.unwrap();
    assert_eq!(sink.out, message);
    assert_eq!(sink.calls, [1], "one plain write");

    let big = Bytes::from(vec![b'y'; GATHERED]);
    let big_head = format!("POST /mcp HTTP/1.1\r\ncontent-length: {GATHERED}\r\n\r\n").into_bytes();
    let w = BodyWriter::new(
        big_head.clone(),
        Framing::Length(GATHERED as u64),
        Full::new(big.clone()),
    );
    let sink = written_to(w, Trickle::new(usize::MAX, true)).await.unwrap();
    assert_eq!(sink.out, [&big_head[..], &big[..]].concat());
    assert_eq!(sink.calls, [2], "one write of head and body");

    let w = BodyWriter::new(head.clone(), Framing::Length(1024), Full::new(body));
    let sink = written_to(w, Trickle::new(usize::MAX, false))
        .await
        .unwrap();
    assert_eq!(sink.out, message);
    assert_eq!(sink.calls, [1, 1], "the head, then the body");
}

/// A writer that gathers again inside its own write, as a TLS session does when it seals the
/// gathered plaintext and writes the records to its socket (`http1::socket::Socket`): it
/// passes each write on to `inner` as two parts.
struct Sealing {
    inner: Trickle,
}

impl AsyncWrite for Sealing {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let (a, b) = buf.split_at(buf.len() / 2);
        poll_write_parts(cx, &mut self.inner, &[IoSlice::new(a), IoSlice::new(b)])
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A gathered write whose writer gathers again inside it gets a buffer of its own (the thread's
/// one is in use): the bytes arrive whole, each layer having written once.
#[tokio::test]
async fn a_gathering_write_inside_a_gathered_one_has_its_own_buffer() {
    let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec();
    let mut w = BodyWriter::new(
        head.clone(),
        Framing::Length(5),
        Full::new(Bytes::from("hello")),
    );
    let mut sink = Sealing {
        inner: Trickle::new(usize::MAX, true),
    };
    let mut count = 0;
    std::future::poll_fn(|cx| w.poll_write(cx, &mut sink, &mut count))
        .await
        .unwrap();
    assert_eq!(sink.inner.out, [&head[..], b"hello"].concat());
    assert_eq!(sink.inner.calls, [1], "the inner write gathered too");
}

/// A body of the given data frames, each ready at once.
struct Frames(std::collections::VecDeque<&'static str>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p.as_bytes())))),
        )
    }
}

fn frames(parts: &[&'static str]) -> Frames {
    Frames(parts.iter().copied().collect())
}

#[tokio::test]
async fn a_chunked_body_is_framed_frame_by_frame_over_any_write_size() {
    for step in [1, 3, 7, 64, 4096] {
        let w = BodyWriter::new(
            b"HEAD\r\n\r\n".to_vec(),
            Framing::Chunked,
            frames(&["hello", "", ", world"]),
        );
        let out = written(w, step).await.unwrap();
        assert_eq!(
            out, b"HEAD\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
            "step {step}"
        );
    }
}

#[tokio::test]
async fn a_length_body_must_match_its_length() {
    let ok = BodyWriter::new(
        Vec::new(),
        Framing::Length(5),
        Full::new(Bytes::from("hello")),
    );
    assert_eq!(written(ok, 2).await.unwrap(), b"hello");
    let long = BodyWriter::new(
        Vec::new(),
        Framing::Length(4),
        Full::new(Bytes::from("hello")),
    );
    assert!(matches!(written(long, 64).await, Err(Error::Body(_))));
    let short = BodyWriter::new(
        Vec::new(),
        Framing::Length(6),
        Full::new(Bytes::from("hello")),
    );
    assert!(matches!(written(short, 64).await, Err(Error::Body(_))));
    let none = BodyWriter::new(Vec::new(), Framing::Empty, Full::new(Bytes::from("x")));
    assert!(matches!(written(none, 64).await, Err(Error::Body(_))));
}

#[tokio::test]
async fn trailers_close_a_chunked_body() {
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", "7".parse().unwrap());
    let body = Full::new(Bytes::from("abc")).with_trailers(std::future::ready(Some(Ok(trailers))));
    let w = BodyWriter::new(Vec::new(), Framing::Chunked, body);
    assert_eq!(
        written(w, 64).await.unwrap(),
        b"3\r\nabc\r\n0\r\nx-sum: 7\r\n\r\n"
    );
}

#[test]
fn the_date_is_an_http_date() {
    let date = date();
    let parsed = httpdate::parse_http_date(date.to_str().unwrap()).unwrap();
    let age = std::time::SystemTime::now().duration_since(parsed).unwrap();
    assert!(age < std::time::Duration::from_secs(5), "{date:?}");
}

#[test]
fn heads_are_written_in_order() {
    let mut h = HeaderMap::new();
    h.insert("host", "a".parse().unwrap());
    h.append("x-list", "1".parse().unwrap());
    h.append("x-list", "2".parse().unwrap());
    assert_eq!(
        request_head(&Method::POST, "/mcp?x=1", &h, &[]),
        b"POST /mcp?x=1 HTTP/1.1\r\nhost: a\r\nx-list: 1\r\nx-list: 2\r\n\r\n"
    );
    assert_eq!(
        response_head(Version::HTTP_11, StatusCode::NOT_FOUND, &HeaderMap::new()),
        b"HTTP/1.1 404 Not Found\r\n\r\n"
    );
}

#[test]
fn an_added_line_replaces_the_lines_of_its_name_in_the_head_only() {
    let mut h = HeaderMap::new();
    h.append(http::header::CONTENT_LENGTH, "2".parse().unwrap());
    h.append(http::header::CONTENT_LENGTH, "2".parse().unwrap());
    h.insert("x-a", "1".parse().unwrap());
    let kept = h.clone();
    let added = [
        Some((http::header::CONTENT_LENGTH, HeaderValue::from_static("2"))),
        None,
        Some((http::header::HOST, HeaderValue::from_static("up"))),
    ];
    assert_eq!(
        String::from_utf8(request_head(&Method::POST, "/", &h, &added)).unwrap(),
        "POST / HTTP/1.1\r\nx-a: 1\r\ncontent-length: 2\r\nhost: up\r\n\r\n"
    );
    assert_eq!(h, kept, "the map is left as it was, for a replay");
}
