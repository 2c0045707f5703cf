//! What holdfast logs: the access log, the outage start and end lines, and never a secret.

use serde_json::Value;

use crate::support::forgetful::ForgetfulServer;
use crate::support::http::{self, response, Reserved, Upstream};
use crate::support::process::{serving, Running};
use crate::support::proxy::metric_until_at;

/// The JSON log lines holdfast wrote.
fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

#[tokio::test]
async fn access_and_outage_lines_carry_what_operators_need_and_no_secret() {
    // Refused until the test lets the upstream listen.
    let upstream = Reserved::new();
    let url = upstream.url();
    let mut proxy = Running::start(
        serving(&url, &["--access-log"])
            // Holding off: the first request is answered 503 at once.
            .env("HOLDFAST_HOLD__ENABLED", "false"),
    );
    let started: Value = serde_json::from_str(&proxy.wait_for_line("holdfast proxying")).unwrap();
    let listen = started["listen"].as_str().unwrap().to_string();

    let secret = "s3cr3t-t0ken";
    let req = ::http::Request::get(format!("http://{listen}/mcp?token={secret}"))
        .header("host", &listen)
        .header("authorization", format!("Bearer {secret}"))
        .body(http_body_util::Full::default())
        .unwrap();
    assert_eq!(http::call(req).await.status, 503);

    let back = Upstream::serve(upstream.listen(), |_| async { response(200, &[], "ok") });
    assert_eq!(http::get(&format!("http://{listen}/mcp")).await.status, 200);
    proxy.wait_for_line("upstream outage ended");

    let (status, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    back.stop().await;
    let all = stderr.join("\n");
    assert!(!all.contains(secret), "a secret reached the logs:\n{all}");

    let lines = json_lines(&stderr);
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access")
        .collect();
    assert_eq!(access.len(), 2, "one access line per request:\n{all}");
    let (first, second) = (access[0], access[1]);
    assert_eq!(first["method"], "GET");
    assert_eq!(first["path"], "/mcp", "the path, never the query");
    assert_eq!(first["status"], 503);
    assert_eq!(first["action"], "rewritten");
    assert!(first.get("upstream_status").is_none_or(Value::is_null));
    assert_eq!(second["status"], 200);
    assert_eq!(second["upstream_status"], 200);
    assert_eq!(second["action"], "passed");
    assert!(second["duration_ms"].as_f64().is_some());

    let started = lines
        .iter()
        .find(|l| l["message"] == "upstream outage started")
        .unwrap_or_else(|| panic!("no outage start line:\n{all}"));
    assert_eq!(started["reason"], "connect_refused");
    // Where, and what the OS said: enough to tell a wrong port from a backend still starting.
    assert_eq!(started["upstream"], url.trim_start_matches("http://"));
    let error = started["error"].as_str().unwrap_or_default();
    assert!(error.contains("Connection refused"), "{started}");
    // And once at start, before any request: the upstream could not be reached.
    let at_start = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("the upstream cannot be reached now"))
        })
        .unwrap_or_else(|| panic!("no start-up warning:\n{all}"));
    assert_eq!(at_start["level"], "WARN");
    assert_eq!(at_start["upstream"], url.trim_start_matches("http://"));
    assert!(
        at_start["error"]
            .as_str()
            .is_some_and(|e| e.contains("Connection refused")),
        "{at_start}"
    );
    let ended = lines
        .iter()
        .find(|l| l["message"] == "upstream outage ended")
        .unwrap_or_else(|| panic!("no outage end line:\n{all}"));
    assert_eq!(ended["answered_503"], 1);
    assert_eq!(ended["first_reason"], "connect_refused");
    assert!(ended["duration_ms"].as_u64().is_some());
}

#[tokio::test]
async fn a_resumed_request_is_logged_as_resumed_and_nothing_recorded_is() {
    let server = ForgetfulServer::start().await;
    let mut proxy = Running::start(&mut serving(&server.upstream.url(), &["--access-log"]));
    let started: Value = serde_json::from_str(&proxy.wait_for_line("holdfast proxying")).unwrap();
    let listen = started["listen"].as_str().unwrap().to_string();
    let secret = "s3cr3t-in-the-initialize";
    let post = |session: Option<&str>, body: String| {
        let mut req = ::http::Request::post(format!("http://{listen}/mcp"))
            .header("host", &listen)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {secret}"));
        if let Some(id) = session {
            req = req.header("mcp-session-id", id);
        }
        http::call(req.body(http_body_util::Full::from(body)).unwrap())
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": secret, "version": "1"}}});
    let opened = post(None, init.to_string()).await;
    let id = opened.header("mcp-session-id").expect("session").to_owned();
    server.forget();
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count"}}"#;
    assert_eq!(post(Some(&id), call.into()).await.status, 200);
    proxy.wait_for_line("re-established an MCP session");

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    let all = stderr.join("\n");
    assert!(
        !all.contains(secret),
        "a recorded body reached the logs:\n{all}"
    );
    for session in ["s-1", "s-2"] {
        assert!(
            !all.contains(session),
            "a session id reached the logs:\n{all}"
        );
    }
    let lines = json_lines(&stderr);
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access")
        .collect();
    assert_eq!(access.len(), 2, "{all}");
    assert_eq!(access[0]["action"], "passed");
    assert_eq!(access[1]["action"], "resumed");
    assert_eq!(access[1]["status"], 200);
}

/// An upstream on this host is a sidecar's usual address, where no router sits in between:
/// unless the configuration says which, the start warns that router lookalikes are masked.
#[tokio::test]
async fn a_loopback_upstream_without_a_stated_topology_is_warned_about() {
    let start = |behind: Option<&str>| {
        let mut cmd = serving("http://127.0.0.1:8000", &[]);
        if let Some(behind) = behind {
            cmd.env("HOLDFAST_ROUTES__BEHIND_ROUTER", behind);
        }
        let mut proxy = Running::start(&mut cmd);
        proxy.wait_for_line("holdfast proxying");
        let (_, lines) = proxy.terminate();
        json_lines(&lines).into_iter().any(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("routes.behind_router"))
        })
    };
    assert!(start(None), "unset: warned");
    assert!(!start(Some("false")), "said: no warning");
    assert!(!start(Some("true")), "said: no warning");
}

#[tokio::test]
async fn a_held_request_is_logged_as_held_and_a_replayed_one_as_replayed() {
    let upstream = Reserved::new();
    let url = upstream.url();
    // The check at rest off: it would find the port closed at start, and the first request would
    // be held before it is sent, never replayed.
    let mut proxy = Running::start(
        serving(&url, &["--access-log"]).env("HOLDFAST_HOLD__CHECK_INTERVAL_SECS", "0"),
    );
    let started: Value = serde_json::from_str(&proxy.wait_for_line("holdfast proxying")).unwrap();
    let listen = started["listen"].as_str().unwrap().to_string();
    let admin = started["admin"].as_str().unwrap().to_string();
    let held = |n: f64| {
        let admin = admin.clone();
        async move { metric_until_at(&admin, "holdfast_held_requests", |v| v >= n).await }
    };
    let call = |id: u32| {
        let url = format!("http://{listen}/mcp");
        tokio::spawn(async move {
            http::post_json(
                &url,
                &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
            )
            .await
        })
    };
    // The first meets the refused connection and is held, to be sent again; the second comes
    // while the outage is known and is held before it is sent at all.
    let first = call(1);
    held(1.0).await;
    let second = call(2);
    held(2.0).await;
    let back = Upstream::serve(upstream.listen(), |_| async {
        response(200, &[("content-type", "application/json")], "{}")
    });
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    back.stop().await;
    let lines = json_lines(&stderr);
    let mut actions: Vec<&str> = lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access")
        .map(|l| l["action"].as_str().unwrap())
        .collect();
    actions.sort();
    assert_eq!(actions, ["held", "replayed"], "{stderr:?}");
    for line in lines.iter().filter(|l| l["target"] == "holdfast::access") {
        // At most three decimals: milliseconds to the microsecond.
        let ms = line["duration_ms"].as_f64().unwrap();
        assert_eq!((ms * 1000.0).round() / 1000.0, ms, "{line}");
    }
}

/// Every other access-log action, and the horizon's single warning: a router that lost the
/// route to `/mcp` (its 404s masked, then past the horizon passed on), a path the application
/// is not known to serve (`router_passed`), an upstream that never answers (`failed`), and a
/// request target holdfast cannot forward (`bad_request`).
#[tokio::test]
async fn the_access_log_names_router_passed_failed_and_bad_request_and_the_horizon_warns_once() {
    let upstream = Upstream::start(|seen| async move {
        if seen.uri == "/slow" {
            std::future::pending::<()>().await;
        }
        http::traefik_404()
    })
    .await;
    let mut proxy = Running::start(
        serving(&upstream.url(), &["--access-log"])
            .env("HOLDFAST_HOLD__ENABLED", "false")
            .env("HOLDFAST_ROUTES__BEHIND_ROUTER", "true")
            .env("HOLDFAST_ROUTES__HORIZON_SECS", "0.3")
            .env("HOLDFAST_CLIENT__RESPONSE_TIMEOUT_SECS", "0.3"),
    );
    let (listen, _) = proxy.addresses();
    let url = |path: &str| format!("http://{listen}{path}");

    // Masked: the outage, and with it the horizon, starts here.
    assert_eq!(http::get(&url("/mcp")).await.status, 503);
    assert_eq!(http::get(&url("/.well-known/other")).await.status, 404);
    assert_eq!(http::get(&url("/slow")).await.status, 502);
    let mut raw = tokio::net::TcpStream::connect(listen).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut raw, b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(http::read_head(&mut raw).await.starts_with("HTTP/1.1 400"));
    // The horizon is a time bound: time has to pass.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    for _ in 0..3 {
        assert_eq!(http::get(&url("/mcp")).await.status, 404);
    }

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    let all = stderr.join("\n");
    let lines = json_lines(&stderr);
    let access: Vec<(&str, &str, u64)> = lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access")
        .map(|l| {
            (
                l["path"].as_str().unwrap_or_default(),
                l["action"].as_str().unwrap(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        access,
        [
            ("/mcp", "rewritten", 503),
            ("/.well-known/other", "router_passed", 404),
            ("/slow", "failed", 502),
            ("*", "bad_request", 400),
            ("/mcp", "router_passed", 404),
            ("/mcp", "router_passed", 404),
            ("/mcp", "router_passed", 404),
        ],
        "{all}"
    );
    let horizon: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("longer than the horizon"))
        })
        .collect();
    assert_eq!(horizon.len(), 1, "one warning for three 404s:\n{all}");
    assert_eq!(horizon[0]["level"], "WARN");
}

/// A request whose client goes away while the upstream works on it is logged and counted once,
/// as `client_gone` with nginx's 499: its future was dropped, not answered, and a request that
/// leaves no line is one an operator cannot find.
#[tokio::test]
async fn a_request_whose_client_goes_away_is_logged_once_as_client_gone() {
    use tokio::io::AsyncWriteExt;

    // The upstream reads the request, tells the test, and never answers.
    let (reached, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let upstream = Upstream::start(move |_| {
        let reached = reached.clone();
        async move {
            let _ = reached.send(());
            std::future::pending::<()>().await;
            unreachable!()
        }
    })
    .await;
    let mut proxy = Running::start(&mut serving(&upstream.url(), &["--access-log"]));
    let started: Value = serde_json::from_str(&proxy.wait_for_line("holdfast proxying")).unwrap();
    let listen = started["listen"].as_str().unwrap().to_string();
    let admin = started["admin"].as_str().unwrap().to_string();

    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#;
    let mut client = tokio::net::TcpStream::connect(&listen).await.unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {listen}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    crate::support::within(arrived.recv())
        .await
        .expect("the upstream saw the request");
    drop(client);
    let series = "holdfast_requests_total{method=\"POST\",status=\"499\"}";
    metric_until_at(&admin, series, |v| v >= 1.0).await;

    let (_, stderr) = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    upstream.stop().await;
    let lines = json_lines(&stderr);
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "holdfast::access")
        .collect();
    assert_eq!(access.len(), 1, "one access line per request: {stderr:#?}");
    assert_eq!(access[0]["status"], 499);
    assert_eq!(access[0]["action"], "client_gone");
    assert_eq!(access[0]["path"], "/mcp");
    assert!(access[0]["upstream_status"].is_null());
}
