//! What the rest of holdfast asks of the proxy: its shutdown's phases, a planned restart's
//! pause, its status for the admin API, and what its background tasks need.

use std::sync::Arc;

use super::Proxy;
use crate::hold::{PauseStart, PauseStatus};
use crate::proxy::{ending, in_flight};

impl Proxy {
    /// Starts shutting down: standalone event streams end; held requests go to a peer now
    /// (`[peers]`), or, without peers, keep waiting for the upstream until the drain ends.
    pub fn begin_shutdown(&self) {
        if self.peers.any() {
            self.hold.shutdown();
        }
        self.ending.reach(ending::Phase::Draining);
    }

    /// The drain is over: every event stream ends cleanly, what is still held gets its 503, and
    /// what still waits for its answer is cut by holdfast (logged and counted so).
    pub fn drain_over(&self) {
        self.hold.shutdown();
        self.ending.reach(ending::Phase::Over);
    }

    /// Pauses for a planned restart (`holdfast pause`): new requests are held before they are
    /// sent, while those in flight finish. `who` asked (for the log).
    pub fn pause(&self, who: &str) -> PauseStart {
        let host = if self.dest.note_hosts {
            self.in_flight.last_host()
        } else {
            None
        };
        self.hold.pause(self.timeouts.pause_max, who, host)
    }

    /// Ends a pause (`holdfast resume`). False when none was in progress.
    pub fn unpause(&self, who: &str) -> bool {
        self.hold.resume(who)
    }

    /// This process's instance id: what its hand-offs carry in `holdfast-handoff`, so that a
    /// peer's log names the sender and a holdfast knows its own.
    pub fn instance(&self) -> &str {
        self.peers.me().to_str().unwrap_or_default()
    }

    /// The pause in progress, if any.
    pub fn pause_status(&self) -> Option<PauseStatus> {
        self.hold.pause_status()
    }

    /// The upstream as configured, and the upstream-wide outage if one is open: its first
    /// reason and how long it has lasted.
    pub fn upstream_status(
        &self,
    ) -> (
        &str,
        Option<(crate::classify::RewriteReason, std::time::Duration)>,
    ) {
        (
            &self.dest.url.original,
            self.hold.upstream().outage_status(),
        )
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> &in_flight::InFlight {
        &self.in_flight
    }

    /// Counts a pause's drain (`holdfast_pauses_total`).
    pub fn count_pause(&self, outcome: crate::metrics::PauseOutcome) {
        self.metrics.pauses.get_or_create(&outcome.into()).inc();
    }

    /// The keys session tokens are sealed with (for their reloader), when sessions are
    /// carried at all.
    pub fn session_keys(&self) -> Option<Arc<crate::session::Keys>> {
        self.keeper
            .sessions
            .enabled()
            .then(|| self.keeper.sessions.keys())
    }

    /// The check at rest of the upstream, to run as long as holdfast serves (it reads
    /// `hold.check_interval_secs` at every tick; 0 turns it off).
    pub fn checks_at_rest(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.hold.at_rest()
    }

    /// Sessions tracked now (for tests and the demo).
    pub fn sessions_tracked(&self) -> usize {
        self.keeper.sessions.len()
    }
}
