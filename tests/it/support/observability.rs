//! What holdfast really exports, for the checks of the observability kit (`deploy_alerts.rs`,
//! `deploy_dashboard.rs`, `deploy_metrics.rs`).
//!
//! The names come from a holdfast running in this process: its `/metrics` (OpenMetrics text)
//! declares each metric family with a `# TYPE name type` line, and the query language names a
//! counter's samples `name_total` and a histogram's `name_bucket`, `name_sum` and `name_count`.
//! Every `holdfast_*` identifier in the rules and the dashboard must be one of those, and every
//! label value a selector matches (`outcome="timed_out"`, `reason="horizon_exceeded"`) must
//! appear in holdfast's samples. Some families only appear once something happened, so
//! [`exported`] makes each happen first.
//!
//! promtool (Debian package `prometheus`, which `.ci/run` installs) runs through [`promtool`].

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

use crate::support::files::TempDir;
use crate::support::http::{get, host_of, response, send, ChannelBody, TestBody, Upstream};
use crate::support::process::require_program;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// The alert rules.
pub const ALERTS: &str = "deploy/prometheus/alerts.yaml";
/// promtool unit tests of the alert rules.
pub const ALERT_TESTS: &str = "deploy/prometheus/alerts.test.yaml";
/// The scrape configuration.
pub const PROMETHEUS: &str = "deploy/prometheus/prometheus.yml";
/// The Grafana dashboard.
pub const DASHBOARD: &str = "deploy/grafana/holdfast.json";
/// The data source every panel uses: a dashboard variable, so that import and provisioning
/// both work without editing the file.
pub const DATASOURCE: &str = "${DS_PROMETHEUS}";
/// Labels Prometheus adds to every scraped sample; holdfast does not export them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

// ------------------------------------------------------------------------------------------
// What holdfast exports
// ------------------------------------------------------------------------------------------

/// holdfast's `/metrics`: the type of every family, and the labels of every sample.
pub struct Exported {
    /// Family name (`holdfast_holds`) to type (`counter`, `gauge`, `histogram`).
    pub families: BTreeMap<String, String>,
    /// Sample name (`holdfast_holds_total`) to its label sets.
    pub samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    /// The text, for failure messages.
    pub text: String,
}

impl Exported {
    /// Parses OpenMetrics text.
    pub fn parse(text: &str) -> Exported {
        let mut families = BTreeMap::new();
        let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("`# TYPE name type`");
                families.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with('#') && !line.is_empty() {
                let name_end = line.find(['{', ' ']).expect("a sample line");
                let labels = if line[name_end..].starts_with('{') {
                    let (matchers, _) = parse_braces(&line[name_end..]);
                    matchers.into_iter().map(|m| (m.label, m.value)).collect()
                } else {
                    BTreeMap::new()
                };
                samples
                    .entry(line[..name_end].to_string())
                    .or_default()
                    .push(labels);
            }
        }
        Exported {
            families,
            samples,
            text: text.to_string(),
        }
    }

    /// The family a query-language name belongs to, or why it is not one holdfast exports.
    pub fn family_of(&self, name: &str) -> Result<String, String> {
        let kind = |family: &str| self.families.get(family).map(String::as_str);
        if matches!(kind(name), Some("gauge" | "unknown")) {
            return Ok(name.to_string());
        }
        if let Some(base) = name.strip_suffix("_total") {
            if kind(base) == Some("counter") {
                return Ok(base.to_string());
            }
        }
        // An info metric (`holdfast_build`) is sampled as `name_info`.
        if let Some(base) = name.strip_suffix("_info") {
            if kind(base) == Some("info") {
                return Ok(base.to_string());
            }
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if kind(base) == Some("histogram") {
                    return Ok(base.to_string());
                }
            }
        }
        Err(match kind(name) {
            Some("counter") => format!("{name} is a counter: its samples are {name}_total"),
            Some("histogram") => {
                format!("{name} is a histogram: use {name}_bucket, {name}_sum or {name}_count")
            }
            _ => format!("holdfast exports no {name}"),
        })
    }

    /// Checks one use: the name is exported, and each label value it matches occurs.
    fn check(&self, used: &Use) -> Result<String, String> {
        let family = self.family_of(&used.name)?;
        for m in &used.matchers {
            if TARGET_LABELS.contains(&m.label.as_str()) || m.value.contains('$') {
                // A target label, or a Grafana variable filled in at query time.
                continue;
            }
            let samples = self.samples.get(&used.name).map(Vec::as_slice);
            let Some(samples) = samples.filter(|s| !s.is_empty()) else {
                return Err(format!(
                    "{} matches {}{}\"{}\", but holdfast emitted no {} sample in this test \
                     to check the value against",
                    used.name, m.label, m.op, m.value, used.name
                ));
            };
            for value in m.values() {
                let occurs = samples
                    .iter()
                    .any(|labels| labels.get(&m.label) == Some(&value));
                if !occurs {
                    return Err(format!(
                        "{}: holdfast never exports {}=\"{}\" (its samples: {:?})",
                        used.name, m.label, value, samples
                    ));
                }
            }
        }
        Ok(family)
    }
}

/// A holdfast's `/metrics` once it has met every situation a rule or a panel selects on.
///
/// holdfast creates every label value of its counters at 0 on start, but the test still makes the
/// rarer events happen (a router's 404 passed through on a path the application is not known to
/// serve and past the horizon, a request that gets no response head in time, a response cut off
/// mid-body), so the names it collects come from real samples as well as from the zeros.
pub async fn exported() -> Exported {
    let (bodies_tx, mut bodies) = mpsc::unbounded_channel();
    let upstream = Upstream::start(move |seen| {
        let bodies_tx = bodies_tx.clone();
        async move {
            match seen.uri.as_str() {
                // No response head, ever: holdfast's response timeout answers 502.
                "/mcp/slow" => std::future::pending().await,
                // A response whose body the test feeds, then breaks.
                "/mcp/dies" => {
                    let (tx, rx) = mpsc::channel(1);
                    bodies_tx.send(tx).unwrap();
                    let mut resp = Response::new(TestBody::new(ChannelBody(rx)));
                    resp.headers_mut()
                        .insert("content-type", "application/json".parse().unwrap());
                    resp
                }
                // Traefik's route-missing 404.
                _ => response(
                    404,
                    &[
                        ("content-type", "text/plain; charset=utf-8"),
                        ("x-content-type-options", "nosniff"),
                    ],
                    "404 page not found\n",
                ),
            }
        }
    })
    .await;
    let mut raw = raw_config(&upstream.url());
    // Past the horizon from the start: the application has never answered.
    raw.routes.horizon_secs = 1e-6;
    raw.client.response_timeout_secs = 0.2;
    let holdfast = Holdfast::start_with(raw).await;

    // holdfast_router_passthrough_total{reason}: both reasons.
    for path in ["/mcp", "/.well-known/oauth-protected-resource"] {
        let got = within(get(&holdfast.url(path))).await;
        assert_eq!(got.status, 404, "{path}: the router's 404 passes through");
    }
    // holdfast_upstream_failures_total{reason="response_timeout"}.
    let got = within(get(&holdfast.url("/mcp/slow"))).await;
    assert_eq!(got.status, 502);
    // holdfast_response_aborts_total{reason="upstream_error"}: the MCP server dies after the
    // client has read the first chunk.
    let url = holdfast.url("/mcp/dies");
    let resp = within(send(
        Request::get(&url)
            .header("host", host_of(&url))
            .body(Full::default())
            .unwrap(),
    ))
    .await;
    assert_eq!(resp.status(), 200);
    let tx = within(bodies.recv()).await.unwrap();
    let mut body = resp.into_body();
    tx.send(Ok(Frame::data(Bytes::from_static(b"{"))))
        .await
        .unwrap();
    let first = within(body.frame())
        .await
        .expect("a frame")
        .expect("the first chunk");
    assert_eq!(first.into_data().unwrap(), "{");
    tx.send(Err("the MCP server died".into())).await.unwrap();
    assert!(within(body.collect()).await.is_err(), "a broken body");
    // The abort is counted as holdfast lets go of the response, which the client cannot
    // await: poll, with a deadline.
    holdfast
        .metric_until(
            "holdfast_response_aborts_total{reason=\"upstream_error\"}",
            |v| v >= 1.0,
        )
        .await;
    Exported::parse(&holdfast.metrics().await)
}

// ------------------------------------------------------------------------------------------
// Reading PromQL without a PromQL parser
// ------------------------------------------------------------------------------------------

/// One label matcher in a selector.
#[derive(Debug, Clone)]
struct Matcher {
    label: String,
    /// `=`, `!=`, `=~` or `!~`.
    op: String,
    value: String,
}

impl Matcher {
    /// The label values this matcher names: one, or the alternatives of a regex made of plain
    /// names (`queue_full|body_too_large`).
    fn values(&self) -> Vec<String> {
        if !self.op.contains('~') {
            return vec![self.value.clone()];
        }
        assert!(
            self.value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|'),
            "{}{}\"{}\": only alternatives of plain values can be checked",
            self.label,
            self.op,
            self.value
        );
        self.value.split('|').map(str::to_string).collect()
    }
}

/// One use of a holdfast metric: its name and the matchers of its selector.
#[derive(Debug)]
pub struct Use {
    pub name: String,
    matchers: Vec<Matcher>,
}

/// Whether `c` can be part of a metric name.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `holdfast_*` identifier in `text`, with the label matchers that follow it in braces.
pub fn uses(text: &str) -> Vec<Use> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("holdfast_").map(|i| from + i) {
        let starts_name = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !is_name_char(c));
        let end = text[at..]
            .find(|c: char| !is_name_char(c))
            .map_or(text.len(), |i| at + i);
        from = end;
        if !starts_name {
            continue;
        }
        let rest = text[end..].trim_start();
        let matchers = if rest.starts_with('{') {
            parse_braces(rest).0
        } else {
            Vec::new()
        };
        found.push(Use {
            name: text[at..end].to_string(),
            matchers,
        });
    }
    found
}

/// Parses `{label op "value", ...}` at the start of `text`; returns the matchers and the length
/// read. Values may be quoted with `"`, `'` or backquotes, with backslash escapes.
fn parse_braces(text: &str) -> (Vec<Matcher>, usize) {
    let mut chars = text.char_indices().peekable();
    assert_eq!(chars.next().map(|(_, c)| c), Some('{'));
    let mut matchers = Vec::new();
    loop {
        while chars
            .next_if(|(_, c)| c.is_whitespace() || *c == ',')
            .is_some()
        {}
        match chars.peek() {
            Some(&(i, '}')) => return (matchers, i + 1),
            None => panic!("unclosed selector: {text}"),
            _ => {}
        }
        let mut label = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| is_name_char(*c)) {
            label.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut op = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| matches!(c, '=' | '!' | '~')) {
            op.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let quote = match chars.next() {
            Some((_, q @ ('"' | '\'' | '`'))) => q,
            other => panic!("expected a quoted value after {label}{op}, got {other:?}: {text}"),
        };
        let mut value = String::new();
        loop {
            match chars.next() {
                Some((_, '\\')) if quote != '`' => {
                    let (_, escaped) = chars.next().expect("an escaped character");
                    value.push(match escaped {
                        'n' => '\n',
                        other => other,
                    });
                }
                Some((_, c)) if c == quote => break,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value: {text}"),
            }
        }
        assert!(
            !label.is_empty() && matches!(op.as_str(), "=" | "!=" | "=~" | "!~"),
            "not a label matcher: {label}{op}{value:?} in {text}"
        );
        matchers.push(Matcher { label, op, value });
    }
}

/// Checks every use in `text` (from `file`) against `exported`; returns the families used.
pub fn check_uses(exported: &Exported, file: &str, text: &str) -> BTreeSet<String> {
    let found = uses(text);
    assert!(
        !found.is_empty(),
        "{file} uses no holdfast metric: scan broken?"
    );
    let mut families = BTreeSet::new();
    let mut problems = Vec::new();
    for used in &found {
        match exported.check(used) {
            Ok(family) => {
                families.insert(family);
            }
            Err(problem) => problems.push(problem),
        }
    }
    assert!(
        problems.is_empty(),
        "{file}:\n  {}\n--- holdfast's /metrics ---\n{}",
        problems.join("\n  "),
        exported.text
    );
    families
}

#[test]
fn the_scan_reads_names_and_matchers() {
    let found = uses(
        "sum by (le) (rate(holdfast_request_duration_seconds_bucket{instance=~\"$instance\"}[5m]))\n\
         / holdfast_holds_total { outcome =~ 'queue_full|body_too_large', reason!=\"a\\\"b\" }\n\
         my_holdfast_thing holdfast's (holdfast_upstream_up)",
    );
    let names: Vec<&str> = found.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "holdfast_request_duration_seconds_bucket",
            "holdfast_holds_total",
            "holdfast_upstream_up"
        ]
    );
    let m = &found[1].matchers;
    assert_eq!((m[0].label.as_str(), m[0].op.as_str()), ("outcome", "=~"));
    assert_eq!(m[0].values(), ["queue_full", "body_too_large"]);
    assert_eq!((m[1].op.as_str(), m[1].value.as_str()), ("!=", "a\"b"));
    assert_eq!(found[0].matchers[0].value, "$instance");
}

// ------------------------------------------------------------------------------------------
// promtool
// ------------------------------------------------------------------------------------------

/// Runs promtool with `args` in `dir`; fails with its output unless it succeeds.
pub fn promtool(dir: &std::path::Path, args: &[&str]) {
    let promtool = require_program(
        "promtool",
        "apt-get update && apt-get install -y --no-install-recommends prometheus",
    );
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {}: {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a holdfast with a TLS listener exports: the TLS families exist only then.
pub async fn exported_with_tls(upstream: &str) -> Exported {
    let dir = TempDir::new("metrics-tls");
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let mut raw = raw_config(upstream);
    raw.tls.cert = Some(path_of(dir.write("cert.pem", &identity.cert.pem())));
    raw.tls.key = Some(path_of(
        dir.write("key.pem", &identity.signing_key.serialize_pem()),
    ));
    Exported::parse(&Holdfast::start_with(raw).await.metrics().await)
}

fn path_of(path: std::path::PathBuf) -> String {
    path.to_str().unwrap().to_string()
}
