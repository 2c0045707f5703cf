//! Ports for servers that stop and start again on the same port.
//!
//! A port from `127.0.0.1:0` comes from the kernel's ephemeral range (32768–60999 here), which
//! is also where every outgoing connection's local port comes from: once a test server stops,
//! any connection any other test opens may take its port before the server is back ("rebind …:
//! Address already in use", seen on a busy machine). Ports below that range are never handed
//! out by the kernel: only another pick from here could take one. And a pick could, while the
//! server is down (seen in CI: a test's restart found its port listened on by another test's
//! server), so no port is handed out twice in one run of the suite.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// The range picked from: below the ephemeral range, above the well-known services.
const QUIET: std::ops::Range<u16> = 20_000..32_000;

/// Every port handed out in this process: a server that stops keeps its port for its restart
/// only if nothing else here can be given it meanwhile.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port outside the ephemeral range, never handed out before in this process, that `try_bind`
/// accepts (it binds the port, or says it is taken).
pub fn quiet_with<T>(mut try_bind: impl FnMut(SocketAddr) -> Option<T>) -> T {
    for _ in 0..1000 {
        let port = QUIET.start + fastrand::u16(..QUIET.end - QUIET.start);
        // Held across the bind: two picks at once must not both take a port.
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.contains(&port) {
            continue;
        }
        if let Some(bound) = try_bind(SocketAddr::from(([127, 0, 0, 1], port))) {
            handed_out.insert(port);
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn no_port_is_handed_out_twice() {
        // 500 picks from 12 000 ports repeat one about ten times over when picks are only
        // checked against what is bound now (a port nobody binds is free to pick again).
        let picked: Vec<u16> = (0..500)
            .map(|_| super::quiet_with(|addr| Some(addr.port())))
            .collect();
        let distinct: BTreeSet<u16> = picked.iter().copied().collect();
        assert_eq!(distinct.len(), picked.len());
    }
}
