//! `[forwarded]`: which peers' `X-Forwarded-*` and `Forwarded` headers holdfast believes.
//!
//! A client that reaches holdfast directly can claim any address, Host or scheme in
//! `X-Forwarded-For/-Proto/-Host`; appended to, its claim would stay the first entry, the one
//! MCP servers read as the client. So only a peer in `forwarded.trusted_proxies` (a proxy in
//! front: nginx on the same host, Traefik, an ingress) has its headers kept, holdfast's own
//! appended; from any other peer they are replaced by holdfast's own. Empty by default: the
//! sidecar and gateway recipes have clients reach holdfast directly.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// `[forwarded]` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawForwarded {
    /// Addresses (`10.0.0.7`) and networks (`10.0.0.0/8`, `fd00::/8`) of the proxies in front.
    pub trusted_proxies: Vec<String>,
}

/// One address or network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    /// `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, or one with `/n`.
    fn parse(text: &str) -> Result<Net, String> {
        let bad = || format!("expected an IP address or network such as 10.0.0.0/8, got {text:?}");
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
        };
        Ok(Net { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The validated list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Net>);

impl TrustedProxies {
    /// Whether `peer` is one of the proxies in front (an IPv4 peer seen on an IPv6 listener,
    /// `::ffff:a.b.c.d`, counts as its IPv4 address).
    pub fn trusts(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.0.iter().any(|net| net.contains(peer))
    }
}

impl Validator<'_> {
    /// Checks `[forwarded]`; `None` when a problem was recorded.
    pub(super) fn forwarded(&mut self, raw: &RawForwarded) -> Option<TrustedProxies> {
        let mut nets = Vec::new();
        let mut ok = true;
        for (i, text) in raw.trusted_proxies.iter().enumerate() {
            match Net::parse(text) {
                Ok(net) => nets.push(net),
                Err(e) => {
                    ok = false;
                    self.fail::<()>(&format!("forwarded.trusted_proxies[{i}]"), e);
                }
            }
        }
        ok.then_some(TrustedProxies(nets))
    }
}

impl TrustedProxies {
    /// The list `list` names, for tests elsewhere in the crate; panics on a bad entry.
    #[cfg(test)]
    pub(crate) fn for_tests(list: &[&str]) -> TrustedProxies {
        TrustedProxies(list.iter().map(|t| Net::parse(t).unwrap()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies(list.iter().map(|t| Net::parse(t).unwrap()).collect())
    }

    #[test]
    fn addresses_and_networks_of_both_families() {
        let t = trusted(&["10.0.0.0/8", "192.168.1.7", "fd00::/8", "::1"]);
        for yes in [
            "10.1.2.3",
            "192.168.1.7",
            "fd12::5",
            "::1",
            "::ffff:10.9.9.9",
        ] {
            assert!(t.trusts(yes.parse().unwrap()), "{yes}");
        }
        for no in [
            "11.0.0.1",
            "192.168.1.8",
            "fe80::1",
            "127.0.0.1",
            "::ffff:11.0.0.1",
        ] {
            assert!(!t.trusts(no.parse().unwrap()), "{no}");
        }
        assert!(trusted(&["0.0.0.0/0"]).trusts("203.0.113.9".parse().unwrap()));
        assert!(!TrustedProxies::default().trusts("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn what_is_no_address_or_network_is_refused() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0",
            "localhost",
            "10.0.0.0/",
            "/8",
            "",
        ] {
            assert!(Net::parse(bad).is_err(), "{bad:?}");
        }
    }
}
