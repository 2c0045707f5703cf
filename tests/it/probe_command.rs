//! `holdfast probe` as a command: text or JSON, the exit status by kind, the text form as
//! documented, `check-config`'s warning for an upstream that is not a Streamable HTTP server, and
//! a probe through holdfast (the endpoints of each kind: `probe.rs`).

use std::time::Duration;

use bytes::Bytes;
use holdfast::probe::verdict::Kind;
use http::Method;
use http_body::Frame;
use tokio::sync::mpsc;

use crate::probe::{legacy_server, open_stream, probe};
use crate::support::http::{response, Reserved, Upstream};
use crate::support::mcp::McpServer;
use crate::support::process::{finish, holdfast};

#[test]
fn the_command_prints_text_or_json_and_exits_by_kind() {
    let port = Reserved::new();
    let url = format!("{}/mcp", port.url());
    let out = finish(holdfast(&["probe", &url]), "holdfast probe");
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(out.stdout.contains("POST   server/discover"), "{out:?}");
    assert!(
        out.stdout.contains("verdict:  connection refused"),
        "{out:?}"
    );

    let out = finish(holdfast(&["probe", "--json", &url]), "holdfast probe");
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    assert_eq!(doc["verdict"]["kind"], "outage");
    assert_eq!(doc["exit_code"], 5);
    assert_eq!(doc["steps"][0]["method"], "POST");

    for bad in [
        vec!["probe", "ftp://x/mcp"],
        vec!["probe", "http://x/mcp", "-H", "no colon"],
        vec!["probe", "http://x/mcp", "--timeout", "0"],
    ] {
        let out = finish(holdfast(&bad), "holdfast probe");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
        assert!(out.stderr.starts_with("probe: "), "{out:?}");
    }
    let help = finish(holdfast(&["probe", "--help"]), "holdfast probe");
    for text in [
        "Exit status: 0",
        "3 a legacy",
        "5 an outage",
        "--json",
        "--header",
    ] {
        assert!(help.stdout.contains(text), "{text}: {}", help.stdout);
    }
}

/// The text form with what changes from run to run (ports, milliseconds) replaced.
fn normalised(text: &str, port: u16) -> String {
    /// The width of the time column (`{:>8.1} ms`), and of the times the golden text was
    /// written with (`2.3`): a slower machine's `12.3` takes one space of the padding.
    const WIDTH: usize = 8;
    const GOLDEN: usize = 3;
    let text = text.replace(&port.to_string(), "PORT");
    text.lines()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            let mut out: Vec<&str> = Vec::new();
            for (i, w) in words.iter().enumerate() {
                let is_ms = words.get(i + 1) == Some(&"ms") && w.parse::<f64>().is_ok();
                if !is_ms {
                    out.push(w);
                    continue;
                }
                // The time with its padding becomes a time of the golden width.
                for _ in 0..WIDTH.saturating_sub(w.len()) {
                    if out.last() == Some(&"") {
                        out.pop();
                    }
                }
                out.extend(std::iter::repeat_n("", WIDTH - GOLDEN));
                out.push("T");
            }
            out.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_text_form_reads_as_documented() {
    let (server, _kept) = legacy_server(Duration::ZERO, Duration::ZERO, "/messages?s=1").await;
    let report = probe(&format!("{}/sse", server.url())).await;
    let golden = "\
holdfast probe http://127.0.0.1:PORT/sse
  POST   server/discover            405 text/plain              T ms  not the 2026-07-28 revision
  POST   initialize                 405 text/plain              T ms
  GET    legacy GET                 200 text/event-stream       T ms
verdict:  a legacy HTTP+SSE server (2024-11-05 transport): its endpoint event names /messages?s=1 (relative)
holdfast: holdfast would forward it, but legacy sessions live in the SSE stream: a restart ends them, and holdfast cannot carry them
next:     upgrade the server to Streamable HTTP, or point clients at the /sse URL with a client that speaks the legacy transport";
    assert_eq!(
        normalised(report.text().trim_end(), server.addr.port()),
        golden
    );
}

#[tokio::test]
async fn check_config_probe_warns_unless_the_upstream_is_a_streamable_http_server() {
    let server = McpServer::start().await;
    let port = Reserved::new();
    let run = |upstream: String| {
        tokio::task::spawn_blocking(move || {
            finish(
                holdfast(&["check-config", "--upstream", &upstream, "--probe"]),
                "holdfast check-config --probe",
            )
        })
    };
    let good = run(format!("http://{}", server.addr())).await.unwrap();
    assert!(good.status.success(), "{good:?}");
    assert!(
        good.stdout.contains("upstream = "),
        "the TOML stays on stdout: {good:?}"
    );
    assert!(!good.stderr.contains("warning"), "{good:?}");
    assert!(
        good.stderr
            .contains("verdict:  a Streamable HTTP MCP server"),
        "{good:?}"
    );
    // The probe went to the default MCP path under the upstream URL.
    assert!(server.seen().iter().any(|r| r.method == Method::DELETE));

    let bad = run(port.url()).await.unwrap();
    assert!(bad.status.success(), "a valid configuration: {bad:?}");
    assert!(
        bad.stderr.contains(&format!(
            "warning: the upstream at {}/mcp is not a Streamable HTTP MCP endpoint: connection refused",
            port.url()
        )),
        "{bad:?}"
    );
}

#[tokio::test]
async fn through_holdfast_a_legacy_endpoint_naming_the_upstream_points_at_holdfast() {
    let reserved = Reserved::new();
    let upstream = reserved.url();
    let endpoint: &'static str =
        Box::leak(format!("{upstream}/messages?session_id=1").into_boxed_str());
    let (keep_open, _kept) = mpsc::channel(4);
    let server = Upstream::serve(reserved.listen(), move |seen| {
        let keep_open = keep_open.clone();
        async move {
            if seen.method == Method::POST {
                return response(405, &[("content-type", "text/plain")], "Method Not Allowed");
            }
            // The endpoint event split over two frames, after an event of another kind.
            let (resp, tx) = open_stream(": connected\n\nevent: endpoint\ndata: ");
            let rest = format!("{endpoint}\n\n");
            tx.send(Ok(Frame::data(Bytes::from(rest)))).await.unwrap();
            let _ = keep_open.send(tx).await;
            resp
        }
    });
    let proxy = crate::support::proxy::Holdfast::start(&server.url()).await;
    let report = probe(&proxy.url("/sse")).await;
    assert_eq!(report.verdict.kind, Kind::LegacyServer, "{}", report.text());
    assert!(
        report.verdict.finding.contains(&format!(
            "http://{}/messages?session_id=1 (absolute)",
            proxy.addr
        )),
        "{}",
        report.text()
    );
    // Directly, the server names itself.
    let direct = probe(&format!("{}/sse", server.url())).await;
    assert!(
        direct.verdict.finding.contains(endpoint),
        "{}",
        direct.text()
    );
}
