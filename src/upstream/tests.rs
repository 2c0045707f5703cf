//! The HTTP/1 path against connections the upstream closes, with the runtime held still so
//! that nothing has read what the kernel already knows.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;

use super::tcp::Liveness;
use super::*;
use crate::replay::BodyHandle;

/// Blocks the thread (and so the test's single-threaded runtime: no task runs meanwhile) until
/// the kernel reports the upstream's close of `conn`, bounded.
fn block_until_closed(conn: &Conn) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while conn.check() == Liveness::Open {
        assert!(
            Instant::now() < deadline,
            "the upstream's close never arrived"
        );
        std::thread::yield_now();
    }
}

/// Reads one request head (the tests send bodiless requests).
fn read_head(stream: &mut std::net::TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "a whole request head");
        head.push(byte[0]);
    }
}

fn request(uri: &str) -> Request<ReplayBody> {
    let body = BodyHandle::from_bytes(Bytes::new()).attempt().unwrap();
    Request::builder()
        .uri(uri)
        .header("host", "upstream")
        .body(body)
        .unwrap()
}

/// A client of `base` with the default limits, and its HTTP/1 path.
fn client(base: &Uri, closed: &ClosedCounters) -> Client {
    Client::new(
        base.clone(),
        Duration::from_secs(5),
        Duration::from_secs(60),
        None,
        closed.clone(),
        ResponseLimits {
            max_headers: 100,
            max_head_bytes: 64 * 1024,
        },
        prometheus_client::metrics::gauge::Gauge::default(),
    )
}

fn http1(client: &Client) -> &Http1 {
    match &client.inner {
        Inner::Http1(h1) => h1,
        Inner::Pooled(_) => unreachable!("an http:// upstream"),
    }
}

fn outgoing(h1: &Http1, uri: &str) -> Outgoing {
    let (parts, body) = request(uri).into_parts();
    Outgoing::new(Head::of(&parts), body, &h1.host).unwrap()
}

/// Sends `out` on `conn`, as [`Http1::send`] does on each connection it takes.
async fn send_on(
    h1: &Http1,
    conn: Conn,
    pooled: bool,
    out: Outgoing,
) -> Result<Response<UpstreamBody>, Retry> {
    h1.settle(h1::send(conn, Box::new(out), h1.limits).await, pooled)
}

fn listening() -> (TcpListener, Uri) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    (listener, base)
}

#[tokio::test]
async fn a_request_written_into_a_pooled_connection_closed_a_moment_ago_is_proven_unread() {
    // A backend going away closes its idle connections; one back from its response a moment
    // ago is taken without asking the kernel unless the reactor reported the close
    // (`tcp::check_idle`). Here it has not (nothing was awaited since the close): the request is
    // written into the closed connection, meets the FIN, and the kernel proves it unread.
    let (listener, base) = listening();
    let (close, closing) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        closing.recv().unwrap();
        drop(stream);
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    let h1 = http1(&client);
    let conn = h1.connect().await.unwrap();
    // Closed only now, when nothing awaits: the reactor cannot poll before the request goes.
    // The listener is gone with the thread: a new connection would be refused.
    close.send(()).unwrap();
    server.join().unwrap();
    block_until_closed(&conn);
    h1.pool.checkin(conn);

    let (parts, body) = request("/mcp").into_parts();
    let result = h1.send(Head::of(&parts), body).await;
    let Err(SendError::NeverRead(never)) = result else {
        panic!("expected a never-read failure, got {:?}", result.err());
    };
    assert_eq!(never.when, Unread::Unacknowledged);
    assert_eq!(closed.unacknowledged.get(), 1);
    assert_eq!(closed.idle.get(), 0, "the pool did not ask the kernel");
}

#[tokio::test]
async fn a_request_written_into_a_closed_connection_is_proven_unread() {
    let (listener, base) = listening();
    let server = std::thread::spawn(move || {
        // Accepts, then closes at once: the backend died as the request was on its way.
        drop(listener.accept().unwrap());
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    let h1 = http1(&client);
    let conn = h1.connect().await.unwrap();
    server.join().unwrap();
    block_until_closed(&conn);

    let result = send_on(h1, conn, false, outgoing(h1, "/mcp")).await;
    let Err(Retry::Failed(err)) = result else {
        panic!("expected a failure");
    };
    let SendError::NeverRead(never) = &err else {
        panic!("expected a never-read failure, got {err:?}");
    };
    // Either the first write failed (the upstream's reset arrived first) and nothing was
    // written, or it was written and met the upstream's FIN: the kernel proves it unread
    // either way.
    let counted = closed.before_request.get() + closed.unacknowledged.get();
    assert_eq!(counted, 1);
    match never.when {
        Unread::BeforeRequest => assert_eq!(closed.before_request.get(), 1),
        Unread::Unacknowledged => assert_eq!(closed.unacknowledged.get(), 1),
    }
    // The classifier's row 1b: the backend is missing, and the request may be sent again.
    let cx = crate::classify::Context {
        signatures: &[],
        route_expected: true,
        beyond_horizon: false,
    };
    assert_eq!(
        crate::classify::classify(&crate::classify::Outcome::Failed(err.failed()), &cx),
        crate::classify::Verdict::Missing(crate::classify::Missing {
            reason: crate::classify::RewriteReason::ConnectionClosed,
            never_reached_app: true,
        })
    );
}

#[tokio::test]
async fn a_request_the_upstream_read_before_closing_may_have_run() {
    let (listener, base) = listening();
    let server = std::thread::spawn(move || {
        // Reads the whole request, then dies without answering: it may have executed it.
        let (mut stream, _) = listener.accept().unwrap();
        read_head(&mut stream);
        drop(stream);
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    let h1 = http1(&client);
    let conn = h1.connect().await.unwrap();
    let result = send_on(h1, conn, false, outgoing(h1, "/mcp")).await;
    server.join().unwrap();
    assert!(
        matches!(result, Err(Retry::Failed(SendError::Exchange(_)))),
        "a request the upstream read is not proven unread"
    );
    assert_eq!(closed.before_request.get() + closed.unacknowledged.get(), 0);
}

#[tokio::test]
async fn a_pooled_connection_that_fails_unwritten_hands_the_request_back_whole() {
    // A pooled connection that passed the kernel check and then failed on its first write
    // (the upstream's reset arrived in between): the request was not touched, and goes on
    // another connection as it is. Here the connection is reset before it is used.
    let (listener, base) = listening();
    let (reset, resetting) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        // Only once the client holds the connection: a reset that arrives while the connect
        // is still completing fails the connect instead (tokio reads the socket's error then).
        resetting.recv().unwrap();
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(stream);
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    let h1 = http1(&client);
    let conn = h1.connect().await.unwrap();
    reset.send(()).unwrap();
    server.join().unwrap();
    block_until_closed(&conn);
    let result = send_on(h1, conn, true, outgoing(h1, "/mcp")).await;
    let Err(Retry::Again(back)) = result else {
        panic!("the request comes back whole");
    };
    assert_eq!(
        closed.idle.get(),
        1,
        "counted as a pooled connection found closed"
    );
    // And it is the same request: sent on a live connection, it is answered.
    let (listener2, base2) = listening();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener2.accept().unwrap();
        read_head(&mut stream);
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .unwrap();
    });
    let other = client_to(&base2);
    let h1b = http1(&other);
    let conn = h1b.connect().await.unwrap();
    let Ok(resp) = send_on(h1b, conn, false, *back).await else {
        panic!("the handed-back request was not sent");
    };
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"ok");
    server.join().unwrap();
}

fn client_to(base: &Uri) -> Client {
    client(base, &ClosedCounters::default())
}

#[tokio::test]
async fn an_answered_request_returns_its_connection_to_the_pool() {
    let (listener, base) = listening();
    let (done, finished) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // Both requests on this one connection, or the second read fails the test.
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        for _ in 0..2 {
            read_head(&mut stream);
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .unwrap();
        }
        // Open until the test has looked at the pool.
        finished.recv().unwrap();
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    for _ in 0..2 {
        let resp = client
            .request(request("http://upstream/mcp"))
            .await
            .unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"ok");
    }
    // One accepted connection served both (the live one passed the kernel check), and it is
    // idle again.
    assert_eq!(client.idle_connections(), 1);
    assert_eq!(closed.idle.get(), 0);
    done.send(()).unwrap();
    server.join().unwrap();
}

#[tokio::test]
async fn a_request_the_upstream_read_and_then_reset_is_not_proven_unread() {
    // A reset carries no acknowledgement Linux reads, and the server's may still be delayed
    // when it aborts: a request it read and reset on must stay "may have run". Warmed up first,
    // so the server's TCP has left quick-ACK mode and delays its ACKs as it usually does.
    let (listener, base) = listening();
    const WARM: usize = 20;
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        for _ in 0..WARM {
            read_head(&mut stream);
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .unwrap();
        }
        read_head(&mut stream);
        // Abort: SO_LINGER 0 makes the close a RST.
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(stream);
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    for _ in 0..WARM {
        let resp = client
            .request(request("/mcp"))
            .await
            .expect("a warm-up request");
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
    }
    assert_eq!(client.idle_connections(), 1, "one warm connection");
    let result = client.request(request("/mcp")).await;
    server.join().unwrap();
    assert!(
        matches!(result, Err(SendError::Exchange(_))),
        "a reset after the upstream read the request proves nothing"
    );
    assert_eq!(closed.unacknowledged.get(), 0);
}

#[tokio::test]
async fn every_new_connection_asks_the_resolver_again() {
    // The backend is recreated at a new address under the same name and port: the first
    // connection must go to the old address, the next one to the new one. 127.0.0.2 is
    // loopback too on Linux; a port free on 127.0.0.1 may be taken on 127.0.0.2, so bind
    // pairs until one fits.
    let (old, new) = loop {
        let old = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = old.local_addr().unwrap().port();
        if let Ok(new) = TcpListener::bind(("127.0.0.2", port)) {
            break (old, new);
        }
    };
    let port = old.local_addr().unwrap().port();
    let serve = |listener: TcpListener, body: &'static str| {
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            read_head(&mut stream);
            // `Connection: close`: the connection is not pooled, the next request needs a new one.
            let answer = format!(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).unwrap();
        })
    };
    let servers = [serve(old, "old"), serve(new, "new")];

    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answers = asked.clone();
    let resolver = connector::Resolver::Table(std::sync::Arc::new(move |host: &str, port| {
        assert_eq!(host, "backend.test");
        let ip = match answers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => [127, 0, 0, 1],
            _ => [127, 0, 0, 2],
        };
        vec![std::net::SocketAddr::from((ip, port))]
    }));
    let base: Uri = format!("http://backend.test:{port}/").parse().unwrap();
    let closed = ClosedCounters::default();
    let mut client = client(&base, &closed);
    match &mut client.inner {
        Inner::Http1(h1) => h1.connector = h1.connector.clone().with_resolver(resolver),
        Inner::Pooled(_) => unreachable!("an http:// upstream"),
    }

    let mut bodies = Vec::new();
    for _ in 0..2 {
        let resp = client.request(request("/mcp")).await.expect("an answer");
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        bodies.push(body);
    }
    for server in servers {
        server.join().unwrap();
    }
    assert_eq!(bodies, [&b"old"[..], &b"new"[..]]);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_kept_head_is_lent_to_each_attempt_and_goes_out_whole_each_time() {
    let (listener, base) = listening();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut heads = Vec::new();
        for _ in 0..2 {
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") {
                stream.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            heads.push(String::from_utf8(head).unwrap());
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
        }
        heads
    });
    let closed = ClosedCounters::default();
    let client = client(&base, &closed);
    // No Host, a length said twice, no body: the wire head gains a Host and one length line.
    let (parts, ()) = Request::post(format!("{base}mcp"))
        .header("content-length", "0")
        .header("content-length", "0")
        .header("x-a", "1")
        .body(())
        .unwrap()
        .into_parts();
    let kept = parts.headers.clone();
    for _ in 0..2 {
        let body = BodyHandle::from_bytes(Bytes::new()).attempt().unwrap();
        let resp = client.send(Head::of(&parts), body).await.unwrap();
        assert_eq!(resp.status(), 200);
        drop(resp);
    }
    assert_eq!(parts.headers, kept, "the kept head is unchanged");
    let authority = base.authority().unwrap();
    let expected =
        format!("POST /mcp HTTP/1.1\r\nx-a: 1\r\nhost: {authority}\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(server.join().unwrap(), [expected.clone(), expected]);
}
