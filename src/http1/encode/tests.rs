use super::*;
use crate::http1::trickle::Trickle;
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
    Ok(written_to(w, Trickle::new(step)).await?.out)
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

/// A head and its body are handed to the connection in one write of two parts (how to write
/// them is the connection's to decide, `http1::socket`); the empty size line and tail of a
/// length-framed body are not among them. A chunked body's head goes with its first chunk's
/// size line, data and end, and the last chunk follows once the body has ended.
#[tokio::test]
async fn a_head_and_its_body_are_handed_over_in_one_write() {
    let head = b"POST /mcp HTTP/1.1\r\ncontent-length: 1024\r\n\r\n".to_vec();
    let body = Bytes::from(vec![b'x'; 1024]);
    let w = BodyWriter::new(head.clone(), Framing::Length(1024), Full::new(body.clone()));
    let sink = written_to(w, Trickle::new(usize::MAX)).await.unwrap();
    assert_eq!(sink.out, [&head[..], &body[..]].concat());
    assert_eq!(sink.calls, [2], "one write of head and body");

    let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let w = BodyWriter::new(
        head.clone(),
        Framing::Chunked,
        Full::new(Bytes::from("hello")),
    );
    let sink = written_to(w, Trickle::new(usize::MAX)).await.unwrap();
    assert_eq!(sink.out, [&head[..], b"5\r\nhello\r\n0\r\n\r\n"].concat());
    assert_eq!(
        sink.calls,
        [4, 1],
        "head, size line, data and the chunk's end in one write; then the last chunk"
    );
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
