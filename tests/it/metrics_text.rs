//! `/metrics` negotiates its format (issue 43): OpenMetrics for a client that asks for it, as
//! Prometheus does, and the Prometheus 0.0.4 text for everyone else, so `promtool check
//! metrics` (which reads only 0.0.4: `unknown metric type "info"` on OpenMetrics) and `curl`
//! get a text they can read.

use std::process::{Command, Stdio};

use crate::support::files::TempDir;
use crate::support::http::{echo, get, get_metrics, post_json, Upstream};
use crate::support::process::require_program;
use crate::support::proxy::{raw_config, Holdfast};

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool_check(text: &str) -> (bool, String) {
    let promtool = require_program(
        "promtool",
        "apt-get update && apt-get install -y --no-install-recommends prometheus",
    );
    let dir = TempDir::new("metrics-text");
    let file = std::fs::File::open(dir.write("metrics.txt", text)).unwrap();
    let out = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::from(file))
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[tokio::test]
async fn metrics_are_openmetrics_when_asked_and_the_0_0_4_text_otherwise() {
    let up = Upstream::start(echo).await;
    let mut raw = raw_config(&up.url());
    raw.routes.behind_router = Some(false);
    let hf = Holdfast::start_with(raw).await;
    // Some traffic, so the histograms have buckets and the request counters labels.
    let got = post_json(
        &hf.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    assert_eq!(got.status, 200);
    let url = format!("http://{}/metrics", hf.admin);

    // No Accept (curl, promtool's readers): the 0.0.4 text, which promtool accepts.
    let plain = get(&url).await;
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = plain.text().to_owned();
    let (ok, said) = promtool_check(&text);
    assert!(ok, "promtool check metrics: {said}\n{text}");
    for line in [
        "# TYPE holdfast_outages_total counter",
        "# HELP holdfast_outages_total ",
        "# TYPE holdfast_build_info gauge",
        "# TYPE holdfast_request_duration_seconds histogram",
        "holdfast_outages_total 0",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(!text.contains("# EOF"), "{text}");
    assert!(!text.contains(" info\n"), "{text}");

    // What Prometheus sends: OpenMetrics, as before.
    let open = get_metrics(&url).await;
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let openmetrics = open.text();
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    assert!(
        openmetrics.contains("# TYPE holdfast_build info"),
        "{openmetrics}"
    );
    assert!(
        openmetrics.contains("# TYPE holdfast_outages counter"),
        "{openmetrics}"
    );
    // The same samples either way.
    let samples = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("holdfast_") && !l.starts_with("holdfast_request_duration"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(samples(&text).len(), samples(openmetrics).len());
}
