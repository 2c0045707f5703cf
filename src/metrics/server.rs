//! The server's own metrics: configuration reloads, and connections accepted at the limit.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How a reload ended. Bounded: a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    /// The new configuration is in use (what cannot change live was said in a warning).
    ok,
    /// The new configuration is invalid: every problem was logged and the running one stays.
    refused,
}

/// Label set of `holdfast_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// How it ended.
    pub result: ReloadResult,
}

/// What a connection accepted at `limits.max_connections` met. Bounded: a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AtCap {
    /// The longest-idle keep-alive connection was closed to make room for it.
    closed_idle,
    /// No connection was idle: it waited (unserved) for one to end or go idle.
    waited,
}

/// Label set of `holdfast_connections_at_limit_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AtCapLabel {
    /// What it met.
    pub outcome: AtCap,
}

/// The protocol a client connection speaks. Bounded: a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Protocol {
    /// HTTP/1.1 (and 1.0); a plain connection counts as this until it opens with HTTP/2's
    /// preface.
    http1,
    /// HTTP/2: h2c with prior knowledge, or `h2` by ALPN.
    http2,
}

/// What a client connection runs over. Bounded: a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Transport {
    /// Plain TCP.
    plain,
    /// TLS (counted once its handshake is done).
    tls,
}

/// Label set of `holdfast_client_connections`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabel {
    /// Its protocol.
    pub protocol: Protocol,
    /// Its transport.
    pub transport: Transport,
}

/// `holdfast_client_connections{protocol,transport}`: client connections open now. Each of
/// the four series is kept at hand: a connection counts itself without a lookup.
#[derive(Debug, Clone, Default)]
pub struct ClientConnections {
    family: Family<ConnectionLabel, Gauge>,
    gauges: [Gauge; 4],
}

impl ClientConnections {
    fn new() -> Self {
        let family = Family::<ConnectionLabel, Gauge>::default();
        let gauge = |protocol, transport| {
            family
                .get_or_create(&ConnectionLabel {
                    protocol,
                    transport,
                })
                .clone()
        };
        let gauges = [
            gauge(Protocol::http1, Transport::plain),
            gauge(Protocol::http1, Transport::tls),
            gauge(Protocol::http2, Transport::plain),
            gauge(Protocol::http2, Transport::tls),
        ];
        ClientConnections { family, gauges }
    }

    /// Counts one connection open while the returned guard lives.
    pub fn open(&self, protocol: Protocol, transport: Transport) -> OpenConnection {
        let i =
            2 * usize::from(protocol == Protocol::http2) + usize::from(transport == Transport::tls);
        let gauge = self.gauges[i].clone();
        gauge.inc();
        OpenConnection(gauge)
    }
}

/// One client connection, counted open until dropped.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The server's metrics.
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics {
    /// `holdfast_config_reloads_total{result}`: SIGHUPs, by whether the configuration read then
    /// was taken.
    pub config_reloads: Family<ReloadLabel, Counter>,
    /// `holdfast_connections_at_limit_total{outcome}`: connections accepted while
    /// `limits.max_connections` were open.
    pub at_cap: Family<AtCapLabel, Counter>,
    /// `holdfast_client_connections{protocol,transport}`: client connections open now.
    pub connections: ClientConnections,
}

impl ServerMetrics {
    /// Registers every metric in `registry`, each series created at 0.
    pub fn register(registry: &mut Registry) -> ServerMetrics {
        let m = ServerMetrics {
            connections: ClientConnections::new(),
            ..ServerMetrics::default()
        };
        for result in [ReloadResult::ok, ReloadResult::refused] {
            let _ = m.config_reloads.get_or_create(&ReloadLabel { result });
        }
        for outcome in [AtCap::closed_idle, AtCap::waited] {
            let _ = m.at_cap.get_or_create(&AtCapLabel { outcome });
        }
        let r = registry.sub_registry_with_prefix("holdfast");
        r.register(
            "connections_at_limit",
            "Connections accepted while limits.max_connections were open, by what they met",
            m.at_cap.clone(),
        );
        r.register(
            "client_connections",
            "Client connections open now, by protocol (http1 until a plain connection shows \
             HTTP/2's preface) and transport",
            m.connections.family.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads (SIGHUP), by whether the configuration read was taken",
            m.config_reloads.clone(),
        );
        m
    }

    /// Counts one connection accepted at the limit.
    pub fn at_cap(&self, outcome: AtCap) {
        self.at_cap.get_or_create(&AtCapLabel { outcome }).inc();
    }

    /// Counts one reload.
    pub fn reloaded(&self, result: ReloadResult) {
        self.config_reloads
            .get_or_create(&ReloadLabel { result })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_connection_counts_in_its_own_series_while_it_lives() {
        let c = ClientConnections::new();
        let series = |protocol, transport| {
            c.family
                .get_or_create(&ConnectionLabel {
                    protocol,
                    transport,
                })
                .get()
        };
        let a = c.open(Protocol::http1, Transport::plain);
        let b = c.open(Protocol::http2, Transport::tls);
        let d = c.open(Protocol::http2, Transport::tls);
        assert_eq!(series(Protocol::http1, Transport::plain), 1);
        assert_eq!(series(Protocol::http1, Transport::tls), 0);
        assert_eq!(series(Protocol::http2, Transport::plain), 0);
        assert_eq!(series(Protocol::http2, Transport::tls), 2);
        drop((a, b, d));
        assert_eq!(series(Protocol::http1, Transport::plain), 0);
        assert_eq!(series(Protocol::http2, Transport::tls), 0);
    }
}
