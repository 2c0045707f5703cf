//! holdfast's own shutdown, as the requests and streams it serves see it.
//!
//! When the drain begins, a client's standalone event stream (a GET) ends at once, cleanly
//! (HTTP/1.1: the final chunk; HTTP/2: END_STREAM): it never ends by itself, so it would make
//! every shutdown wait the whole drain, and be cut without its final chunk at the end of it.
//! Ended cleanly, the client reconnects (with `Last-Event-ID`) to another replica or to the next
//! holdfast. An event stream answering a call (a POST) goes on until the drain's end, then ends
//! cleanly too. A request still waiting for its answer then is cut by holdfast, not by its
//! client: logged `shutdown`, counted in `holdfast_shutdown_cut_requests_total`, never as the
//! client's 499.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;

/// Where holdfast stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Serving.
    Serving,
    /// The drain began: standalone streams end.
    Draining,
    /// The drain is over (its timeout, or a second SIGTERM): every stream ends, and what still
    /// waits is cut.
    Over,
}

/// The phase, told to whoever watches (shared by every proxy a reload makes).
pub struct Ending {
    phase: watch::Sender<Phase>,
}

impl Default for Ending {
    fn default() -> Self {
        Ending {
            phase: watch::Sender::new(Phase::Serving),
        }
    }
}

impl Ending {
    /// Moves to `phase` (never back).
    pub fn reach(&self, phase: Phase) {
        self.phase.send_if_modified(|now| {
            let later = phase > *now;
            if later {
                *now = phase;
            }
            later
        });
    }

    /// Where holdfast stands now.
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Whether the drain is over.
    pub fn is_over(&self) -> bool {
        *self.phase.borrow() == Phase::Over
    }

    /// A watch that is due once the phase reaches `until`.
    pub fn watch(&self, until: Phase) -> EndAt {
        EndAt {
            phase: self.phase.subscribe(),
            until,
            wait: None,
        }
    }
}

/// Due once holdfast's shutdown reaches a phase: what a stream polls besides its upstream.
pub struct EndAt {
    phase: watch::Receiver<Phase>,
    until: Phase,
    /// Made on the first poll that is not due yet (a stream that ends first costs nothing).
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl EndAt {
    /// Whether the phase has been reached; if not, `cx` is woken when it is.
    pub fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        if *self.phase.borrow() >= self.until {
            return true;
        }
        let wait = self.wait.get_or_insert_with(|| {
            let (mut phase, until) = (self.phase.clone(), self.until);
            Box::pin(async move {
                // A closed sender (holdfast gone) never comes: the stream ends otherwise.
                if phase.wait_for(|p| *p >= until).await.is_err() {
                    std::future::pending::<()>().await;
                }
            })
        });
        wait.as_mut().poll(cx) == Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_is_due_at_its_phase_and_after() {
        let ending = Ending::default();
        let mut get = ending.watch(Phase::Draining);
        let mut post = ending.watch(Phase::Over);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(!get.poll_due(&mut cx) && !post.poll_due(&mut cx));
        ending.reach(Phase::Draining);
        assert!(get.poll_due(&mut cx));
        assert!(!post.poll_due(&mut cx));
        assert!(!ending.is_over());
        ending.reach(Phase::Over);
        assert!(post.poll_due(&mut cx) && ending.is_over());
        // Never back.
        ending.reach(Phase::Serving);
        assert!(ending.is_over());
    }

    #[tokio::test]
    async fn a_waiting_stream_is_woken_when_its_phase_comes() {
        let ending = std::sync::Arc::new(Ending::default());
        let mut at = ending.watch(Phase::Over);
        let woken = tokio::spawn(std::future::poll_fn(move |cx| {
            if at.poll_due(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        tokio::task::yield_now().await;
        ending.reach(Phase::Over);
        woken.await.unwrap();
    }
}
