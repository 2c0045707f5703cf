//! Listening sockets: binding them (naming the address in the error) and accepting on them
//! (pausing after a failure), the same for the proxy and the admin listener.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Pause after a failed accept.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Binds a listener, naming the address in the error.
pub async fn bind(addr: SocketAddr, what: &'static str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| std::io::Error::new(source.kind(), BindError { addr, what, source }))
}

/// A listener could not be bound; keeps the OS error as its cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what})")]
pub struct BindError {
    addr: SocketAddr,
    what: &'static str,
    #[source]
    source: std::io::Error,
}

/// The next connection on `listener` (`what` names it in the log). A failed accept is either
/// one connection's (a reset before accept) or the process's (out of file descriptors): either
/// way accepting goes on, after a pause, or an exhausted process spins a core on failing accepts
/// and floods the log.
pub async fn accept(listener: &TcpListener, what: &'static str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, listener = what, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}
