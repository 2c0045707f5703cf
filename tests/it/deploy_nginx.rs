//! The standalone deployment: holdfast run by systemd (`deploy/systemd/`, `deploy_systemd.rs`)
//! behind nginx (`deploy/nginx/holdfast.conf`).
//!
//! The nginx tests run the real nginx (the Debian package, which `.ci/run` installs) with the
//! shipped site file, changed only in its two addresses: nginx listens on a free loopback port
//! instead of 80, and its `upstream` points at a holdfast running in this process instead of
//! 127.0.0.1:8080. A wrapper `nginx.conf` in a temporary directory supplies what the site file
//! leaves to the host's main configuration (pid file, logs, temp paths), and turns gzip on for
//! every type the way a host's configuration might, so the site file must turn it off itself.
//! nginx runs as one foreground process (`master_process off`) that the test kills at the end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::Full;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::deploy_systemd::{unit_config, UNIT_CONFIG};
use crate::sse::{event, push, sse_upstream, Events};
use crate::support::files::read_repo;
use crate::support::http::{echo, host_of, post_json, send, Reserved, Upstream};
use crate::support::nginx::Nginx;
use crate::support::proxy::{metric_value, raw_config, requests_with_status, Holdfast};
use crate::support::within;

/// The shipped nginx site file.
const NGINX_SITE: &str = "deploy/nginx/holdfast.conf";
/// holdfast's address in the shipped nginx site file.
const SITE_HOLDFAST: &str = "127.0.0.1:8080";

// ------------------------------------------------------------------------------------------
// nginx's configuration language, as far as these tests read it
// ------------------------------------------------------------------------------------------

/// One directive: the blocks it sits in (`["upstream holdfast", "server", "location /"]`), its
/// name and its arguments, unquoted.
#[derive(Debug, Clone)]
struct Directive {
    context: Vec<String>,
    name: String,
    args: Vec<String>,
}

/// Splits an nginx configuration into directives: comments dropped, quotes removed, each
/// directive tagged with the blocks around it.
fn nginx_directives(text: &str) -> Vec<Directive> {
    let mut directives = Vec::new();
    let mut context: Vec<String> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' | '\'' => {
                let mut word = String::new();
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
                words.push(word);
            }
            ';' => {
                assert!(!words.is_empty(), "empty directive in nginx configuration");
                let name = words.remove(0);
                directives.push(Directive {
                    context: context.clone(),
                    name,
                    args: std::mem::take(&mut words),
                });
            }
            '{' => context.push(std::mem::take(&mut words).join(" ")),
            '}' => {
                assert!(words.is_empty(), "unterminated directive before `}}`");
                context
                    .pop()
                    .expect("unbalanced `}` in nginx configuration");
            }
            c if c.is_whitespace() => {}
            _ => {
                let mut word = String::from(c);
                while let Some(&n) = chars.peek() {
                    if n.is_whitespace() || matches!(n, ';' | '{' | '}' | '#' | '"' | '\'') {
                        break;
                    }
                    word.push(n);
                    chars.next();
                }
                words.push(word);
            }
        }
    }
    assert!(context.is_empty(), "unclosed block in nginx configuration");
    directives
}

/// An nginx time (`90`, `5s`, `24h`, `1h30m`, `500ms`).
fn nginx_time(value: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut rest = value;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("bad nginx time {value:?}"));
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..unit] {
            "ms" => {
                total += Duration::from_millis(n);
                0
            }
            "" | "s" => n,
            "m" => n * 60,
            "h" => n * 3600,
            "d" => n * 86400,
            "w" => n * 7 * 86400,
            other => panic!("unknown unit {other:?} in nginx time {value:?}"),
        };
        total += Duration::from_secs(secs);
        rest = &rest[unit..];
    }
    total
}

/// The shipped site file's directives, and lookups into them.
struct Site(Vec<Directive>);

impl Site {
    fn shipped() -> Site {
        Site(nginx_directives(&read_repo(NGINX_SITE)))
    }

    /// The arguments of every `name` directive directly inside the block `block` (matched by
    /// its first word: `upstream`, `server`, `location`).
    fn all(&self, block: &str, name: &str) -> Vec<Vec<String>> {
        self.0
            .iter()
            .filter(|d| d.name == name)
            .filter(|d| {
                d.context
                    .last()
                    .is_some_and(|c| c.split(' ').next() == Some(block))
            })
            .map(|d| d.args.clone())
            .collect()
    }

    /// The one `name` directive in `block`, as one string.
    fn one(&self, block: &str, name: &str) -> String {
        let all = self.all(block, name);
        assert_eq!(
            all.len(),
            1,
            "{NGINX_SITE}: expected exactly one `{name}` in its `{block}` block, found {all:?}"
        );
        all[0].join(" ")
    }

    /// The value `proxy_set_header` gives `header` in the location.
    fn header(&self, header: &str) -> Option<String> {
        self.all("location", "proxy_set_header")
            .into_iter()
            .find(|args| args[0].eq_ignore_ascii_case(header))
            .map(|args| args[1..].join(" "))
    }
}

/// The shipped site file with nginx on `listen` and holdfast at `holdfast`: the only change.
/// nginx with the shipped site in front of holdfast at `holdfast`.
async fn start_nginx(holdfast: SocketAddr) -> Nginx {
    let shipped = read_repo(NGINX_SITE);
    Nginx::start(|listen| site_for_test(&shipped, listen, holdfast)).await
}

fn site_for_test(shipped: &str, listen: SocketAddr, holdfast: SocketAddr) -> String {
    let server_line = format!("server {SITE_HOLDFAST};");
    assert_eq!(
        shipped.matches(&server_line).count(),
        1,
        "{NGINX_SITE} must point its upstream at holdfast with `{server_line}`"
    );
    let mut listens = 0;
    let lines: Vec<String> = shipped
        .replace(&server_line, &format!("server {holdfast};"))
        .lines()
        .map(|line| {
            let directive = line.trim();
            if !directive.starts_with("listen ") {
                line.to_string()
            } else if directive == "listen 80;" {
                listens += 1;
                format!("    listen {listen};")
            } else if directive.starts_with("listen [::]:") {
                // The IPv6 twin: loopback IPv4 is all the test needs (and a container may have
                // no IPv6 at all).
                String::new()
            } else {
                panic!("{NGINX_SITE}: the test does not know how to move `{directive}`")
            }
        })
        .collect();
    assert_eq!(listens, 1, "{NGINX_SITE} must have one `listen 80;`");
    lines.join("\n")
}

// ------------------------------------------------------------------------------------------
// A real nginx
// ------------------------------------------------------------------------------------------

// ------------------------------------------------------------------------------------------
// nginx: the shipped site, read
// ------------------------------------------------------------------------------------------

#[test]
fn the_nginx_site_is_configured_for_streams_and_keep_alive() {
    let site = Site::shipped();
    let holdfast = unit_config();
    let secs = Duration::from_secs_f64;

    // The upstream block: holdfast's listener, with keep-alive connections.
    assert_eq!(site.one("upstream", "server"), SITE_HOLDFAST);
    assert_eq!(
        holdfast.listen, SITE_HOLDFAST,
        "{UNIT_CONFIG} must make holdfast listen where nginx sends requests"
    );
    // nginx is in front of holdfast; holdfast reaches the server directly.
    assert_eq!(
        holdfast.routes.behind_router,
        Some(false),
        "{UNIT_CONFIG}: no router sits between holdfast and the server"
    );
    // nginx (on loopback) is the proxy in front whose X-Forwarded-* holdfast keeps.
    assert_eq!(
        holdfast.forwarded.trusted_proxies,
        ["127.0.0.1", "::1"],
        "{UNIT_CONFIG} must trust nginx's forwarded headers"
    );
    let keepalive: usize = site.one("upstream", "keepalive").parse().unwrap();
    assert!(keepalive > 0);
    // nginx must drop an idle connection before holdfast closes it, or it may send a request on
    // a connection holdfast is closing and answer nginx's own 502.
    let idle = nginx_time(&site.one("upstream", "keepalive_timeout"));
    assert!(
        idle < secs(holdfast.limits.header_read_timeout_secs),
        "keepalive_timeout {idle:?} must be below holdfast's limits.header_read_timeout_secs"
    );

    // The location: HTTP/1.1 keep-alive, streaming both ways.
    assert_eq!(site.one("location", "proxy_pass"), "http://holdfast");
    assert_eq!(site.one("location", "proxy_http_version"), "1.1");
    assert_eq!(site.header("Connection").as_deref(), Some(""));
    assert_eq!(site.one("location", "proxy_buffering"), "off");
    assert_eq!(site.one("location", "proxy_request_buffering"), "off");
    assert_eq!(site.one("server", "gzip"), "off");

    // nginx's timeouts outlast holdfast's, so holdfast decides when a stream or an answer is
    // late, and a quiet GET stream can live for hours.
    let read = nginx_time(&site.one("location", "proxy_read_timeout"));
    assert!(
        read >= Duration::from_secs(3600),
        "proxy_read_timeout {read:?}"
    );
    for (key, value) in [
        (
            "streams.idle_timeout_secs",
            holdfast.streams.idle_timeout_secs,
        ),
        (
            "client.response_timeout_secs",
            holdfast.client.response_timeout_secs,
        ),
        ("hold.timeout_secs", holdfast.hold.timeout_secs),
    ] {
        assert!(read > secs(value), "proxy_read_timeout must exceed {key}");
    }

    // The MCP server sees the client's Host, and who the client is.
    assert_eq!(site.header("Host").as_deref(), Some("$http_host"));
    // The client's address, not appended to what the client claimed: nginx is the edge.
    assert_eq!(
        site.header("X-Forwarded-For").as_deref(),
        Some("$remote_addr")
    );
    assert_eq!(site.header("X-Forwarded-Proto").as_deref(), Some("$scheme"));
    assert!(site.header("X-Forwarded-Host").is_some());
}

// ------------------------------------------------------------------------------------------
// nginx: the shipped site, running
// ------------------------------------------------------------------------------------------

/// A GET that opens an SSE stream through nginx, as an MCP client does (and accepting gzip,
/// as HTTP clients usually do).
async fn open_stream(nginx: &Nginx) -> Response<hyper::body::Incoming> {
    let url = nginx.url("/mcp");
    let req = Request::get(&url)
        .header("host", host_of(&url))
        .header("accept", "text/event-stream")
        .header("accept-encoding", "gzip")
        .body(Full::default())
        .unwrap();
    let resp = within(send(req)).await;
    assert_eq!(resp.status(), 200, "{}", nginx.log());
    assert_eq!(
        resp.headers().get("content-encoding"),
        None,
        "a stream must not be compressed"
    );
    resp
}

/// Events cross nginx and holdfast one at a time: the upstream sends event N only after the
/// client has read event N-1, which neither a buffering proxy nor gzip would let through.
#[tokio::test]
async fn sse_events_cross_nginx_and_holdfast_one_at_a_time() {
    let (upstream, mut streams) = sse_upstream(&[]).await;
    // As the recipe configures it: nginx on this host is trusted.
    let mut raw = raw_config(&upstream.url());
    raw.forwarded.trusted_proxies = vec!["127.0.0.1".into(), "::1".into()];
    let holdfast = Holdfast::start_with(raw).await;
    let nginx = start_nginx(holdfast.addr).await;

    let resp = open_stream(&nginx).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let tx = within(streams.recv()).await.unwrap();
    let mut events = Events::new(resp);
    for n in 1..=5 {
        push(&tx, n).await;
        assert_eq!(events.next().await, event(n));
    }
    drop(tx);
    events.end().await.expect("a clean end");

    // The MCP server saw the client's Host and who the client was.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let header = |name: &str| seen[0].headers[name].to_str().unwrap().to_string();
    let client_host = nginx.addr.to_string();
    assert_eq!(header("host"), client_host);
    assert!(header("x-forwarded-host").starts_with(&client_host));
    // nginx's entry first (the client), then holdfast's (nginx).
    assert_eq!(header("x-forwarded-for"), "127.0.0.1, 127.0.0.1");
    assert!(header("x-forwarded-proto").starts_with("http"));
}

/// The site itself streams: a body of another type, which holdfast does not mark
/// `X-Accel-Buffering: no`, still crosses nginx chunk by chunk (`proxy_buffering off`).
#[tokio::test]
async fn any_streamed_body_crosses_nginx_unbuffered() {
    let (upstream, mut streams) = sse_upstream(&[("content-type", "application/x-ndjson")]).await;
    // As the recipe configures it: nginx on this host is trusted.
    let mut raw = raw_config(&upstream.url());
    raw.forwarded.trusted_proxies = vec!["127.0.0.1".into(), "::1".into()];
    let holdfast = Holdfast::start_with(raw).await;
    let nginx = start_nginx(holdfast.addr).await;

    let resp = open_stream(&nginx).await;
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let tx = within(streams.recv()).await.unwrap();
    let mut chunks = Events::new(resp);
    for n in 1..=3 {
        push(&tx, n).await;
        assert_eq!(chunks.next().await, event(n));
    }
    drop(tx);
    chunks.end().await.expect("a clean end");
}

/// One request as the client loop saw it.
#[derive(Debug)]
struct Answer {
    status: u16,
    body_echoed: bool,
    took: Duration,
}

/// An MCP client posting requests back to back through nginx, in a task, until told to stop.
///
/// Each request runs under `turn`: a test that takes the lock waits for the request in flight
/// to end and keeps the next one from starting, so it can stop the backend *between* requests
/// (a request cut off mid-response may have run, and failing it would be right).
struct ClientLoop {
    stop: Arc<AtomicBool>,
    /// Requests answered 200 so far.
    ok: watch::Receiver<usize>,
    turn: Arc<tokio::sync::Mutex<()>>,
    task: JoinHandle<Vec<Answer>>,
}

impl ClientLoop {
    fn start(url: String) -> ClientLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let (progress, ok) = watch::channel(0);
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        let task = tokio::spawn({
            let (stop, turn) = (stop.clone(), turn.clone());
            async move {
                let mut answers = Vec::new();
                for id in 1.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let _turn = turn.lock().await;
                    let body = format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"count"}}}}"#
                    );
                    let started = Instant::now();
                    let got = within(post_json(&url, &body)).await;
                    let answer = Answer {
                        status: got.status.as_u16(),
                        body_echoed: got.body == body.as_bytes(),
                        took: started.elapsed(),
                    };
                    let failed = answer.status != 200 || !answer.body_echoed;
                    answers.push(answer);
                    if failed {
                        // The first failure is the finding: stop there.
                        break;
                    }
                    progress.send_modify(|n| *n += 1);
                }
                answers
            }
        });
        ClientLoop {
            stop,
            ok,
            turn,
            task,
        }
    }

    /// Waits until `n` requests in all were answered 200; fails with the last answer if the
    /// loop stopped first.
    async fn until(&mut self, n: usize) {
        if within(self.ok.wait_for(|&ok| ok >= n)).await.is_err() {
            let answers = (&mut self.task).await.expect("client loop");
            panic!("the client loop stopped at {:?}", answers.last());
        }
    }

    /// Waits until a request is held in holdfast. Entering the hold is nothing a client can
    /// await, so the metric that shows it is polled, with a deadline; a request answered
    /// instead of held ends the loop, and the test.
    async fn until_held(&mut self, holdfast: &Holdfast) {
        within(async {
            while holdfast.metric("holdfast_held_requests").await < 1.0 {
                if self.task.is_finished() {
                    let answers = (&mut self.task).await.expect("client loop");
                    panic!(
                        "the request that met the stopped backend was answered, not held: {:?}",
                        answers.last()
                    );
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    /// Stops after the request in flight and returns every answer.
    async fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::SeqCst);
        within(self.task).await.expect("client loop")
    }
}

/// The backend stops (its port refuses connections) and comes back on the same port while a
/// client keeps posting through nginx: every answer is the application's 200, because holdfast
/// holds the requests that meet the gap and nginx waits for holdfast. Never a 404, 502 or 503.
#[tokio::test]
async fn the_client_behind_nginx_sees_only_200s_while_the_backend_restarts() {
    let reserved = Reserved::new();
    let addr = reserved.addr;
    let first = Upstream::serve(reserved.listen(), echo);
    // Default settings: holding is on.
    let holdfast = Holdfast::start(&format!("http://{addr}")).await;
    let nginx = start_nginx(holdfast.addr).await;

    let mut client = ClientLoop::start(nginx.url("/mcp"));
    client.until(5).await;

    // The container stops between two requests; its port refuses connections from now on.
    let (seen_by_first, port) = {
        let _between = within(client.turn.lock()).await;
        let seen = first.seen().len();
        within(first.stop()).await;
        (seen, Reserved::again(addr))
    };
    // The next request meets the refused port and waits in holdfast's hold, behind nginx.
    client.until_held(&holdfast).await;
    let ok_before_restart = *client.ok.borrow();

    // The new container listens on the same port.
    let second = Upstream::serve(port.listen(), echo);
    client.until(ok_before_restart + 5).await;
    let answers = client.finish().await;

    let failed: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status != 200 || !a.body_echoed)
        .collect();
    assert!(
        failed.is_empty(),
        "answers other than the application's 200: {failed:?}\n{}",
        nginx.log()
    );
    let metrics = holdfast.metrics().await;
    // What a failure below is read against: every answer and every counter.
    let context = format!("answers: {answers:?}\nmetrics:\n{metrics}");
    // Each request reached the application exactly once: held, not lost, not repeated.
    assert_eq!(
        seen_by_first + second.seen().len(),
        answers.len(),
        "seen by the first instance {seen_by_first}, by the second {}\n{context}",
        second.seen().len()
    );
    let held = answers.iter().map(|a| a.took).max().unwrap();
    eprintln!(
        "deploy_nginx: {} requests through nginx, all 200; the held one took {held:?}",
        answers.len()
    );

    // The one request that met the refused port was held once, released once (as the probe,
    // once something listened again) and replayed once.
    for (counter, expected) in [
        ("holdfast_holds_total{outcome=\"released\"}", 1.0),
        (
            "holdfast_rewrites_total{reason=\"connect_refused\",action=\"held\"}",
            1.0,
        ),
        ("holdfast_replays_total", 1.0),
        ("holdfast_outages_total", 1.0),
    ] {
        assert_eq!(
            metric_value(&metrics, counter),
            expected,
            "{counter}\n{context}"
        );
    }
    for status in [404, 502, 503] {
        assert_eq!(
            requests_with_status(&metrics, status),
            0.0,
            "status {status}\n{context}"
        );
    }
}
