//! Outages per route, so that one missing route never holds requests for another.
//!
//! Behind a router, "the backend is missing" is a fact about one route: Traefik answers its
//! route-missing 404 for a Host it has no router for while it routes every other Host as usual. A
//! single outage for the whole upstream would let one request with a bogus Host hold every other
//! client's requests (and, as the oldest held request, be sent again as the probe and reopen the
//! outage) for the whole hold timeout. So each route has its own [`RouteOutage`]: its own queue,
//! prober and horizon. What they share ([`SharedHold`]) is what is one per holdfast: the caps on
//! held requests and bytes, shutdown, the Retry-After history and `holdfast_upstream_up` (1 while
//! no route is in an outage).
//!
//! A route is the Host sent upstream and the configured endpoint (`routes.endpoints`) the path
//! falls under; paths under no endpoint share one route per Host. Only a router's own answers
//! (route-missing 404, its 503) open a route's outage: connection failures are the upstream's,
//! whichever route met them, and open the one upstream-wide outage ([`OutageRoutes::upstream`]) that
//! any application answer ends. With no router in between (`routes.behind_router = false`)
//! there is only that one. A route's outage goes dormant once nobody waits in it (it no longer
//! holds new requests nor keeps `holdfast_upstream_up` at 0, and remembers its start for the
//! horizon). At most [`MAX_ROUTES`] are kept: when full, routes without an awake outage that no
//! request is using are dropped; if none can be, the rest share the upstream-wide one.

use std::collections::HashMap;
use std::sync::RwLock;

use http::HeaderValue;

use super::*;

/// Most routes with their own outage state. Far more than the Hosts one holdfast fronts; it
/// bounds what clients sending arbitrary Hosts can make holdfast keep.
pub const MAX_ROUTES: usize = 1024;

/// A route: the Host sent upstream, and the index of the endpoint its path falls under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RouteKey {
    host: Option<HeaderValue>,
    endpoint: Option<usize>,
}

/// Every route's outage state.
pub struct OutageRoutes {
    shared: Arc<SharedHold>,
    /// Whether routes are told apart (a router sits in between).
    per_route: AtomicBool,
    routes: RwLock<HashMap<RouteKey, Arc<RouteOutage>>>,
    /// The one route without a router, and where routes go past [`MAX_ROUTES`].
    shared_route: Arc<RouteOutage>,
}

impl OutageRoutes {
    /// No outage yet. `per_route`: tell routes apart (a router sits between holdfast and the
    /// application).
    pub fn new(template: Template, per_route: bool) -> Self {
        let shared = SharedHold::new(template);
        let shared_route = Arc::new(RouteOutage::new(
            shared.clone(),
            if per_route { "(other routes)" } else { "(all)" }.to_owned(),
            None,
        ));
        Self {
            shared,
            per_route: AtomicBool::new(per_route),
            routes: RwLock::new(HashMap::new()),
            shared_route,
        }
    }

    /// Whether holding is on.
    pub fn enabled(&self) -> bool {
        self.shared.enabled()
    }

    /// New settings (a reload), for every route from now on; `per_route`: whether routes are
    /// told apart from now on. What is held stays held, in the outage it waits in.
    pub fn reconfigure(&self, template: Template, per_route: bool) {
        self.shared.replace(template);
        self.per_route.store(per_route, Ordering::Release);
    }

    /// Largest body kept for a replay, now.
    pub fn max_body_bytes(&self) -> usize {
        self.shared.settings().cfg.max_body_bytes
    }

    /// The outage state of the route a request takes: the Host it sends upstream, and the
    /// endpoint (index into `routes.endpoints`) its path falls under.
    pub fn route(&self, host: Option<&HeaderValue>, endpoint: Option<usize>) -> Arc<RouteOutage> {
        if !self.per_route.load(Ordering::Acquire) {
            return self.shared_route.clone();
        }
        let key = RouteKey {
            host: host.cloned(),
            endpoint,
        };
        if let Some(route) = self.routes.read().expect("routes lock").get(&key) {
            return route.clone();
        }
        let mut routes = self.routes.write().expect("routes lock");
        if let Some(route) = routes.get(&key) {
            return route.clone();
        }
        if routes.len() >= MAX_ROUTES {
            // Nobody is using these (this map holds the only reference) and nothing is held
            // for them: they start afresh if they come back.
            routes.retain(|_, r| {
                let keep = Arc::strong_count(r) > 1 || r.is_active();
                if !keep && r.in_outage() {
                    // A dormant outage forgotten with its route.
                    self.shared.route_outages.fetch_sub(1, Ordering::AcqRel);
                }
                keep
            });
            if routes.len() >= MAX_ROUTES {
                return self.shared_route.clone();
            }
        }
        let name = format!(
            "{} {}",
            key.host
                .as_ref()
                .and_then(|h| h.to_str().ok())
                .unwrap_or("(no host)"),
            key.endpoint
                .map_or_else(|| "(other paths)".to_owned(), |i| format!("endpoint {i}"))
        );
        let route = Arc::new(RouteOutage::new(
            self.shared.clone(),
            name,
            key.host.clone(),
        ));
        routes.insert(key, route.clone());
        route
    }

    /// The upstream-wide outage: connection failures (refused, DNS, a connection closed unread)
    /// are the upstream's, whichever route met them, and any application answer ends it.
    pub fn upstream(&self) -> &Arc<RouteOutage> {
        &self.shared_route
    }

    /// The check at rest of the upstream (every `hold.check_interval_secs`, unless 0): a task
    /// to run for as long as holdfast serves.
    pub fn at_rest(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.shared_route.at_rest()
    }

    /// Whether any outage is open that a request's own route could be part of: one of a route,
    /// or the upstream-wide one. While none is, nothing needs a request's route, and its lookup
    /// (a lock and a hash) is skipped.
    pub fn routes_out(&self) -> bool {
        self.shared.route_outages.load(Ordering::Acquire) > 0 || self.shared_route.in_outage()
    }

    /// Routes kept now (for tests).
    pub fn routes(&self) -> usize {
        self.routes.read().expect("routes lock").len()
    }

    /// holdfast is shutting down: every held request, on every route, gets its 503 now, and
    /// none is held again.
    pub fn shutdown(&self) {
        self.shared_route.shutdown();
        for route in self.routes.read().expect("routes lock").values() {
            route.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::BodyHandle;

    fn hold_with(max_requests: usize, per_route: bool) -> (OutageRoutes, Arc<Metrics>) {
        let cfg = HoldConfig {
            enabled: true,
            timeout: Duration::from_secs(60),
            max_body_bytes: 1024,
            max_requests,
            max_buffered_bytes: 1 << 20,
            backoff_initial: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30),
            retry_after: crate::config::RetryAfter::Observed,
            retry_after_min: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(30),
            probe_path: None,
            check_interval: None,
        };
        let (template, metrics) = crate::hold::tests::template(cfg);
        let hold = OutageRoutes::new(template, per_route);
        (hold, metrics)
    }

    fn hold(max_requests: usize) -> (OutageRoutes, Arc<Metrics>) {
        hold_with(max_requests, true)
    }

    fn host(h: &'static str) -> HeaderValue {
        HeaderValue::from_static(h)
    }

    #[tokio::test(start_paused = true)]
    async fn routes_are_apart_but_share_the_caps_and_the_up_gauge() {
        let (hold, metrics) = hold(2);
        let (a, b) = (
            hold.route(Some(&host("a")), Some(0)),
            hold.route(Some(&host("b")), Some(0)),
        );
        assert!(Arc::ptr_eq(&a, &hold.route(Some(&host("a")), Some(0))));
        assert!(!Arc::ptr_eq(&a, &hold.route(Some(&host("a")), None)));
        a.missing(RewriteReason::RouteMissing404);
        assert!(a.in_outage() && !b.in_outage(), "b's route is not a's");
        assert!(!b.holds_before_dispatch(Duration::from_secs(120)));
        b.missing(RewriteReason::RouteMissing404);
        assert_eq!(metrics.upstream_up.get(), 0);

        // Two held on a, then b's route is full too: the cap is over all routes.
        let body = BodyHandle::empty();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move {
                    let body = BodyHandle::empty();
                    a.wait(&mut Ticket::default(), &body).await
                })
            })
            .collect();
        crate::hold::tests::until_held(&metrics, 2).await;
        assert_eq!(metrics.held_requests.get(), 2);
        assert_eq!(
            b.wait(&mut Ticket::default(), &body).await,
            Released::QueueFull
        );

        a.answered();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Released::Go);
        }
        assert_eq!(metrics.held_requests.get(), 0);
        assert_eq!(metrics.upstream_up.get(), 0, "b's outage is still open");
        b.answered();
        assert_eq!(metrics.upstream_up.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_answers_every_route_and_holds_nothing_after() {
        let (hold, metrics) = hold(10);
        let routes = [
            hold.route(Some(&host("a")), None),
            hold.route(Some(&host("b")), None),
            hold.upstream().clone(),
        ];
        let waiters: Vec<_> = routes
            .iter()
            .map(|r| {
                r.missing(RewriteReason::RouteMissing404);
                let r = r.clone();
                tokio::spawn(async move {
                    let body = BodyHandle::empty();
                    r.wait(&mut Ticket::default(), &body).await
                })
            })
            .collect();
        crate::hold::tests::until_held(&metrics, 3).await;
        assert_eq!(metrics.held_requests.get(), 3);
        hold.shutdown();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Released::Shutdown);
        }
        // A route first seen after shutdown holds nothing either.
        let late = hold.route(Some(&host("late")), None);
        late.missing(RewriteReason::RouteMissing404);
        let body = BodyHandle::empty();
        assert_eq!(
            late.wait(&mut Ticket::default(), &body).await,
            Released::Shutdown
        );
        assert_eq!(metrics.held_requests.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_nobody_waits_in_goes_dormant_and_wakes_when_met_again() {
        let (hold, metrics) = hold(10);
        let a = hold.route(Some(&host("a")), None);
        a.missing(RewriteReason::RouteMissing404);
        assert!(a.is_active());
        assert_eq!(metrics.upstream_up.get(), 0);
        // Answered 503 at once (a router's 502): still awake, the next request is held.
        a.answering_503();
        assert!(a.is_active());
        // A held request that gives up: the prober finds nobody waiting and stops; dormant.
        let body = BodyHandle::empty();
        let mut ticket =
            Ticket::with_deadline(tokio::time::Instant::now() + Duration::from_secs(1));
        assert_eq!(a.wait(&mut ticket, &body).await, Released::TimedOut);
        for _ in 0..100 {
            tokio::time::advance(Duration::from_secs(30)).await;
            if !a.is_active() {
                break;
            }
        }
        assert!(a.in_outage() && !a.is_active());
        assert_eq!(metrics.upstream_up.get(), 1);
        assert!(!a.holds_before_dispatch(Duration::from_secs(120)));
        // Met again: awake, and counted again.
        a.missing(RewriteReason::RouteMissing404);
        assert!(a.is_active());
        assert_eq!(metrics.upstream_up.get(), 0);
        assert_eq!(metrics.outages.get(), 1, "the same outage");
        // The upstream-wide outage never sleeps: a refused upstream stays down until it answers.
        let up = hold.upstream();
        up.missing(RewriteReason::ConnectRefused);
        let mut ticket =
            Ticket::with_deadline(tokio::time::Instant::now() + Duration::from_secs(1));
        assert_eq!(up.wait(&mut ticket, &body).await, Released::TimedOut);
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(30)).await;
        }
        assert!(up.is_active());
        a.answered();
        up.answered();
        assert_eq!(metrics.upstream_up.get(), 1);
    }

    #[tokio::test]
    async fn routes_are_bounded_and_unused_ones_go_first() {
        let (hold, _) = hold(10);
        let kept = hold.route(Some(&host("kept")), None);
        kept.missing(RewriteReason::RouteMissing404);
        for i in 0..MAX_ROUTES {
            let h = HeaderValue::from_str(&format!("h{i}.example")).unwrap();
            drop(hold.route(Some(&h), None));
        }
        assert!(hold.routes() <= MAX_ROUTES);
        // The route in an outage survived the clean-up.
        assert!(Arc::ptr_eq(&kept, &hold.route(Some(&host("kept")), None)));
    }

    #[tokio::test]
    async fn without_a_router_every_request_shares_one_route() {
        let (hold, _) = hold_with(1, false);
        let a = hold.route(Some(&host("a")), Some(0));
        assert!(Arc::ptr_eq(&a, &hold.route(Some(&host("b")), None)));
        assert_eq!(hold.routes(), 0);
    }
}
