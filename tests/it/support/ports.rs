//! Ports for servers that stop and start again on the same port.
//!
//! A port from `127.0.0.1:0` comes from the kernel's ephemeral range (32768–60999 here), which
//! is also where every outgoing connection's local port comes from: once a test server stops,
//! any connection any other test opens may take its port before the server is back ("rebind …:
//! Address already in use", seen on a busy machine). Ports below that range are never handed
//! out by the kernel: only another pick from here could take one, and each pick is checked.

use std::net::{SocketAddr, TcpListener};

/// The range picked from: below the ephemeral range, above the well-known services.
const QUIET: std::ops::Range<u16> = 20_000..32_000;

/// A port outside the ephemeral range that `try_bind` accepts (it binds the port, or says it is
/// taken).
pub fn quiet_with<T>(mut try_bind: impl FnMut(SocketAddr) -> Option<T>) -> T {
    for _ in 0..1000 {
        let port = QUIET.start + fastrand::u16(..QUIET.end - QUIET.start);
        if let Some(bound) = try_bind(SocketAddr::from(([127, 0, 0, 1], port))) {
            return bound;
        }
    }
    panic!("no free port in {QUIET:?}");
}

/// A port outside the ephemeral range, free now, for a server that binds it itself (a child
/// process).
pub fn quiet() -> u16 {
    quiet_with(|addr| TcpListener::bind(addr).ok().map(|_| addr.port()))
}
