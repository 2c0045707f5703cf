//! The outage state machine of one route: probing, releasing, deadlines, caps, Retry-After
//! and the horizon.

use super::*;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;

use super::prober::UNANSWERED_GRACE;

/// The hold configuration of these tests: quick backoff, `timeout`.
pub(super) fn config(timeout: Duration) -> HoldConfig {
    HoldConfig {
        enabled: true,
        timeout,
        max_body_bytes: 1024,
        max_requests: 100,
        max_buffered_bytes: 1 << 20,
        backoff_initial: Duration::from_millis(25),
        backoff_max: Duration::from_millis(250),
        retry_after: RetryAfter::Observed,
        retry_after_min: Duration::from_secs(1),
        retry_after_max: Duration::from_secs(30),
        probe_path: None,
        check_interval: None,
    }
}

fn outages(timeout: Duration) -> (Arc<RouteOutage>, Arc<Metrics>) {
    outages_with(config(timeout))
}

/// What the hold's unit tests build outages from: `cfg`, fresh metrics, no health check.
pub(super) fn template(cfg: HoldConfig) -> (Template, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::register(&mut Registry::default()));
    let template = Template {
        cfg,
        retry_after: Duration::from_secs(2),
        // Never dialled in these tests: route-level outages probe with held requests only.
        probe_uri: "http://127.0.0.1:9/".parse().unwrap(),
        connector: Connector::new(Duration::from_secs(1)),
        health: None,
        presence: None,
        metrics: metrics.clone(),
    };
    (template, metrics)
}

fn outages_with(cfg: HoldConfig) -> (Arc<RouteOutage>, Arc<Metrics>) {
    let (template, metrics) = template(cfg);
    let o = RouteOutage::new(SharedHold::new(template), "test".into(), None);
    (Arc::new(o), metrics)
}

/// A request waiting in the hold on its own task: its outcome, and whether it was the probe.
fn spawn_waiter(o: &Arc<RouteOutage>) -> tokio::task::JoinHandle<(Released, bool)> {
    let o = o.clone();
    tokio::spawn(async move {
        let mut ticket = Ticket::default();
        let released = o.wait(&mut ticket, &BodyHandle::empty()).await;
        (released, ticket.probe.is_some())
    })
}

/// Yields until `n` requests are held (the spawned waiters have queued up). Bounded: a
/// regression that never holds fails here instead of hanging the suite.
pub(super) async fn until_held(metrics: &Metrics, n: i64) {
    for _ in 0..100_000 {
        if metrics.held_requests.get() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{} requests held, never {n}", metrics.held_requests.get());
}

fn holds(metrics: &Metrics, outcome: HoldOutcome) -> u64 {
    metrics.holds.get_or_create(&outcome.into()).get()
}

#[tokio::test(start_paused = true)]
async fn probes_follow_the_jittered_backoff_one_at_a_time() {
    let (o, metrics) = outages(Duration::from_secs(60));
    o.missing(RewriteReason::RouteMissing404);
    let body = BodyHandle::empty();
    let mut ticket = Ticket::default();
    let mut last = Instant::now();
    let mut gaps = Vec::new();
    for _ in 0..7 {
        assert_eq!(o.wait(&mut ticket, &body).await, Released::Go);
        assert!(ticket.probe.is_some(), "released as the probe");
        gaps.push(Instant::now() - last);
        last = Instant::now();
        // Each loop round holds the probe again, which reports "no answer" to the prober.
    }
    let full = [25u64, 50, 100, 200, 250, 250, 250];
    for (gap, d) in gaps.iter().zip(full) {
        let d = Duration::from_millis(d);
        assert!(
            *gap >= d / 2 && *gap <= d,
            "gap {gap:?} outside [{:?}, {d:?}]",
            d / 2
        );
    }
    assert_eq!(holds(&metrics, HoldOutcome::released), 7);
    assert!(o.in_outage());
}

#[tokio::test(start_paused = true)]
async fn the_outage_line_counts_requests_not_exits() {
    let (o, _metrics) = outages(Duration::from_millis(400));
    // A router's 404: held requests are the probes.
    o.missing(RewriteReason::RouteMissing404);
    let body = BodyHandle::empty();
    let mut ticket = Ticket::default();
    // One request, sent as the probe again and again, meeting the gap each time.
    let mut probes = 0;
    loop {
        match o.wait(&mut ticket, &body).await {
            Released::Go => probes += 1,
            other => {
                assert_eq!(other, Released::TimedOut);
                break;
            }
        }
        assert!(ticket.probe.is_some(), "released as the probe");
        // Between its exits it counts as released once, not once per probe.
        assert_eq!(o.line_counts(), Some((1, 1, 0)), "after probe {probes}");
    }
    assert!(probes >= 3, "{probes} probes in 400 ms");
    // It left once: timed out, never released.
    assert_eq!(o.line_counts(), Some((1, 0, 1)));
    // A second request in the same outage is a second one held.
    let waiter = spawn_waiter(&o);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(waiter.await.unwrap().0, Released::Go);
    let (held, released, timed_out) = o.line_counts().unwrap();
    assert_eq!((held, timed_out), (2, 1));
    assert!(released <= 1, "{released}");
}

#[tokio::test(start_paused = true)]
async fn an_application_answer_releases_everyone_at_once() {
    let (o, metrics) = outages(Duration::from_secs(60));
    o.missing(RewriteReason::ConnectRefused);
    let tasks: Vec<_> = (0..3).map(|_| spawn_waiter(&o)).collect();
    // Let all three queue up (no probe can run: nothing listens on the probe port, and
    // the first backoff has not elapsed).
    until_held(&metrics, 3).await;
    o.answered();
    for t in tasks {
        assert_eq!(t.await.unwrap(), (Released::Go, false));
    }
    assert!(!o.in_outage());
    assert_eq!(metrics.held_requests.get(), 0);
    assert_eq!(metrics.outages.get(), 1);
    assert_eq!(holds(&metrics, HoldOutcome::released), 3);
}

#[tokio::test(start_paused = true)]
async fn deadline_cancellation_and_shutdown_are_counted() {
    let (o, metrics) = outages(Duration::from_millis(500));
    o.missing(RewriteReason::RouteMissing404);
    // A probe would wake the oldest waiter: keep the queue's oldest a request that leaves.
    let body = BodyHandle::empty();

    // Deadline.
    let started = Instant::now();
    let mut ticket = Ticket::default();
    loop {
        match o.wait(&mut ticket, &body).await {
            Released::Go => continue, // woken as a probe; the loop re-holds it
            other => {
                assert_eq!(other, Released::TimedOut);
                break;
            }
        }
    }
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert_eq!(holds(&metrics, HoldOutcome::timed_out), 1);
    // No outage observed yet: the configured 2 s, minus the 0.5 s waited, rounded up.
    assert_eq!(o.retry_after(ticket.waited()), Duration::from_secs(2));

    // Cancellation: the waiting future is dropped.
    {
        let mut ticket = Ticket::default();
        let wait = o.wait(&mut ticket, &body);
        tokio::pin!(wait);
        assert!(futures_poll_once(wait.as_mut()).await.is_none());
        assert_eq!(metrics.held_requests.get(), 1);
    }
    assert_eq!(metrics.held_requests.get(), 0);
    assert_eq!(holds(&metrics, HoldOutcome::cancelled), 1);

    // Shutdown: the waiter gets its answer now, and nobody is held afterwards.
    let held = spawn_waiter(&o);
    until_held(&metrics, 1).await;
    o.shutdown();
    assert_eq!(held.await.unwrap().0, Released::Shutdown);
    let mut ticket = Ticket::default();
    assert_eq!(o.wait(&mut ticket, &body).await, Released::Shutdown);
    assert_eq!(holds(&metrics, HoldOutcome::shutdown), 2);
}

/// Polls a future once; `None` if it is pending.
async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| match Pin::new(&mut f).poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn caps_refuse_at_once() {
    let mut cfg = config(Duration::from_secs(60));
    cfg.max_requests = 1;
    let (o, metrics) = outages_with(cfg);
    o.missing(RewriteReason::ConnectRefused);
    let first = spawn_waiter(&o);
    until_held(&metrics, 1).await;
    let mut ticket = Ticket::default();
    assert_eq!(
        o.wait(&mut ticket, &BodyHandle::empty()).await,
        Released::QueueFull
    );
    assert_eq!(holds(&metrics, HoldOutcome::queue_full), 1);
    o.answered();
    assert_eq!(first.await.unwrap(), (Released::Go, false));
}

#[tokio::test(start_paused = true)]
async fn retry_after_comes_from_observed_outages() {
    let (o, _) = outages(Duration::from_secs(60));
    // Nothing observed yet: the configured value.
    assert_eq!(o.retry_after(Duration::ZERO), Duration::from_secs(2));
    for secs in [4u64, 6, 8] {
        o.missing(RewriteReason::ConnectRefused);
        tokio::time::advance(Duration::from_secs(secs)).await;
        o.answered();
    }
    // Median 6 s, minus what was waited, rounded up, within [1, 30].
    assert_eq!(o.retry_after(Duration::ZERO), Duration::from_secs(6));
    assert_eq!(
        o.retry_after(Duration::from_millis(2500)),
        Duration::from_secs(4)
    );
    assert_eq!(
        o.retry_after(Duration::from_secs(60)),
        Duration::from_secs(1)
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_clamped_to_its_maximum() {
    // Outages far longer than the cap: the median (200 s) is told as the maximum, 30 s by
    // default or what `hold.retry_after_max_secs` says.
    for (max, told) in [(None, 30), (Some(45), 45)] {
        let mut cfg = config(Duration::from_secs(60));
        if let Some(max) = max {
            cfg.retry_after_max = Duration::from_secs(max);
        }
        let (o, _) = outages_with(cfg);
        for secs in [100u64, 200, 300] {
            o.missing(RewriteReason::ConnectRefused);
            tokio::time::advance(Duration::from_secs(secs)).await;
            o.answered();
        }
        assert_eq!(
            o.retry_after(Duration::from_secs(2)),
            Duration::from_secs(told)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn horizon_counts_from_when_the_route_went_missing() {
    let (o, metrics) = outages(Duration::from_secs(60));
    let horizon = Duration::from_secs(120);
    tokio::time::advance(Duration::from_secs(1000)).await;
    assert!(
        !o.beyond_horizon(horizon),
        "a quiet route is not missing before a request finds it so"
    );
    o.missing(RewriteReason::RouteMissing404);
    tokio::time::advance(Duration::from_secs(119)).await;
    assert!(!o.beyond_horizon(horizon));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(o.beyond_horizon(horizon), "missing for 121 s");
    o.horizon_exceeded(horizon, "http://x");
    assert!(o.in_outage());
    assert_eq!(metrics.upstream_up.get(), 0);
    o.answered();
    assert!(!o.beyond_horizon(horizon), "an answer resets the horizon");
    assert_eq!(metrics.upstream_up.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn past_the_horizon_an_outage_that_began_refused_stops_holding_new_requests() {
    let (o, _metrics) = outages(Duration::from_secs(60));
    let horizon = Duration::from_secs(120);
    // The container went away (refused), then the router dropped its route: 404s since.
    o.missing(RewriteReason::ConnectRefused);
    assert!(o.holds_before_dispatch(horizon));
    tokio::time::advance(Duration::from_secs(121)).await;
    assert!(
        o.holds_before_dispatch(horizon),
        "a refused connection past the horizon is still worth holding for"
    );
    o.horizon_exceeded(horizon, "http://x");
    assert_eq!(o.current_reason(), Some(RewriteReason::RouteMissing404));
    assert!(
        !o.holds_before_dispatch(horizon),
        "the router's 404s pass straight through now"
    );
}

#[test]
fn backoff_doubles_to_the_cap_with_equal_jitter() {
    let (i, m) = (Duration::from_millis(25), Duration::from_millis(250));
    let low: Vec<u128> = (0..6).map(|a| backoff(i, m, a, 0.0).as_micros()).collect();
    let high: Vec<u128> = (0..6)
        .map(|a| backoff(i, m, a, 0.999_999).as_micros())
        .collect();
    assert_eq!(low, vec![12_500, 25_000, 50_000, 100_000, 125_000, 125_000]);
    assert_eq!(
        high.iter().map(|h| h.div_ceil(1000)).collect::<Vec<_>>(),
        vec![25, 50, 100, 200, 250, 250]
    );
    assert_eq!(backoff(i, m, u32::MAX, 0.5), Duration::from_micros(187_500));
}

/// The outage state of an upstream at `uri` (the prober connects there first), with `timeout`.
fn upstream_outages(uri: &str, timeout: Duration) -> Arc<RouteOutage> {
    let (mut template, _metrics) = template(config(timeout));
    template.probe_uri = uri.parse().unwrap();
    Arc::new(RouteOutage::new(
        SharedHold::new(template),
        "test".into(),
        None,
    ))
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_outage_sends_nothing_while_the_old_instance_accepts_until_it_refused() {
    // A server in its graceful shutdown: it still accepts for a moment, then refuses, then
    // comes back.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let o = upstream_outages(&format!("http://{addr}/"), Duration::from_secs(60));
    o.missing(RewriteReason::Unanswered);
    let started = Instant::now();
    let waiter = spawn_waiter(&o);
    // Probed six times or more in 0.9 s, connected each time: nobody released.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !waiter.is_finished(),
        "a held request went to the instance going away"
    );
    drop(listener);
    // Refused once: the next connect that succeeds releases the oldest as the probe.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "released while nothing listened");
    let _back = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (released, probe) = waiter.await.unwrap();
    assert_eq!((released, probe), (Released::Go, true));
    assert!(started.elapsed() < UNANSWERED_GRACE + Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_outage_of_a_server_that_stays_probes_after_the_grace() {
    // A server that ended a stream unanswered and is not going away: after the grace, the
    // held requests probe it as usual.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let o = upstream_outages(&format!("http://{addr}/"), Duration::from_secs(60));
    o.missing(RewriteReason::Unanswered);
    let started = Instant::now();
    let (released, probe) = spawn_waiter(&o).await.unwrap();
    assert_eq!((released, probe), (Released::Go, true));
    let waited = started.elapsed();
    assert!(
        waited >= UNANSWERED_GRACE && waited <= UNANSWERED_GRACE + Duration::from_millis(300),
        "{waited:?}"
    );
}
