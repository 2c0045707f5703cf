//! One 2025 session's GET stream, shared by the `subscriptions/listen` streams of its
//! principal's 2026-07-28 clients. A 2025 server allows one GET stream per session (the
//! TypeScript SDK answers a second 409), and sends on it every change of the session; each
//! listen takes from it what it asked for (src/bridge/listen.rs). The stream is read by one task
//! ([`Feed::pump`]) for as long as a listen is open: the last one gone, the GET is closed. When
//! the server ends it (a restart), every listen ends with it, abruptly: a 2026 client then
//! listens again (the spec's rule), on the re-established session.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, Notify};

use crate::sse;

/// Events a listen may be behind before it is cut (its client listens again).
pub const LISTEN_BACKLOG: usize = 64;

/// The readers of one GET stream.
#[derive(Debug, Default)]
pub struct Feed {
    readers: Mutex<Readers>,
    /// A reader went away: the pump checks whether any is left.
    left: Notify,
}

#[derive(Debug, Default)]
struct Readers {
    to: Vec<mpsc::Sender<Bytes>>,
    /// The pump stopped: joining it gets nothing, a new GET is needed.
    ended: bool,
}

/// A listen's place on a feed: its events, and a word to the pump when it goes.
#[derive(Debug)]
pub struct Reader {
    pub events: mpsc::Receiver<Bytes>,
    feed: Arc<Feed>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.feed.left.notify_one();
    }
}

impl Feed {
    /// A new reader of this feed, `None` once its pump stopped.
    pub fn join(self: &Arc<Self>) -> Option<Reader> {
        let mut readers = lock(&self.readers);
        if readers.ended {
            return None;
        }
        let (to, events) = mpsc::channel(LISTEN_BACKLOG);
        readers.to.push(to);
        Some(Reader {
            events,
            feed: self.clone(),
        })
    }

    /// Whether the pump stopped.
    pub fn ended(&self) -> bool {
        lock(&self.readers).ended
    }

    /// Reads the GET stream `body`, handing each event's data to every reader, until it ends or
    /// no reader is left; then every reader's events end.
    pub async fn pump<B>(self: Arc<Self>, body: B)
    where
        B: Body<Data = Bytes> + Unpin,
    {
        let mut body = body;
        let mut parser = sse::Parser::new(super::MAX_EVENT);
        loop {
            tokio::select! {
                frame = body.frame() => {
                    let Some(Ok(frame)) = frame else { break };
                    let Ok(data) = frame.into_data() else { continue };
                    let mut events = Vec::new();
                    parser.feed(&data, |event| {
                        if event.has_data && !event.cut {
                            events.push(Bytes::from(event.data));
                        }
                    });
                    if !self.hand_out(events) {
                        break;
                    }
                }
                () = self.left.notified() => {
                    if !self.hand_out(Vec::new()) {
                        break;
                    }
                }
            }
        }
        let mut readers = lock(&self.readers);
        readers.ended = true;
        readers.to.clear();
    }

    /// Hands `events` to every reader; a reader gone, or too far behind, is let go. False when
    /// none is left, and the feed ended (under the same lock as [`Feed::join`], so no reader
    /// joins a feed that is stopping).
    fn hand_out(&self, events: Vec<Bytes>) -> bool {
        let mut readers = lock(&self.readers);
        readers.to.retain(|to| {
            events.iter().all(|event| match to.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::debug!("bridge: a listen fell behind its session's stream; cut");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }) && !to.is_closed()
        });
        if readers.to.is_empty() {
            readers.ended = true;
        }
        !readers.ended
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Sent = mpsc::Sender<Bytes>;

    /// A GET stream's body, written by the test.
    struct Written(mpsc::Receiver<Bytes>);

    impl Body for Written {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|data| data.map(|d| Ok(http_body::Frame::data(d))))
        }
    }

    /// A GET stream the test writes to, and a pump reading it.
    fn stream() -> (Sent, Arc<Feed>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(16);
        let feed = Arc::new(Feed::default());
        let pump = tokio::spawn(feed.clone().pump(Written(rx)));
        (tx, feed, pump)
    }

    async fn send(tx: &Sent, text: &str) {
        tx.send(Bytes::from(text.to_owned())).await.unwrap();
    }

    #[tokio::test]
    async fn every_reader_gets_each_event_and_the_last_one_gone_closes_the_stream() {
        let (tx, feed, pump) = stream();
        let mut a = feed.join().unwrap();
        let mut b = feed.join().unwrap();
        send(&tx, "data: one\n\ndata: two\n\n: a comment\n\n").await;
        for reader in [&mut a, &mut b] {
            assert_eq!(reader.events.recv().await.unwrap(), "one");
            assert_eq!(reader.events.recv().await.unwrap(), "two");
        }
        drop(a);
        send(&tx, "data: three\n\n").await;
        assert_eq!(b.events.recv().await.unwrap(), "three");
        drop(b);
        pump.await.unwrap();
        assert!(feed.ended());
        assert!(feed.join().is_none(), "a stopped feed takes nobody");
        assert!(tx.is_closed(), "the GET stream was let go");
    }

    #[tokio::test]
    async fn the_streams_end_ends_every_reader() {
        let (tx, feed, pump) = stream();
        let mut a = feed.join().unwrap();
        send(&tx, "data: one\n\n").await;
        drop(tx);
        pump.await.unwrap();
        assert_eq!(a.events.recv().await.unwrap(), "one");
        assert_eq!(a.events.recv().await, None);
    }

    #[tokio::test]
    async fn a_reader_too_far_behind_is_cut_and_the_others_go_on() {
        let (tx, feed, _pump) = stream();
        let mut slow = feed.join().unwrap();
        let mut quick = feed.join().unwrap();
        for n in 0..=LISTEN_BACKLOG {
            send(&tx, &format!("data: {n}\n\n")).await;
            assert_eq!(quick.events.recv().await.unwrap(), n.to_string());
        }
        let mut got = 0;
        while slow.events.recv().await.is_some() {
            got += 1;
        }
        assert_eq!(got, LISTEN_BACKLOG, "what it had room for, then its end");
        send(&tx, "data: after\n\n").await;
        assert_eq!(quick.events.recv().await.unwrap(), "after");
    }
}
