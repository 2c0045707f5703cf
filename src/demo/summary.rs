//! What the demo prints: what it is about to show, a line of counts every second, and the
//! summary.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{planned, Counts, DemoOptions, Phase, Scraped, Tally};

/// What the run will show.
pub(super) fn intro(opts: &DemoOptions, backend: SocketAddr, proxy: SocketAddr) {
    println!(
        "holdfast demo: an MCP backend on {backend} is recreated every {:.1} s:",
        opts.period.as_secs_f64()
    );
    println!(
        "  its router answers `404 page not found` for a while, then the port refuses connections,"
    );
    println!(
        "  then the backend comes back with its sessions gone. Two clients call a tool in a loop,"
    );
    println!("  one straight to the backend, one through holdfast on {proxy}; like the TypeScript");
    println!("  SDK's client, neither ever opens a second session.\n");
}

/// One second's line: the backend's phase, both clients' counts, holdfast's own numbers.
pub(super) fn tick(at: Duration, phase: Phase, (direct, through): (&Counts, &Counts), m: &Scraped) {
    println!(
        "t={:>3}s  backend {:<10}  direct: {:>4} ok {:>4} failed   via holdfast: {:>4} ok {:>4} failed   masked {:>3}  held now {:>2}  released {:>4}  sessions resumed {:>2}",
        at.as_secs(),
        phase.label(),
        direct.ok.load(Ordering::Relaxed),
        direct.failed.load(Ordering::Relaxed),
        through.ok.load(Ordering::Relaxed),
        through.failed.load(Ordering::Relaxed),
        m.rewrites,
        m.held,
        m.released,
        m.resumed,
    );
}

/// The summary: every part of the run, and whether each successful call ran exactly once.
pub(super) fn print(opts: &DemoOptions, tally: &Tally) {
    let (planned, replaced) = (&tally.planned, &tally.replaced);
    println!("\nsummary after {:.0} s:", opts.duration.as_secs_f64());
    println!(
        "  straight to the backend: {} calls ok, {} failed",
        tally.direct_ok, tally.direct_failed
    );
    println!(
        "  through holdfast:        {} calls ok, {} failed",
        tally.holdfast_ok, tally.holdfast_failed
    );
    println!(
        "  the backend was recreated {} times, forgetting every session; through holdfast the \
         client's {} session lived on (holdfast re-established it {} times)",
        tally.restarts,
        if tally.holdfast_sessions == 1 {
            "one"
        } else {
            "first"
        },
        tally.resumed
    );
    println!(
        "  planned recreation with `holdfast pause`: the slow call in flight {}, {} of {} calls \
         made during the recreation ok, {} failed",
        if planned.slow_ok {
            "completed"
        } else {
            "FAILED"
        },
        planned.held_ok,
        planned::DURING,
        planned.held_failed
    );
    println!(
        "  pod replacement (holdfast and its backend): {} calls ok, {} failed{}",
        replaced.ok,
        replaced.failed,
        if replaced.handed_off {
            ", the one held at the leaving pod answered by its peer"
        } else {
            ""
        }
    );
    let answered = tally.direct_ok + tally.holdfast_ok + planned.ok() + replaced.ok;
    println!(
        "  the backend executed {} tool calls: {}",
        tally.executed,
        if tally.executed == answered {
            "each successful call exactly once, no failed one"
        } else {
            "NOT one per successful call"
        }
    );
}
