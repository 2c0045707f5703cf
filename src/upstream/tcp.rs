//! What the kernel knows about an upstream connection that the HTTP/1 exchange does not.
//!
//! - **Before a pooled connection carries a request:** has the upstream already closed it? A FIN
//!   or RST may sit in the kernel unread (nothing reads an idle pooled connection), so the
//!   request would be written into a closed connection. A non-blocking `MSG_PEEK` asks the
//!   kernel directly ([`check`]); a connection back from its last response a moment ago is
//!   asked only if the reactor reported something on it ([`check_idle`]: one system call less
//!   per request under load).
//! - **After an exchange failed:** did the upstream's TCP acknowledge any byte of this request?
//!   The kernel counts the bytes the peer acknowledged (`tcpi_bytes_acked`, [`bytes_acked`]);
//!   the connection counts the bytes written. A request none of whose bytes were acknowledged
//!   never reached the peer's socket buffer, so the application cannot have read it: a peer that
//!   had closed (or was killed) answers new data with a RST and acknowledges none of it
//!   ([`acknowledged`]).

use std::io;
use std::mem::MaybeUninit;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// What the kernel says about an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Open, nothing waiting: it can carry a request.
    Open,
    /// The upstream closed it (FIN) or reset it (RST): never reuse it.
    Closed,
    /// The upstream sent bytes nobody asked for (it is not an HTTP server waiting for a
    /// request, or answered one twice): never reuse it either.
    Unasked,
}

/// How long a connection may have sat idle and still be taken on the reactor's word alone.
/// Servers close idle connections after their keep-alive timeout (seconds: uvicorn's and Node's
/// 5 s, gunicorn's 2 s), so a close is likeliest on a connection idle that long, and the kernel is
/// asked; a connection back from its response a moment ago is closed only by a backend that is
/// going away (or one whose keep-alive timeout is under a second), and a request written into it
/// then is proven unread all the same (row 1b) and goes once more on another connection.
pub const TRUSTED_IDLE: Duration = Duration::from_secs(1);

/// Asks the kernel whether the upstream closed this idle connection: a non-blocking peek,
/// which reads nothing.
pub fn check(tcp: &TcpStream) -> Liveness {
    liveness(peek(tcp))
}

/// [`check`] for a connection idle for `idle`, without the system call where it proves little:
/// idle less than [`TRUSTED_IDLE`] and nothing reported on it by the reactor since its last
/// response was read (that read drained the socket and cleared its readiness; a FIN, a RST or
/// unasked bytes since then make it readable again once the reactor polls). What the reactor
/// has not polled yet is the gap: a FIN that arrived a moment ago. The request written into
/// that connection meets the FIN, and the kernel proves it unread (`tcpi_bytes_acked`). Unasked
/// bytes that arrive in that moment are read as the next answer, as they always were when they
/// arrived a moment after the peek: the check narrows that window, it never closed it.
pub fn check_idle(tcp: &TcpStream, idle: Duration) -> Liveness {
    if idle >= TRUSTED_IDLE {
        return check(tcp);
    }
    // `try_io` runs the peek only when the reactor reported readiness, and clears a readiness
    // the peek finds stale.
    liveness(tcp.try_io(Interest::READABLE, || peek(tcp)))
}

/// A non-blocking `MSG_PEEK` of one byte.
fn peek(tcp: &TcpStream) -> io::Result<usize> {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    socket2::SockRef::from(tcp).peek(&mut byte)
}

/// What a peek's result says.
fn liveness(peeked: io::Result<usize>) -> Liveness {
    match peeked {
        // Nothing to read: open and quiet, as an idle HTTP/1 connection should be.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Liveness::Open,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Liveness::Open,
        // 0: the upstream's FIN; an error: its RST.
        Ok(0) | Err(_) => Liveness::Closed,
        // An answer to nothing.
        Ok(_) => Liveness::Unasked,
    }
}

/// `tcpi_bytes_acked`: bytes of this connection the peer acknowledged (the SYN counts as one).
pub fn bytes_acked(tcp: &TcpStream) -> io::Result<u64> {
    tcp_info(tcp).map(|i| i.tcpi_bytes_acked)
}

/// Whether a count of acknowledged bytes (`acked`, `tcpi_bytes_acked`, and what it was right
/// after connecting) covers any byte written after `mark`. `None` when the kernel does not
/// keep the count: Linux counts the handshake's SYN, so a connected socket reads at least 1,
/// while a kernel that leaves the field out (Linux before 4.1, user-space network stacks such as
/// gVisor's) reads 0, and "nothing acknowledged" would then be no proof of anything.
pub fn acknowledged(at_connect: u64, acked: u64, mark: u64) -> Option<bool> {
    if at_connect == 0 {
        return None;
    }
    Some(acked.checked_sub(at_connect)? > mark)
}

/// `getsockopt(TCP_INFO)`: Linux only (elsewhere nothing is proven by it).
#[cfg(not(target_os = "linux"))]
fn tcp_info(_: &TcpStream) -> io::Result<TcpInfo> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(not(target_os = "linux"))]
struct TcpInfo {
    tcpi_bytes_acked: u64,
}

/// `getsockopt(TCP_INFO)`. A kernel that fills less than `tcpi_bytes_acked` is an error:
/// without that field nothing is proven.
#[cfg(target_os = "linux")]
fn tcp_info(tcp: &TcpStream) -> io::Result<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for as long as `tcp` lives, and the kernel writes at most
    // `len` bytes into `info`, which is zeroed first: fields an older kernel does not fill
    // stay 0, a valid value for every field of this plain C struct.
    let rc = unsafe {
        libc::getsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
    if (len as usize) < needed {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    // SAFETY: zero-initialised above, and partly or wholly filled in by the kernel.
    Ok(unsafe { info.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `TCP_CLOSE` of the kernel's `include/net/tcp_states.h`: the state after a RST.
    const TCP_CLOSE: u8 = 7;

    /// A connected pair: ours and the peer's.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (ours.unwrap(), theirs.unwrap().0)
    }

    /// Waits, bounded, until the kernel reports the peer's close of `tcp`.
    async fn until_closed(tcp: &TcpStream) {
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while check(tcp) == Liveness::Open {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the peer's close reaches the kernel");
    }

    #[tokio::test]
    async fn an_open_quiet_connection_is_open() {
        let (ours, _theirs) = pair().await;
        assert_eq!(check(&ours), Liveness::Open);
    }

    #[tokio::test]
    async fn the_peers_close_shows_before_anyone_reads() {
        let (ours, theirs) = pair().await;
        drop(theirs);
        until_closed(&ours).await;
        assert_eq!(check(&ours), Liveness::Closed);
    }

    #[tokio::test]
    async fn a_close_the_reactor_reported_is_seen_however_fresh_the_connection() {
        let (ours, theirs) = pair().await;
        drop(theirs);
        // Awaits the reactor's report of the close (the FIN makes the socket readable).
        ours.readable().await.unwrap();
        assert_eq!(check_idle(&ours, Duration::ZERO), Liveness::Closed);
    }

    #[tokio::test]
    async fn a_connection_idle_a_while_is_asked_before_the_reactor_knows() {
        let (ours, theirs) = pair().await;
        drop(theirs);
        // Nothing is awaited from here on: the reactor does not poll, and only the kernel knows
        // of the close. Wait for it there, then ask as the pool would after a second idle.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while check(&ours) == Liveness::Open {
            assert!(
                std::time::Instant::now() < deadline,
                "the close never arrived"
            );
            std::thread::yield_now();
        }
        assert_eq!(check_idle(&ours, TRUSTED_IDLE), Liveness::Closed);
    }

    #[tokio::test]
    async fn a_fresh_quiet_connection_is_open_even_after_a_stale_report() {
        let (ours, mut theirs) = pair().await;
        // A response read to its end, as the pool's connections are: the read that came up
        // short cleared the readiness.
        theirs.write_all(b"ok").await.unwrap();
        let mut got = [0u8; 16];
        assert_eq!(ours.try_read(&mut got).ok(), None, "not yet reported");
        ours.readable().await.unwrap();
        assert_eq!(ours.try_read(&mut got).unwrap(), 2);
        // Readiness stays set until a read comes back empty; the peek finds it stale once.
        assert_eq!(check_idle(&ours, Duration::ZERO), Liveness::Open);
        assert_eq!(check_idle(&ours, Duration::ZERO), Liveness::Open);
    }

    #[tokio::test]
    async fn unrequested_bytes_make_a_connection_unusable() {
        let (ours, mut theirs) = pair().await;
        theirs.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        until_closed(&ours).await;
        assert_eq!(check(&ours), Liveness::Unasked);
    }

    #[test]
    fn a_kernel_that_keeps_no_count_proves_nothing() {
        // Linux: the SYN counts, then each byte.
        assert_eq!(acknowledged(1, 1, 0), Some(false));
        assert_eq!(acknowledged(1, 6, 0), Some(true));
        assert_eq!(acknowledged(1, 6, 5), Some(false));
        // A zeroed field (an old kernel, gVisor): not "nothing acknowledged", but unknown.
        assert_eq!(acknowledged(0, 0, 0), None);
        assert_eq!(acknowledged(0, 0, 120), None);
    }

    #[tokio::test]
    async fn bytes_the_peer_read_are_acknowledged() {
        let (mut ours, mut theirs) = pair().await;
        let at_connect = bytes_acked(&ours).unwrap();
        ours.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        theirs.read_exact(&mut got).await.unwrap();
        // The peer's kernel acknowledges within its delayed-ACK time; wait for it, bounded.
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while acknowledged(at_connect, bytes_acked(&ours).unwrap(), 0) != Some(true) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the peer's ACK arrives");
    }

    #[tokio::test]
    async fn bytes_sent_to_a_closed_peer_are_never_acknowledged() {
        let (mut ours, theirs) = pair().await;
        let at_connect = bytes_acked(&ours).unwrap();
        drop(theirs);
        until_closed(&ours).await;
        // The kernel takes the write; the closed peer answers it with a RST, not an ACK. Wait
        // for that answer (the connection's state becomes CLOSE), bounded, then look.
        ours.write_all(b"POST /mcp HTTP/1.1\r\n\r\n").await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while tcp_info(&ours).unwrap().tcpi_state != TCP_CLOSE {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the peer resets the connection");
        assert_eq!(
            acknowledged(at_connect, bytes_acked(&ours).unwrap(), 0),
            Some(false)
        );
    }
}
