//! Open upstream connections, counted in `holdfast_upstream_connections` for as long as each
//! lives (idle in the pool or carrying a request): what Traefik's and Envoy's open-connection
//! gauges show, and what tells a pool that grows without bound from one that is reused.

use prometheus_client::metrics::gauge::Gauge;

/// One open connection, counted while it lives (a connection made without a gauge, such as a
/// probe's, is not counted).
#[derive(Debug)]
pub struct Open(Option<Gauge>);

impl Open {
    /// Counts a connection just made in `gauge`.
    pub fn new(gauge: Option<&Gauge>) -> Open {
        if let Some(g) = gauge {
            g.inc();
        }
        Open(gauge.cloned())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_counts_while_it_lives() {
        let gauge = Gauge::default();
        let (a, b) = (Open::new(Some(&gauge)), Open::new(Some(&gauge)));
        assert_eq!(gauge.get(), 2);
        drop(a);
        assert_eq!(gauge.get(), 1);
        drop(b);
        assert_eq!(gauge.get(), 0);
        drop(Open::new(None));
        assert_eq!(gauge.get(), 0);
    }
}
