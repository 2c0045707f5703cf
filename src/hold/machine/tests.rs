//! The outage rules without a runtime: transitions one by one, then random event sequences
//! checked against the counting invariants.

use super::*;
use proptest::prelude::*;

type M = Machine<u32>;

fn t0() -> Instant {
    Instant::now()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn enter(m: &mut M, place: &mut Place, now: Instant, was_probe: bool) -> (Entry, Effects<u32>) {
    m.enter(place, 0, (0, now, secs(30)), was_probe, || true)
}

fn woken(fx: &[Effect<u32>]) -> usize {
    fx.iter()
        .map(|e| match e {
            Effect::Wake { waiters, .. } => waiters.len(),
            _ => 0,
        })
        .sum()
}

fn ended(fx: &[Effect<u32>]) -> Option<&Ended> {
    fx.iter().find_map(|e| match e {
        Effect::Ended(end) => Some(end),
        _ => None,
    })
}

#[test]
fn an_outage_opens_once_holds_and_closes_on_the_answer() {
    let now = t0();
    let mut m = M::new(false);
    assert_eq!(
        enter(&mut m, &mut Place::default(), now, false).0,
        Entry::NotHeld
    );
    let fx = m.missing(RewriteReason::ConnectRefused, now, 7);
    assert!(matches!(
        fx.as_slice(),
        [Effect::OutageStarted {
            reason: RewriteReason::ConnectRefused,
            cause: None
        }]
    ));
    // Met again: no second start.
    assert!(m.missing(RewriteReason::ConnectError, now, 8).is_empty());
    assert_eq!(m.last_reason(), Some(RewriteReason::ConnectError));
    let mut place = Place::default();
    let (entry, fx) = enter(&mut m, &mut place, now, false);
    assert_eq!(
        entry,
        Entry::Held {
            seq: 1,
            deadline: now + secs(30)
        }
    );
    assert!(matches!(fx.as_slice(), [Effect::StartProber]));
    assert_eq!(place.held_in, 7);
    // A second request: the prober runs already.
    assert!(enter(&mut m, &mut Place::default(), now, false)
        .1
        .is_empty());

    let fx = m.answered(now + secs(4));
    assert_eq!(woken(&fx), 2);
    assert_eq!(
        ended(&fx),
        Some(&Ended::Outage {
            duration: secs(4),
            first_reason: RewriteReason::ConnectRefused,
            counts: Counts {
                held: 2,
                released: 2,
                ..Counts::default()
            },
            counted: true,
        })
    );
    assert!(!m.is_open());
}

#[test]
fn the_cause_of_the_failure_goes_into_the_outage_it_opens_only() {
    let now = t0();
    let mut m = M::new(false);
    m.note_cause(|| "refused".into());
    let fx = m.missing(RewriteReason::ConnectRefused, now, 1);
    assert!(matches!(
        fx.as_slice(),
        [Effect::OutageStarted { cause: Some(c), .. }] if c == "refused"
    ));
    m.note_cause(|| "said already".into());
    m.answered(now);
    let fx = m.missing(RewriteReason::RouteMissing404, now, 2);
    assert!(matches!(
        fx.as_slice(),
        [Effect::OutageStarted { cause: None, .. }]
    ));
}

#[test]
fn a_probe_that_comes_back_is_held_once_and_released_once() {
    let now = t0();
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    let mut place = Place::default();
    enter(&mut m, &mut place, now, false);
    let other = enter(&mut m, &mut Place::default(), now, false).0;
    for round in 0..3 {
        assert!(m.take_oldest().is_some());
        assert_eq!(m.counts().unwrap().released_so_far(), 1, "round {round}");
        // Back to the end of the queue, behind the other request.
        let (entry, _) = enter(&mut m, &mut place, now, true);
        let Entry::Held { seq, .. } = entry else {
            panic!("{entry:?}")
        };
        let Entry::Held { seq: other, .. } = other else {
            panic!()
        };
        assert!(seq > other);
        let c = m.counts().unwrap();
        assert_eq!((c.held, c.out, c.released), (2, 0, 0));
        // The other one is oldest now: probe it, it comes back too.
        let mut o = Place {
            held_in: 1,
            ..Place::default()
        };
        assert!(m.take_oldest().is_some());
        o.seq = Some(other);
        enter(&mut m, &mut o, now, true);
    }
    let fx = m.answered(now);
    let Some(Ended::Outage { counts, .. }) = ended(&fx) else {
        panic!()
    };
    assert_eq!((counts.held, counts.released), (2, 2));
}

#[test]
fn a_probe_still_out_when_the_outage_ends_counts_as_released() {
    let now = t0();
    let mut m = M::new(false);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    enter(&mut m, &mut Place::default(), now, false);
    m.take_oldest();
    let fx = m.answered(now);
    assert_eq!(woken(&fx), 0);
    let Some(Ended::Outage { counts, .. }) = ended(&fx) else {
        panic!()
    };
    assert_eq!((counts.held, counts.released, counts.out), (1, 1, 0));
}

#[test]
fn once_a_router_answered_a_5xx_the_probe_asks_first_for_the_whole_outage() {
    let now = t0();
    let ask_first = |m: &mut M| match m.probe_step(false).0 {
        ProbeStep::Probe { ask_first, .. } => ask_first,
        step => panic!("{step:?}"),
    };
    // A route-missing 404 alone: held requests never reached the application, so the oldest
    // may go as the probe.
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    enter(&mut m, &mut Place::default(), now, false);
    assert!(!ask_first(&mut m));
    // The router's 502 (the dead container still routed to), then its 404 (the route gone):
    // the 502 may come again, so every probe of this outage asks first.
    let mut m = M::new(true);
    m.missing(RewriteReason::RouterUnavailable, now, 1);
    enter(&mut m, &mut Place::default(), now, false);
    m.missing(RewriteReason::RouteMissing404, now + secs(1), 2);
    assert!(ask_first(&mut m));
    // And a 404 outage that meets a 502 later.
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    enter(&mut m, &mut Place::default(), now, false);
    m.missing(RewriteReason::RouterUnavailable, now + secs(1), 2);
    assert!(ask_first(&mut m));
    // The next outage starts afresh.
    m.answered(now + secs(2));
    m.missing(RewriteReason::RouteMissing404, now + secs(3), 3);
    enter(&mut m, &mut Place::default(), now + secs(3), false);
    assert!(!ask_first(&mut m));
}

#[test]
fn a_route_nobody_waits_in_sleeps_when_its_prober_stops_and_wakes_when_met() {
    let now = t0();
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    let mut place = Place::default();
    enter(&mut m, &mut place, now, false);
    let (step, _) = m.probe_step(false);
    assert!(matches!(step, ProbeStep::Probe { held_in: 1, .. }));
    m.leave(place.seq.unwrap(), HoldOutcome::timed_out);
    let (step, fx) = m.probe_step(false);
    assert_eq!(step, ProbeStep::Stop);
    assert!(matches!(fx.as_slice(), [Effect::Counted(false)]));
    assert!(m.is_open() && !m.holds() && !m.prober_running());
    assert_eq!(m.outage(), None, "a dormant outage is not reported");
    let fx = m.missing(RewriteReason::RouteMissing404, now + secs(60), 2);
    assert!(matches!(fx.as_slice(), [Effect::Counted(true)]));
    assert_eq!(m.since(), Some(now), "it began when the route went missing");
    // The upstream-wide outage never sleeps.
    let mut up = M::new(false);
    up.missing(RewriteReason::ConnectRefused, now, 3);
    assert!(up.probe_step(false).1.is_empty());
    assert!(up.holds());
}

#[test]
fn a_dormant_outage_ends_uncounted() {
    let now = t0();
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 1);
    m.probe_step(false);
    let fx = m.answered(now + secs(3600));
    assert!(matches!(
        ended(&fx),
        Some(Ended::Outage { counted: false, .. })
    ));
    assert!(fx.iter().any(|e| matches!(e, Effect::RouteOutage(false))));
}

#[test]
fn a_pause_is_no_outage_until_the_upstream_is_gone() {
    let now = t0();
    let mut m = M::new(false);
    let (pause, gone, _) = m.begin_pause(now, secs(60), 5).unwrap();
    assert!(!gone);
    assert_eq!(
        m.begin_pause(now, secs(60), 6).unwrap_err(),
        NoPause::Already
    );
    assert!(m.is_open() && m.holds());
    assert_eq!(m.outage(), None);
    let mut place = Place::default();
    let (entry, _) = enter(&mut m, &mut place, now, false);
    // Held through the pause, then as long as any held request.
    assert_eq!(
        entry,
        Entry::Held {
            seq: 1,
            deadline: pause.until + secs(30)
        }
    );
    // The old instance's answers end nothing; the prober waits.
    assert!(m.answered(now).is_empty());
    assert_eq!(m.probe_step(false).0, ProbeStep::Wait);
    // Gone: an outage from now, the same requests in it.
    let fx = m.missing(RewriteReason::ConnectRefused, now + secs(2), 9);
    assert!(matches!(
        fx.as_slice(),
        [Effect::GoneWhilePaused(_), Effect::OutageStarted { .. }]
    ));
    assert!(m.pause().unwrap().upstream_gone);
    assert_eq!(m.counts().unwrap().held, 1);
    assert!(matches!(
        m.probe_step(false).0,
        ProbeStep::Probe { held_in: 5, .. }
    ));
    // The new instance answers: the pause and the outage end together.
    let fx = m.answered(now + secs(5));
    assert!(matches!(
        fx.first(),
        Some(Effect::PauseEnded {
            upstream_was_gone: true,
            held: 1,
            ..
        })
    ));
    assert!(matches!(
        ended(&fx),
        Some(Ended::Outage { duration, .. }) if *duration == secs(3)
    ));
    assert!(m.pause().is_none() && !m.is_open());
}

#[test]
fn resume_releases_a_pause_never_gone_and_leaves_an_outage_open() {
    let now = t0();
    let mut m = M::new(false);
    let (pause, _, _) = m.begin_pause(now, secs(60), 1).unwrap();
    enter(&mut m, &mut Place::default(), now, false);
    // Another pause's watcher cannot end it.
    assert!(!m.end_pause(Some(pause.id + 1), "max", now).0);
    let (ended_it, fx) = m.end_pause(Some(pause.id), "test", now);
    assert!(ended_it);
    assert_eq!(woken(&fx), 1);
    assert_eq!(ended(&fx), Some(&Ended::Pause));
    assert!(!m.is_open());

    m.begin_pause(now, secs(60), 2).unwrap();
    m.missing(RewriteReason::ConnectRefused, now, 3);
    let (_, fx) = m.end_pause(None, "test", now);
    assert_eq!(woken(&fx), 0);
    assert!(m.is_open() && m.pause().is_none());
    assert!(!m.end_pause(None, "test", now).0, "nothing to resume");
}

#[test]
fn a_pause_over_an_open_outage_ends_with_it() {
    let now = t0();
    let mut m = M::new(false);
    m.missing(RewriteReason::ConnectRefused, now, 1);
    let (_, gone, _) = m.begin_pause(now, secs(60), 2).unwrap();
    assert!(gone);
    m.saw_gone(RewriteReason::ConnectError, now);
    assert_eq!(m.last_reason(), Some(RewriteReason::ConnectError));
    let fx = m.answered(now);
    assert!(matches!(fx.first(), Some(Effect::PauseEnded { .. })));
    assert!(m.pause().is_none());
}

#[test]
fn past_the_horizon_everyone_goes_out_and_the_warning_is_given_once() {
    let now = t0();
    let mut m = M::new(false);
    m.missing(RewriteReason::ConnectRefused, now, 1);
    enter(&mut m, &mut Place::default(), now, false);
    let fx = m.horizon_exceeded(now, 2);
    assert_eq!(woken(&fx), 1);
    assert!(fx.iter().any(|e| matches!(e, Effect::HorizonWarning)));
    assert_eq!(m.last_reason(), Some(RewriteReason::RouteMissing404));
    let fx = m.horizon_exceeded(now, 3);
    assert!(fx.is_empty());
    assert_eq!(m.counts().unwrap().released_so_far(), 1);
}

#[test]
fn refusals_are_counted_apart_from_held_requests() {
    let now = t0();
    let mut m = M::new(false);
    m.missing(RewriteReason::ConnectRefused, now, 1);
    assert_eq!(
        m.enter(&mut Place::default(), 0, (0, now, secs(30)), false, || {
            false
        })
        .0,
        Entry::Refused(HoldOutcome::queue_full)
    );
    m.refuse();
    // A probe back after its deadline: a held request that left timed out.
    let mut place = Place::default();
    enter(&mut m, &mut place, now, false);
    m.take_oldest();
    assert_eq!(
        enter(&mut m, &mut place, now + secs(31), true).0,
        Entry::Refused(HoldOutcome::timed_out)
    );
    let c = m.counts().unwrap();
    assert_eq!((c.held, c.timed_out, c.rejected(), c.out), (1, 1, 2, 0));
}

#[test]
fn past_the_horizon_a_pause_stays_a_pause_and_lets_its_requests_go() {
    let now = t0();
    let mut m = M::new(false);
    m.begin_pause(now, secs(600), 1).unwrap();
    enter(&mut m, &mut Place::default(), now, false);
    let fx = m.horizon_exceeded(now + secs(200), 2);
    assert_eq!(woken(&fx), 1);
    assert!(fx.iter().any(|e| matches!(e, Effect::HorizonWarning)));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::OutageStarted { .. })),
        "no outage: nothing showed the instance gone"
    );
    assert!(m.pause().is_some_and(|p| !p.upstream_gone));
    assert_eq!(m.last_reason(), Some(RewriteReason::RouteMissing404));
    assert!(
        m.horizon_exceeded(now + secs(201), 3).is_empty(),
        "warned once"
    );
}

#[test]
fn a_failure_noted_before_a_pause_is_not_the_cause_of_its_outage() {
    let now = t0();
    let mut m = M::new(false);
    m.note_cause(|| "a keep-alive race, hours ago".into());
    m.begin_pause(now, secs(60), 1).unwrap();
    let fx = m.missing(RewriteReason::ConnectRefused, now, 2);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::OutageStarted { cause: None, .. })));
}

#[test]
fn a_request_whose_deadline_passed_in_another_outage_times_out_here() {
    let now = t0();
    let mut m = M::new(true);
    m.missing(RewriteReason::RouteMissing404, now, 5);
    // Held before in another route's outage (id 4), its deadline carried over and passed.
    let mut place = Place {
        held_in: 4,
        deadline: Some(now),
        ..Place::default()
    };
    assert_eq!(
        enter(&mut m, &mut place, now + secs(1), false).0,
        Entry::Refused(HoldOutcome::timed_out)
    );
    let c = m.counts().unwrap();
    assert_eq!((c.held, c.timed_out_all(), c.rejected()), (0, 1, 0));
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    Missing(bool),
    Answered,
    Enter,
    /// The probe (`n`-th request out) comes back.
    Back(usize),
    Leave(usize, bool),
    Probe,
    ProberTurn,
    Horizon,
    Pause,
    Resume,
    Shutdown,
    Advance(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        any::<bool>().prop_map(Step::Missing),
        Just(Step::Answered),
        Just(Step::Enter),
        Just(Step::Enter),
        any::<usize>().prop_map(Step::Back),
        (any::<usize>(), any::<bool>()).prop_map(|(i, t)| Step::Leave(i, t)),
        Just(Step::Probe),
        Just(Step::ProberTurn),
        Just(Step::Horizon),
        Just(Step::Pause),
        Just(Step::Resume),
        Just(Step::Shutdown),
        (0u8..20).prop_map(Step::Advance),
    ]
}

proptest! {
    // Long on purpose: the model of the queue the machine is checked against lives in this
    // one loop, beside the machine's steps.
    /// Whatever happens, in whatever order: every request that entered leaves once, by one
    /// exit, and each closed outage's counts add up (held = released + timed out + cancelled +
    /// shut down + refused on return); the open one's do with those still waiting and out.
    #[test]
    fn every_held_request_leaves_once_by_one_exit(
        may_sleep in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let start = t0();
        let mut now = start;
        let mut m = M::new(may_sleep);
        let mut ids = 0u64;
        let mut next_id = || { ids += 1; ids };
        // Requests by their name (the wake token): their place, and whether they are in the
        // queue, out as a probe, or done.
        let mut places: Vec<Place> = Vec::new();
        let mut waiting: Vec<usize> = Vec::new();
        let mut out: Vec<usize> = Vec::new();
        let mut closed = Vec::new();
        let (mut route_outages, mut counted) = (0i32, 0i32);
        for s in steps {
            let fx: Effects<u32> = match s {
                Step::Missing(refused) => {
                    let reason = if refused {
                        RewriteReason::ConnectRefused
                    } else {
                        RewriteReason::RouteMissing404
                    };
                    m.missing(reason, now, next_id())
                }
                Step::Answered => m.answered(now),
                Step::Enter => {
                    let name = places.len();
                    places.push(Place::default());
                    let (entry, fx) = m.enter(&mut places[name], name as u32,
                        (0, now, secs(30)), false, || true);
                    if let Entry::Held { .. } = entry {
                        waiting.push(name);
                    }
                    fx
                }
                Step::Back(i) if !out.is_empty() => {
                    let name = out.remove(i % out.len());
                    let (entry, fx) = m.enter(&mut places[name], name as u32,
                        (0, now, secs(30)), true, || true);
                    if let Entry::Held { .. } = entry {
                        waiting.push(name);
                    }
                    fx
                }
                Step::Leave(i, timed_out) if !waiting.is_empty() => {
                    let name = waiting.remove(i % waiting.len());
                    let outcome = if timed_out { HoldOutcome::timed_out } else { HoldOutcome::cancelled };
                    let w = m.leave(places[name].seq.unwrap(), outcome);
                    prop_assert_eq!(w.map(|w| w.wake), Some(name as u32));
                    Vec::new()
                }
                Step::Probe => {
                    if let Some(w) = m.take_oldest() {
                        let name = w.wake as usize;
                        waiting.retain(|&n| n != name);
                        out.push(name);
                    }
                    Vec::new()
                }
                Step::ProberTurn => m.probe_step(false).1,
                Step::Horizon => m.horizon_exceeded(now, next_id()),
                Step::Pause => m.begin_pause(now, secs(60), next_id()).map_or(Vec::new(), |p| p.2),
                Step::Resume => m.end_pause(None, "test", now).1,
                Step::Shutdown => m.shutdown(),
                Step::Advance(s) => {
                    now += secs(u64::from(s));
                    Vec::new()
                }
                Step::Back(_) | Step::Leave(..) => Vec::new(),
            };
            let mut saw_end = false;
            for e in fx {
                match e {
                    Effect::RouteOutage(begun) => route_outages += if begun { 1 } else { -1 },
                    Effect::Counted(awake) => counted += if awake { 1 } else { -1 },
                    Effect::OutageStarted { .. } => counted += 1,
                    Effect::Wake { waiters, wake, .. } => {
                        for w in waiters {
                            let name = w.wake as usize;
                            prop_assert!(waiting.contains(&name), "woke {} not waiting", name);
                            waiting.retain(|&n| n != name);
                            // Released while the outage goes on (the horizon): it may come back.
                            if wake == WakeAs::Release && m.is_open() {
                                out.push(name);
                            }
                        }
                    }
                    Effect::Ended(Ended::Outage { counts, counted: was_counted, .. }) => {
                        counted -= i32::from(was_counted);
                        saw_end = true;
                        closed.push(counts);
                    }
                    Effect::Ended(Ended::Pause) => saw_end = true,
                    _ => {}
                }
            }
            if saw_end {
                // Whatever was out belongs to the closed stretch: it will not come back into it.
                out.clear();
            }
            // A route counts in the routes with an outage while anything is open, and against
            // the up gauge while an outage is open and awake.
            prop_assert_eq!(route_outages, i32::from(may_sleep && m.is_open()));
            prop_assert_eq!(counted, i32::from(m.outage().is_some()));
            // The queue is the model's.
            prop_assert_eq!(m.waiting(), waiting.len());
            prop_assert!(m.is_open() || m.waiting() == 0, "held with nothing open");
            prop_assert!(!m.holds() || m.is_open());
            if let Some(c) = m.counts() {
                prop_assert_eq!(c.held, c.accounted() + m.waiting() as u64, "{:?}", c);
                prop_assert_eq!(c.out, out.len() as u64);
            }
            if !m.is_open() {
                prop_assert!(m.pause().is_none());
            }
        }
        for c in closed {
            prop_assert_eq!(c.out, 0);
            prop_assert_eq!(c.held, c.accounted(), "{:?}", c);
        }
    }
}
