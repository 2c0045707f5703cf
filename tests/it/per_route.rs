//! Outages per route (issue 10): behind a router that routes by Host, a request for a Host the
//! router does not know gets the router's route-missing 404 and is held, and nobody else's
//! requests are; the route that exists keeps being answered at once.

use bytes::Bytes;
use http_body_util::Full;

use crate::support::http::{self, response, Upstream};
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count"}}"#;

/// A router with one route: `mcp.example` reaches the application, any other Host gets
/// Traefik's route-missing 404.
async fn router() -> Upstream {
    Upstream::start(|seen| async move {
        if seen.header("host") == Some("mcp.example") {
            response(200, &[("content-type", "application/json")], "{}")
        } else {
            http::traefik_404()
        }
    })
    .await
}

/// A tools/call to holdfast's `/mcp` with `host` as its Host.
fn call(hf: &Holdfast, host: &str) -> impl std::future::Future<Output = http::Got> + 'static {
    http::call(
        ::http::Request::post(hf.url("/mcp"))
            .header("host", host)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from_static(CALL.as_bytes())))
            .unwrap(),
    )
}

async fn post(hf: &Holdfast, host: &str) -> http::Got {
    call(hf, host).await
}

#[tokio::test]
async fn a_bogus_host_is_held_alone_and_the_real_route_is_answered_at_once() {
    let up = router().await;
    let mut raw = raw_config(&up.url());
    raw.routes.behind_router = Some(true);
    // Long enough that the bogus request is still held after the five others on a loaded
    // machine (1 s was not, with four busy processes on two cores; 5 s was not under a full
    // test run beside a soak), and below `within`'s 30 s: the test waits it out below.
    raw.hold.timeout_secs = 20.0;
    let hf = Holdfast::start_with(raw).await;

    // A client with a Host the router has no route for: held, the route presumed missing.
    let bogus = tokio::spawn(call(&hf, "nobody.example"));
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    assert_eq!(
        hf.metric("holdfast_upstream_up").await,
        0.0,
        "an outage is open"
    );

    // Everyone else's route is there: answered at once, never held behind the bogus one.
    for _ in 0..5 {
        let got = within(post(&hf, "mcp.example")).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    // Still held: awaited, not read at an instant, because the held request itself goes out as
    // its route's probe now and then, and the gauge reads 0 while it is out (CI met that once).
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    assert_eq!(hf.metric("holdfast_outages_total").await, 1.0);
    // Every request for the real route reached it, none held.
    let to_good = up
        .seen()
        .iter()
        .filter(|s| s.header("host") == Some("mcp.example"))
        .count();
    assert_eq!(to_good, 5);

    // Once the bogus request gives up (its hold times out into a 503) nobody waits for that
    // route: its outage goes dormant and no longer says the upstream is down.
    assert_eq!(within(bogus).await.unwrap().status, 503);
    hf.metric_until("holdfast_upstream_up", |v| v == 1.0).await;
    assert_eq!(hf.metric("holdfast_held_requests").await, 0.0);
    // The real route still answers; the bogus one is held again when asked for again.
    assert_eq!(within(post(&hf, "mcp.example")).await.status, 200);
}

#[tokio::test]
async fn a_flood_of_bogus_hosts_holds_only_itself() {
    // The adversarial run's case: 110 POSTs with Hosts the router does not know, while three
    // clients of the real route go on. The flood is held (on its own routes), the real route's
    // requests are not held behind it, nor answered 503.
    let up = router().await;
    let mut raw = raw_config(&up.url());
    raw.routes.behind_router = Some(true);
    raw.hold.timeout_secs = 30.0;
    let mut hf = Holdfast::start_with(raw).await;

    let flood: Vec<_> = (0..110)
        .map(|i| tokio::spawn(call(&hf, &format!("bogus-{}.example", i % 10))))
        .collect();
    hf.metric_until("holdfast_held_requests", |v| v == 110.0)
        .await;

    let clients: Vec<_> = (0..3)
        .map(|_| {
            let calls: Vec<_> = (0..3).map(|_| call(&hf, "mcp.example")).collect();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for c in calls {
                    statuses.push(c.await.status);
                }
                statuses
            })
        })
        .collect();
    for client in clients {
        assert_eq!(within(client).await.unwrap(), [200, 200, 200]);
    }
    // Still the flood held, and no more: each bogus route has at most its oldest request out
    // as its probe at a time.
    let held = hf.metric("holdfast_held_requests").await;
    assert!((100.0..=110.0).contains(&held), "{held} held");
    let to_good = up
        .seen()
        .iter()
        .filter(|s| s.header("host") == Some("mcp.example"))
        .count();
    assert_eq!(to_good, 9, "each real call reached the application once");

    hf.begin_shutdown();
    for f in flood {
        assert_eq!(
            within(f).await.unwrap().status,
            503,
            "the flood gets its 503"
        );
    }
}

#[tokio::test]
async fn a_refused_connection_is_the_upstreams_whichever_host_met_it() {
    // Refused for every Host alike: one upstream-wide outage, and the first answer ends it.
    let port = http::Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(true);
    let hf = Holdfast::start_with(raw).await;
    let held = tokio::spawn(call(&hf, "a.example"));
    hf.metric_until("holdfast_held_requests", |v| v == 1.0)
        .await;
    // Another Host's request is held before it is sent: the upstream is gone, not a route.
    let other = tokio::spawn(call(&hf, "b.example"));
    hf.metric_until("holdfast_held_requests", |v| v == 2.0)
        .await;
    let up = Upstream::serve(port.listen(), |_| async {
        response(200, &[("content-type", "application/json")], "{}")
    });
    assert_eq!(within(held).await.unwrap().status, 200);
    assert_eq!(within(other).await.unwrap().status, 200);
    assert_eq!(hf.metric("holdfast_outages_total").await, 1.0, "one outage");
    assert_eq!(hf.metric("holdfast_upstream_up").await, 1.0);
    up.stop().await;
}

#[tokio::test]
async fn with_no_router_in_between_there_is_one_route() {
    // Refused for every Host alike: the upstream is gone, not a route.
    let port = http::Reserved::new();
    let mut raw = raw_config(&port.url());
    raw.routes.behind_router = Some(false);
    raw.hold.timeout_secs = 0.2;
    let hf = Holdfast::start_with(raw).await;
    for host in ["a.example", "b.example"] {
        assert_eq!(post(&hf, host).await.status, 503);
    }
    assert_eq!(hf.metric("holdfast_outages_total").await, 1.0, "one outage");
}
