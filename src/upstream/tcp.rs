//! A plain TCP connection to the upstream that the pool can still look at while hyper owns it.
//!
//! hyper's connection task reads and writes the socket; the pool needs two answers from the
//! kernel that the task cannot give it:
//!
//! - **Before a pooled connection carries a request:** has the upstream already closed it? A FIN
//!   or RST may sit in the kernel while the connection task has not run yet (tokio learns of it
//!   only when the reactor next polls), so the task would write the request into a closed
//!   connection and report a failure that looks like "sent, then reset". A non-blocking
//!   `MSG_PEEK` asks the kernel directly ([`TcpHandle::check`]).
//! - **After an exchange failed:** did the upstream's TCP acknowledge any byte of this request?
//!   The kernel counts the bytes the peer acknowledged (`tcpi_bytes_acked`); this wrapper counts
//!   the bytes written. A request none of whose bytes were acknowledged never reached the peer's
//!   socket buffer, so the application cannot have read it: a peer that had closed (or was
//!   killed) answers new data with a RST and acknowledges none of it
//!   ([`TcpHandle::acknowledged_since`]).
//!
//! Both share the socket through an `Arc`, so the descriptor stays open (and means this
//! connection) for as long as either looks at it.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The socket, shared by hyper's connection task and the pool.
#[derive(Debug)]
struct Shared {
    tcp: TcpStream,
    /// Bytes written to the socket since it connected.
    written: AtomicU64,
    /// `tcpi_bytes_acked` right after connecting: the handshake's SYN counts there too.
    acked_at_connect: u64,
}

/// The connection as hyper reads and writes it.
#[derive(Debug)]
pub struct SharedTcp(Arc<Shared>);

/// The pool's view of the same connection.
#[derive(Debug, Clone)]
pub struct TcpHandle(Arc<Shared>);

/// What the kernel says about an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Open, nothing waiting: it can carry a request.
    Open,
    /// The upstream closed it (FIN) or reset it (RST): never reuse it.
    Closed,
    /// The upstream sent bytes nobody asked for (it is not an HTTP server waiting for a
    /// request, or answered one twice): never reuse it either.
    Unasked,
}

impl SharedTcp {
    /// Wraps a connected stream.
    pub fn new(tcp: TcpStream) -> Self {
        let acked_at_connect = tcp_info(&tcp).map_or(0, |i| i.tcpi_bytes_acked);
        SharedTcp(Arc::new(Shared {
            tcp,
            written: AtomicU64::new(0),
            acked_at_connect,
        }))
    }

    /// A handle for the pool.
    pub fn handle(&self) -> TcpHandle {
        TcpHandle(self.0.clone())
    }
}

impl TcpHandle {
    /// Asks the kernel whether the upstream closed this idle connection: a non-blocking peek,
    /// which reads nothing.
    pub fn check(&self) -> Idle {
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(&self.0.tcp).peek(&mut byte) {
            // Nothing to read: open and quiet, as an idle HTTP/1 connection should be.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Idle::Open,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Idle::Open,
            // 0: the upstream's FIN; an error: its RST.
            Ok(0) | Err(_) => Idle::Closed,
            // An answer to nothing, which hyper would refuse on the next request anyway.
            Ok(_) => Idle::Unasked,
        }
    }

    /// Bytes written so far: the mark a request's own bytes start from.
    pub fn written(&self) -> u64 {
        self.0.written.load(Ordering::Acquire)
    }

    /// Whether the upstream's TCP acknowledged any byte written after `mark`. `None` when the
    /// kernel cannot tell (then nothing is proven).
    pub fn acknowledged_since(&self, mark: u64) -> Option<bool> {
        let acked = tcp_info(&self.0.tcp).ok()?.tcpi_bytes_acked;
        acknowledged(self.0.acked_at_connect, acked, mark)
    }
}

/// Whether a count of acknowledged bytes (`acked`, `tcpi_bytes_acked`, and what it was right
/// after connecting) covers any byte written after `mark`. `None` when the kernel does not
/// keep the count: Linux counts the handshake's SYN, so a connected socket reads at least 1,
/// while a kernel that leaves the field out (Linux before 4.1, user-space network stacks such as
/// gVisor's) reads 0, and "nothing acknowledged" would then be no proof of anything.
fn acknowledged(at_connect: u64, acked: u64, mark: u64) -> Option<bool> {
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

impl hyper::rt::Read for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let tcp = &self.0.tcp;
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            // SAFETY: `recv` only writes into the cursor's unfilled memory, and the cursor is
            // advanced by exactly the number of bytes it wrote.
            let unfilled = unsafe { buf.as_mut() };
            match tcp.try_io(Interest::READABLE, || {
                socket2::SockRef::from(tcp).recv(unfilled)
            }) {
                Ok(n) => {
                    // SAFETY: `recv` initialised the first `n` bytes.
                    unsafe { buf.advance(n) };
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale: `try_io` cleared it, so the next poll waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl hyper::rt::Write for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let shared = &self.0;
        loop {
            ready!(shared.tcp.poll_write_ready(cx))?;
            match shared.tcp.try_write(buf) {
                Ok(n) => {
                    shared.written.fetch_add(n as u64, Ordering::Release);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let shared = &self.0;
        loop {
            ready!(shared.tcp.poll_write_ready(cx))?;
            match shared.tcp.try_write_vectored(bufs) {
                Ok(n) => {
                    shared.written.fetch_add(n as u64, Ordering::Release);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket: nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = socket2::SockRef::from(&self.0.tcp).shutdown(std::net::Shutdown::Write);
        match shut {
            // Already reset or closed by the peer: shut down as far as anyone can tell.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            other => Poll::Ready(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// `TCP_CLOSE` of the kernel's `include/net/tcp_states.h`: the state after a RST.
    const TCP_CLOSE: u8 = 7;

    /// A connected pair: ours wrapped, the peer's plain.
    async fn pair() -> (SharedTcp, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (SharedTcp::new(ours.unwrap()), theirs.unwrap().0)
    }

    /// Writes `bytes` through hyper's write trait.
    async fn write_all(io: &mut SharedTcp, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let n = std::future::poll_fn(|cx| {
                hyper::rt::Write::poll_write(Pin::new(&mut *io), cx, &bytes[at..])
            })
            .await
            .unwrap();
            at += n;
        }
    }

    /// Waits, bounded, until the kernel reports the peer's close of `handle`'s connection.
    async fn until_closed(handle: &TcpHandle) {
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while handle.check() == Idle::Open {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the peer's close reaches the kernel");
    }

    #[tokio::test]
    async fn an_open_quiet_connection_is_open() {
        let (ours, _theirs) = pair().await;
        assert_eq!(ours.handle().check(), Idle::Open);
    }

    #[tokio::test]
    async fn the_peers_close_shows_before_anyone_reads() {
        let (ours, theirs) = pair().await;
        let handle = ours.handle();
        drop(theirs);
        until_closed(&handle).await;
        assert_eq!(handle.check(), Idle::Closed);
    }

    #[tokio::test]
    async fn unrequested_bytes_make_a_connection_unusable() {
        let (ours, mut theirs) = pair().await;
        tokio::io::AsyncWriteExt::write_all(&mut theirs, b"HTTP/1.1 200 OK\r\n")
            .await
            .unwrap();
        let handle = ours.handle();
        until_closed(&handle).await;
        assert_eq!(handle.check(), Idle::Unasked);
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
        let handle = ours.handle();
        let mark = handle.written();
        assert_eq!(mark, 0);
        write_all(&mut ours, b"hello").await;
        assert_eq!(handle.written(), 5);
        let mut got = [0u8; 5];
        theirs.read_exact(&mut got).await.unwrap();
        // The peer's kernel acknowledges within its delayed-ACK time; wait for it, bounded.
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while handle.acknowledged_since(mark) != Some(true) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the peer's ACK arrives");
    }

    #[tokio::test]
    async fn bytes_sent_to_a_closed_peer_are_never_acknowledged() {
        let (mut ours, theirs) = pair().await;
        let handle = ours.handle();
        drop(theirs);
        until_closed(&handle).await;
        let mark = handle.written();
        // The kernel takes the write; the closed peer answers it with a RST, not an ACK. Wait
        // for that answer (the connection's state becomes CLOSE), bounded, then look.
        write_all(&mut ours, b"POST /mcp HTTP/1.1\r\n\r\n").await;
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while tcp_info(&handle.0.tcp).unwrap().tcpi_state != TCP_CLOSE {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the peer resets the connection");
        assert_eq!(handle.acknowledged_since(mark), Some(false));
    }
}
