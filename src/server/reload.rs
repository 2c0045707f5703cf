//! What the process asks of a running holdfast besides serving (its signals), and SIGHUP's
//! reload: the configuration read again from its sources, and what of it a running holdfast
//! takes.
//!
//! A reload replaces, for new requests and connections: the proxy (hold, routes, limits,
//! retry, sessions' limits and keys, timeouts, headers; its state carried over:
//! [`Proxy::reconfigured`]), the log level, the listener's TLS (certificate, key, client CA,
//! resumption, read again from the files), the HTTP limits of new connections and
//! `limits.max_connections`, and the drain and accept grace of a later shutdown. What a running
//! holdfast cannot change ([`fixed_changes`]: its listeners, its upstream, TLS on or off, the log
//! format, the admin token, the sessions' key file path and store, `[tracing]`) keeps its running value and is
//! named in one warning. An invalid configuration is refused whole, every problem logged.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::{listener_tls, served, AbortOnDrop, ListenerTls, Spawner};
use crate::config::Config;
use crate::metrics::{ReloadResult, ServerMetrics, TlsMetrics};
use crate::proxy::current::Current;

/// What a running holdfast is asked.
#[derive(Debug)]
pub enum Ask {
    /// Drain and stop (the first SIGTERM or SIGINT).
    Stop,
    /// Stop now: a drain under way ends at once (a second SIGTERM or SIGINT).
    StopNow,
    /// Take this configuration, read again from its sources (SIGHUP), or say why it could not
    /// be read (every problem, one per line).
    Reload(Result<Box<Config>, String>),
}

/// The settings a running holdfast cannot change, by key, that `now` changes from `was`.
pub fn fixed_changes(was: &Config, now: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |differs: bool, key: &'static str| {
        if differs {
            changed.push(key);
        }
    };
    check(was.listen != now.listen, "listen");
    check(was.admin != now.admin, "admin");
    check(was.upstream.original != now.upstream.original, "upstream");
    check(was.log_format != now.log_format, "log_format");
    check(was.tls.is_some() != now.tls.is_some(), "tls (on or off)");
    check(was.admin_token != now.admin_token, "admin_token_file");
    // Started once with holdfast: its exporter, sampler and queue.
    check(was.tracing != now.tracing, "tracing");
    changed
}

/// How often the warning of the connection limit is given at most.
const AT_CAP_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What a reload replaces, and the configuration in use.
pub(super) struct Live {
    /// The configuration in use: what the last reload took, with the fixed settings as started.
    pub(super) config: Config,
    pub(super) current: Arc<Current>,
    /// The listener's TLS and its certificate reloader.
    pub(super) tls: Option<(ListenerTls, AbortOnDrop)>,
    pub(super) tls_metrics: Option<TlsMetrics>,
    /// `limits.max_connections`' slots.
    pub(super) permits: Arc<Semaphore>,
    pub(super) metrics: ServerMetrics,
    /// When the limit's warning was last given (at most one a minute).
    pub(super) warned_at_cap: Option<tokio::time::Instant>,
}

impl Live {
    /// Applies what a reload read: the new configuration's live parts, or its refusal.
    pub(super) fn reload(&mut self, read: Result<Box<Config>, String>, spawner: &mut Spawner) {
        let mut next = match read {
            Ok(next) => next,
            Err(problems) => {
                // One line per problem; the error's own heading ("…:") says nothing more.
                let lines = problems.lines().map(|l| l.trim().trim_start_matches("- "));
                for problem in lines.filter(|l| !l.is_empty() && !l.ends_with(':')) {
                    tracing::error!(problem, "reload refused: the configuration is invalid");
                }
                tracing::error!("reload refused; the running configuration stays");
                self.metrics.reloaded(ReloadResult::refused);
                return;
            }
        };
        let mut fixed = fixed_changes(&self.config, &next);
        keep_fixed(&self.config, &mut next);
        let (proxy, fixed_sessions) = self.current.get().reconfigured(&next);
        fixed.extend(fixed_sessions);
        self.current.replace(proxy.shared());
        if let Err(e) = crate::telemetry::set_level(&next.log_level, next.log_level_said) {
            tracing::debug!(error = %e, "log_level not reloaded");
        }
        self.resize(next.max_connections);
        if let (Some(t), Some(metrics)) = (&next.tls, &self.tls_metrics) {
            // Built anew from what validation read: a changed path or client CA counts too.
            let tls = listener_tls(t, next.header_read_timeout, metrics.clone());
            spawner.tls = Some(tls.0.clone());
            self.tls = Some(tls);
        }
        let (drain, connections) = (&spawner.served.drain, &spawner.served.connections);
        spawner.served = served(
            &next,
            self.current.clone(),
            drain.clone(),
            connections.clone(),
        );
        if !fixed.is_empty() {
            tracing::warn!(
                unchanged = fixed.join(", "),
                "reloaded, but these settings cannot change while holdfast runs: they keep \
                 their running values until a restart"
            );
        }
        tracing::info!("configuration reloaded");
        self.metrics.reloaded(ReloadResult::ok);
        self.config = *next;
    }

    /// A connection was accepted with every slot taken: counted, and warned of at most once a
    /// minute (a flood must not flood the log too). `closed_idle`: an idle connection was
    /// closed to make room, else it waits unserved.
    pub(super) fn at_cap(&mut self, closed_idle: bool) {
        use crate::metrics::AtCap;
        let outcome = if closed_idle {
            AtCap::closed_idle
        } else {
            AtCap::waited
        };
        self.metrics.at_cap(outcome);
        let now = tokio::time::Instant::now();
        if self
            .warned_at_cap
            .is_some_and(|at| now.duration_since(at) < AT_CAP_WARN_EVERY)
        {
            return;
        }
        self.warned_at_cap = Some(now);
        tracing::warn!(
            max_connections = self.config.max_connections,
            "limits.max_connections reached: idle keep-alive connections are closed to make \
             room, and new connections wait unserved while none is idle (said at most once a \
             minute; holdfast_connections_at_limit_total counts each)"
        );
    }

    /// Moves `limits.max_connections` to `max`: more slots at once; fewer as soon as the
    /// connections holding them end (none is closed for it).
    fn resize(&mut self, max: usize) {
        let was = self.config.max_connections;
        if max > was {
            self.permits.add_permits(max - was);
        } else if max < was {
            let shed = was - max;
            let now = self.permits.forget_permits(shed);
            if now < shed {
                let permits = self.permits.clone();
                let rest = u32::try_from(shed - now).unwrap_or(u32::MAX);
                tokio::spawn(async move {
                    if let Ok(taken) = permits.acquire_many_owned(rest).await {
                        taken.forget();
                    }
                });
            }
        }
    }
}

/// Puts `was`'s values back into `next` for what cannot change while holdfast runs.
fn keep_fixed(was: &Config, next: &mut Config) {
    next.listen = was.listen;
    next.admin = was.admin;
    next.upstream = was.upstream.clone();
    next.log_format = was.log_format;
    next.admin_token = was.admin_token.clone();
    next.tracing = was.tracing.clone();
    if was.tls.is_none() {
        next.tls = None;
    } else if next.tls.is_none() {
        next.tls = was.tls.clone();
    }
}
