//! A router's own 5xx while its route still points at a dead container: nginx's HTML 502 page,
//! from a real nginx in front of the reference everything server that crashed (stopped without
//! its route going). The 502 may follow a request the server read, so a call that meets it
//! cannot be sent again: it gets the 503 at once. But that is the only call the crash may cost:
//! the outage opens, the calls after it are held before they are sent, a request that runs
//! nothing (`OPTIONS` on the endpoint) watches for the server instead of a held call, and a
//! call safe to send twice that meets the 502 is held too.

use serde_json::json;

use crate::support::clients::{Peer, PeerClient};
use crate::support::nginx::Nginx;
use crate::support::proxy::Holdfast;
use crate::support::stacks::{Stack, StackServer};
use crate::support::within;

/// nginx proxying everything to `backend`, streaming as an MCP site needs.
fn nginx_in_front_of(backend: std::net::SocketAddr) -> impl Fn(std::net::SocketAddr) -> String {
    move |listen| {
        format!(
            "server {{\n\
             \x20   listen {listen};\n\
             \x20   location / {{\n\
             \x20       proxy_pass http://{backend};\n\
             \x20       proxy_http_version 1.1;\n\
             \x20       proxy_set_header Connection \"\";\n\
             \x20       proxy_buffering off;\n\
             \x20       proxy_request_buffering off;\n\
             \x20       proxy_read_timeout 1h;\n\
             \x20   }}\n\
             }}\n"
        )
    }
}

/// The everything server behind nginx, holdfast in front, the TypeScript SDK client connected.
async fn crashed_behind_nginx() -> (StackServer, Nginx, Holdfast, PeerClient) {
    let server = StackServer::start(Stack::Everything).await;
    let nginx = Nginx::start(nginx_in_front_of(server.addr())).await;
    let holdfast = Holdfast::start(&nginx.url("")).await;
    let mut client = PeerClient::start_peer(Peer::TsSdk, &holdfast.url("/mcp")).await;
    let (tool, args, expected) = Stack::Everything.call(0);
    assert_eq!(client.call(tool, args).await, Ok(expected));
    (server, nginx, holdfast, client)
}

/// The command that calls the everything server's `echo` with call `n`'s arguments.
fn call_command(n: u64) -> serde_json::Value {
    let (tool, args, _) = Stack::Everything.call(n);
    json!({ "op": "call", "tool": tool, "args": args })
}

#[tokio::test]
async fn a_crash_behind_nginx_costs_the_call_that_met_its_502_and_no_other() {
    let (mut server, nginx, holdfast, mut client) = crashed_behind_nginx().await;
    // The container dies; nginx still routes to it and answers its own 502 page.
    within(server.stop()).await;

    // The first call meets that 502: it may have been read, so it is not sent again.
    let (tool, args, _) = Stack::Everything.call(1);
    let first = client.call(tool, args).await;
    let error = first.expect_err("the call that met the 502 is answered 503");
    assert!(
        error.contains("503") || error.contains("temporarily unavailable"),
        "{error}"
    );
    assert_eq!(
        holdfast
            .metric(
                "holdfast_rewrites_total{reason=\"router_unavailable\",action=\"answered_503\"}"
            )
            .await,
        1.0,
        "recognised as nginx's, not the application's; nginx:\n{}",
        nginx.log()
    );

    // The next calls are held before they are sent, and none goes out as a probe into the 502:
    // OPTIONS asks for them.
    client.send(call_command(2));
    holdfast
        .metric_until("holdfast_held_requests", |held| held == 1.0)
        .await;
    within(server.start_again()).await;
    assert_eq!(
        client.result().await,
        Ok(Stack::Everything.call(2).2),
        "held through the crash; trace:\n{}",
        client.trace()
    );
    for n in 3..6 {
        let (tool, args, expected) = Stack::Everything.call(n);
        assert_eq!(client.call(tool, args).await, Ok(expected), "call {n}");
    }
    assert_eq!(
        holdfast
            .metric(
                "holdfast_rewrites_total{reason=\"router_unavailable\",action=\"answered_503\"}"
            )
            .await,
        1.0,
        "one call lost to the crash, no more"
    );
    let log = nginx.log();
    assert!(
        log.contains("\"OPTIONS /mcp"),
        "OPTIONS watched for the server: {log}"
    );
    assert_eq!(
        log.matches("call-2").count(),
        0,
        "the access log shows no bodies; the held call went once, after the server was back"
    );
}

#[tokio::test]
async fn a_call_safe_to_send_twice_that_meets_nginxs_502_is_held() {
    let (mut server, _nginx, holdfast, mut client) = crashed_behind_nginx().await;
    within(server.stop()).await;
    // tools/list is read-only by definition: held, not answered 503.
    client.send(json!({ "op": "list" }));
    holdfast
        .metric_until("holdfast_held_requests", |held| held == 1.0)
        .await;
    within(server.start_again()).await;
    let listed = client
        .result()
        .await
        .expect("the list, once the server is back");
    assert!(listed.split(',').any(|tool| tool == "echo"), "{listed}");
    assert_eq!(
        holdfast
            .metric_or_zero(
                "holdfast_rewrites_total{reason=\"router_unavailable\",action=\"answered_503\"}"
            )
            .await,
        0.0
    );
}
