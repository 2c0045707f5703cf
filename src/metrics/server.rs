//! The server's own metrics: configuration reloads, and connections accepted at the limit.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// The server's metrics.
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics {
    /// `holdfast_config_reloads_total{result}`: SIGHUPs, by whether the configuration read then
    /// was taken.
    pub config_reloads: Family<ReloadLabel, Counter>,
    /// `holdfast_connections_at_limit_total{outcome}`: connections accepted while
    /// `limits.max_connections` were open.
    pub at_cap: Family<AtCapLabel, Counter>,
}

impl ServerMetrics {
    /// Registers every metric in `registry`, each series created at 0.
    pub fn register(registry: &mut Registry) -> ServerMetrics {
        let m = ServerMetrics::default();
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
