//! The observability kit: Prometheus alert rules (`deploy/prometheus/`) and the Grafana
//! dashboard (`deploy/grafana/holdfast.json`), checked against what holdfast really exports.
//!
//! The names come from a holdfast running in this process: its `/metrics` (OpenMetrics text)
//! declares each metric family with a `# TYPE name type` line, and the query language names a
//! counter's samples `name_total` and a histogram's `name_bucket`, `name_sum` and `name_count`.
//! Every `holdfast_*` identifier in the rules and the dashboard must be one of those, and every
//! label value a selector matches (`outcome="timed_out"`, `reason="horizon_exceeded"`) must
//! appear in holdfast's samples. Some families only appear once something happened, so the test
//! makes each happen first (see [`exported`]).
//!
//! promtool (Debian package `prometheus`, which `.ci/run` installs) then checks the rules, runs
//! their unit tests (`alerts.test.yaml`), checks `prometheus.yml`, and parses every dashboard
//! query as PromQL.
//!
//! The README's metrics table is checked against the same `/metrics`: names, types, listed label
//! values and bucket boundaries, and no family left out.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::http::{get, host_of, response, send, ChannelBody, TestBody, Upstream};
use crate::support::process::require_program;
use crate::support::proxy::{raw_config, Holdfast};
use crate::support::within;

/// The alert rules.
const ALERTS: &str = "deploy/prometheus/alerts.yaml";
/// promtool unit tests of the alert rules.
const ALERT_TESTS: &str = "deploy/prometheus/alerts.test.yaml";
/// The scrape configuration.
const PROMETHEUS: &str = "deploy/prometheus/prometheus.yml";
/// The Grafana dashboard.
const DASHBOARD: &str = "deploy/grafana/holdfast.json";
/// The data source every panel uses: a dashboard variable, so that import and provisioning
/// both work without editing the file.
const DATASOURCE: &str = "${DS_PROMETHEUS}";
/// Labels Prometheus adds to every scraped sample; holdfast does not export them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

// ------------------------------------------------------------------------------------------
// What holdfast exports
// ------------------------------------------------------------------------------------------

/// holdfast's `/metrics`: the type of every family, and the labels of every sample.
struct Exported {
    /// Family name (`holdfast_holds`) to type (`counter`, `gauge`, `histogram`).
    families: BTreeMap<String, String>,
    /// Sample name (`holdfast_holds_total`) to its label sets.
    samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    /// The text, for failure messages.
    text: String,
}

impl Exported {
    /// Parses OpenMetrics text.
    fn parse(text: &str) -> Exported {
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
    fn family_of(&self, name: &str) -> Result<String, String> {
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
async fn exported() -> Exported {
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
struct Use {
    name: String,
    matchers: Vec<Matcher>,
}

/// Whether `c` can be part of a metric name.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `holdfast_*` identifier in `text`, with the label matchers that follow it in braces.
fn uses(text: &str) -> Vec<Use> {
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
fn check_uses(exported: &Exported, file: &str, text: &str) -> BTreeSet<String> {
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
// Names and label values
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn alert_rules_use_only_what_holdfast_exports() {
    let mut exported = exported().await;
    // The certificate rule watches a TLS family: add a TLS holdfast's export.
    let with_tls = exported_with_tls("http://127.0.0.1:9").await;
    exported.families.extend(with_tls.families);
    exported.samples.extend(with_tls.samples);
    let used = check_uses(&exported, ALERTS, &read_repo(ALERTS));
    for family in [
        "holdfast_upstream_up",
        "holdfast_holds",
        "holdfast_upstream_failures",
        "holdfast_router_passthrough",
        "holdfast_rewrites",
        "holdfast_tls_cert_expiry_timestamp_seconds",
    ] {
        assert!(used.contains(family), "{ALERTS} has no rule on {family}");
    }
    // The unit tests' input series must be real series too (their label values are made-up
    // data, so only the names are checked).
    for used in uses(&read_repo(ALERT_TESTS)) {
        if let Err(problem) = exported.family_of(&used.name) {
            panic!("{ALERT_TESTS}: {problem}");
        }
    }
}

/// Every string in a JSON document.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The dashboard, parsed.
fn dashboard() -> Value {
    serde_json::from_str(&read_repo(DASHBOARD)).expect("the dashboard is JSON")
}

#[tokio::test]
async fn the_dashboard_uses_only_what_holdfast_exports_and_shows_all_of_it() {
    let exported = exported().await;
    let d = dashboard();
    let mut texts: Vec<String> = queries(&d).into_iter().map(|(_, expr)| expr).collect();
    // The variables' queries (`label_values(holdfast_upstream_up, instance)`).
    for variable in d["templating"]["list"].as_array().into_iter().flatten() {
        strings(&variable["query"], &mut texts);
        strings(&variable["definition"], &mut texts);
    }
    let used = check_uses(&exported, DASHBOARD, &texts.join("\n"));
    // A metric nobody can see is a metric nobody watches: when holdfast grows one, it gets a
    // panel here.
    let missing: Vec<&String> = exported
        .families
        .keys()
        .filter(|f| f.starts_with("holdfast_") && !used.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} shows nothing of {missing:?}"
    );
}

// ------------------------------------------------------------------------------------------
// The dashboard's shape
// ------------------------------------------------------------------------------------------

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Every query: panel targets and annotation queries, with where they are.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("panel {:?} {}", panel["title"], target["refId"]),
                target["expr"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = annotation["expr"].as_str() {
            out.push((
                format!("annotation {:?}", annotation["name"]),
                expr.to_string(),
            ));
        }
    }
    out
}

#[test]
fn the_dashboard_is_a_grafana_model_on_a_datasource_variable() {
    let d = dashboard();
    assert_eq!(d["uid"], "holdfast");
    assert!(d["title"].is_string());
    assert!(
        d["schemaVersion"].as_u64().unwrap() >= 36,
        "a current JSON model"
    );

    // The data source is a variable of type `datasource`, so the file imports and provisions
    // as it is, on whatever Prometheus the Grafana has.
    let variables = d["templating"]["list"].as_array().expect("templating.list");
    let ds = variables
        .iter()
        .find(|v| v["name"] == "DS_PROMETHEUS")
        .expect("a DS_PROMETHEUS variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    for v in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"]["uid"], DATASOURCE, "variable {}", v["name"]);
    }

    let mut ids = BTreeSet::new();
    let mut rows = 0;
    for panel in panels(&d) {
        let title = &panel["title"];
        assert!(
            title.as_str().is_some_and(|t| !t.is_empty()),
            "a panel without a title"
        );
        assert!(
            ids.insert(panel["id"].as_u64().expect("a numeric id")),
            "duplicate id {}",
            panel["id"]
        );
        let pos = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(pos[key].is_u64(), "{title}: gridPos.{key}");
        }
        assert!(
            pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24,
            "{title}: wider than the grid"
        );
        if panel["type"] == "row" {
            rows += 1;
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], DATASOURCE, "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for target in targets {
            assert_eq!(target["datasource"]["uid"], DATASOURCE, "{title}");
            assert!(
                refs.insert(target["refId"].as_str().expect("a refId")),
                "{title}: refIds"
            );
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| !e.trim().is_empty()),
                "{title}: expr"
            );
        }
    }
    assert!(rows >= 2, "panels grouped in rows");
    for (source, expr) in queries(&d) {
        assert!(!expr.is_empty(), "{source}: empty query");
    }
}

// ------------------------------------------------------------------------------------------
// promtool
// ------------------------------------------------------------------------------------------

/// Runs promtool with `args` in `dir`; fails with its output unless it succeeds.
fn promtool(dir: &std::path::Path, args: &[&str]) {
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

#[test]
fn promtool_accepts_the_rules_and_they_fire_as_tested() {
    let dir = repo_path("deploy/prometheus");
    promtool(&dir, &["check", "rules", "alerts.yaml"]);
    promtool(&dir, &["test", "rules", "alerts.test.yaml"]);
    // The scrape configuration, and the rule files it loads.
    promtool(&dir, &["check", "config", "prometheus.yml"]);
    assert!(read_repo(PROMETHEUS).contains("job_name: holdfast"));
}

/// The runbook's one step that sets the base of every `runbook_url` (holdfast has no published
/// documentation URL): run as written, it leaves rules promtool accepts, each linking its own
/// section under the new base.
#[test]
fn the_runbook_base_is_set_in_one_step() {
    let runbook = read_repo("docs/runbook.md");
    let sed = runbook
        .lines()
        .find_map(|l| {
            let at = l.find("`sed -i ")?;
            let rest = &l[at + 1..];
            Some(rest[..rest.find('`')?].to_owned())
        })
        .expect("docs/runbook.md shows the sed that sets the base");
    let base = "https://docs.example.org/holdfast/";
    assert!(sed.contains(base), "{sed}");
    let dir = TempDir::new("runbook-base");
    dir.write("alerts.yaml", &read_repo(ALERTS));
    let out = Command::new("sh")
        .arg("-c")
        .arg(&sed)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{sed}: {out:?}");
    promtool(dir.path(), &["check", "rules", "alerts.yaml"]);
    let rewritten = std::fs::read_to_string(dir.path().join("alerts.yaml")).unwrap();
    let urls: Vec<&str> = rewritten
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert_eq!(urls.len(), rules().len(), "every alert has one runbook_url");
    for (url, (name, _, _)) in urls.iter().zip(rules()) {
        assert_eq!(
            url.trim_matches('"'),
            format!("{base}runbook.md#{}", name.to_lowercase())
        );
    }
}

/// A dashboard query as Prometheus receives it: Grafana's variables filled in.
fn as_prometheus_sees_it(source: &str, expr: &str) -> String {
    let values = [
        ("__rate_interval", "1m"),
        ("__interval", "1m"),
        ("__range", "1h"),
        ("instance", ".*"),
    ];
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').expect("a closing brace");
                (&braced[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !is_name_char(c))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{source}: unknown variable ${name}"))
            .1;
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Every dashboard query parses as PromQL: promtool checks them as recording rules.
#[test]
fn promtool_parses_every_dashboard_query() {
    let queries = queries(&dashboard());
    assert!(queries.len() >= 15);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (source, expr)) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      # {source}\n      - record: dashboard_query_{n}\n        expr: |\n"
        ));
        for line in as_prometheus_sees_it(source, expr).lines() {
            rules.push_str(&format!("          {line}\n"));
        }
    }
    let dir = TempDir::new("dashboard-queries");
    dir.write("queries.yaml", &rules);
    promtool(dir.path(), &["check", "rules", "queries.yaml"]);
}

// ------------------------------------------------------------------------------------------
// holdfast's own footprint
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn metrics_carry_the_build_and_the_process_footprint() {
    let proxy = Holdfast::start("http://127.0.0.1:1").await;
    let text = proxy.metrics().await;
    // Read from /proc/self: holdfast runs in this test process, so these are its figures.
    let rss = crate::support::proxy::metric_value(&text, "process_resident_memory_bytes");
    assert!(rss > 1024.0 * 1024.0, "{rss}");
    let fds = crate::support::proxy::metric_value(&text, "process_open_fds");
    let max = crate::support::proxy::metric_value(&text, "process_max_fds");
    assert!(fds >= 3.0 && max >= fds, "{fds} of {max}");
    // CPU time moves: after this thread burns some, a second look shows more.
    let cpu = crate::support::proxy::metric_value(&text, "process_cpu_seconds_total");
    let burn = std::time::Instant::now();
    let mut x = 0u64;
    while burn.elapsed() < std::time::Duration::from_millis(200) {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    let again =
        crate::support::proxy::metric_value(&proxy.metrics().await, "process_cpu_seconds_total");
    assert!(again > cpu, "process_cpu_seconds_total {cpu} then {again}");
    let start = crate::support::proxy::metric_value(&text, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(start <= now && start > now - 600.0, "{start} vs {now}");

    // The version, and the commit this checkout is at.
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs")
        .stdout;
    let commit = String::from_utf8(commit).unwrap().trim().to_string();
    let series = format!(
        "holdfast_build_info{{version=\"{}\",commit=\"{commit}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        crate::support::proxy::metric_value(&text, &series),
        1.0,
        "{text}"
    );
}

/// Each rule of `alerts.yaml`: its name, its expression (folded onto one line) and its
/// `runbook_url`. A scan of the file's own layout, which the rules keep.
fn rules() -> Vec<(String, String, Option<String>)> {
    let text = read_repo(ALERTS);
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim().strip_prefix("- alert: ") else {
            continue;
        };
        let rest = &lines[i + 1..];
        let end = rest
            .iter()
            .position(|l| l.trim().starts_with("- alert: "))
            .unwrap_or(rest.len());
        let rule = &rest[..end];
        let at = rule
            .iter()
            .position(|l| l.trim().starts_with("expr:"))
            .expect("every rule has an expr");
        let first = rule[at].trim().trim_start_matches("expr:").trim();
        let expr = if first == ">-" {
            let indent = |l: &str| l.len() - l.trim_start().len();
            let base = indent(rule[at]);
            rule[at + 1..]
                .iter()
                .take_while(|l| indent(l) > base)
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            first.to_owned()
        };
        let url = rule.iter().find_map(|l| {
            l.trim()
                .strip_prefix("runbook_url: ")
                .map(|u| u.trim_matches('"').to_owned())
        });
        rules.push((name.to_owned(), expr, url));
    }
    rules
}

#[test]
fn every_alert_links_its_runbook_section_and_the_section_shows_its_expression() {
    let runbook = read_repo("docs/runbook.md");
    let rules = rules();
    assert_eq!(rules.len(), 10, "{rules:?}");
    for (name, expr, url) in rules {
        let url = url.unwrap_or_else(|| panic!("{name} has no runbook_url"));
        // GitHub's (and most renderers') anchor of a heading `## Name` is its lower case.
        assert_eq!(
            url,
            format!("docs/runbook.md#{}", name.to_lowercase()),
            "{name}"
        );
        let heading = format!("\n## {name}\n");
        let at = runbook
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/runbook.md has no section {name}"));
        let section = &runbook[at + heading.len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        assert!(
            section.contains(&format!("`{expr}`")),
            "the runbook's {name} does not show the rule's expression `{expr}`:\n{section}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// The README's metrics table
// ------------------------------------------------------------------------------------------

/// One `holdfast_*` row of the README's metrics table.
#[derive(Debug)]
struct DocumentedMetric {
    /// The name as written (`holdfast_holds_total`).
    name: String,
    /// `counter`, `gauge`, `histogram`, or `info`.
    kind: String,
    /// Each label the row lists, with the values it names in backticks (none for a label whose
    /// values are not listed, such as `status`).
    labels: Vec<(String, Vec<String>)>,
    /// A histogram's bucket boundaries, in seconds.
    buckets: Vec<f64>,
}

/// The backticked words of `text`, in order.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `text` without its parenthesized asides.
fn outside_parentheses(text: &str) -> String {
    let mut depth = 0usize;
    text.chars()
        .filter(|&c| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// "Buckets: 1, 2.5, 5 ms, 1, 30 s" in seconds; empty when the text names no buckets.
fn documented_buckets(meaning: &str) -> Vec<f64> {
    let Some((_, list)) = meaning.split_once("Buckets: ") else {
        return Vec::new();
    };
    let mut seconds = Vec::new();
    let mut pending = Vec::new();
    for token in list.split(", ") {
        let (number, unit) = match token.split_once(' ') {
            Some((n, unit)) => (n, Some(unit.trim_end_matches(['.', ' ']))),
            None => (token, None),
        };
        pending.push(
            number
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{token:?}")),
        );
        if let Some(unit) = unit {
            let scale = match unit {
                "ms" => 0.001,
                "s" => 1.0,
                other => panic!("unknown bucket unit {other:?} in {meaning:?}"),
            };
            seconds.extend(pending.drain(..).map(|n| n * scale));
        }
    }
    assert!(pending.is_empty(), "buckets without a unit: {meaning:?}");
    seconds
}

/// What a holdfast with a TLS listener exports: the TLS families exist only then.
async fn exported_with_tls(upstream: &str) -> Exported {
    let dir = TempDir::new("metrics-tls");
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let mut raw = raw_config(upstream);
    raw.tls.cert = Some(path_of(dir.write("cert.pem", &identity.cert.pem())));
    raw.tls.key = Some(path_of(
        dir.write("key.pem", &identity.signing_key.serialize_pem()),
    ));
    Exported::parse(&Holdfast::start_with(raw).await.metrics().await)
}

/// The `holdfast_*` rows of the table under `# Metrics` in docs/metrics.md.
fn documented_metrics() -> Vec<DocumentedMetric> {
    let readme = read_repo("docs/metrics.md");
    let section = readme
        .split_once("\n## Metrics\n")
        .expect("a Metrics section")
        .1;
    section
        .lines()
        .skip_while(|l| !l.starts_with("| metric |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            // Only the last cell (the meaning) may hold a `|` of its own.
            let cells: Vec<&str> = row
                .trim_matches('|')
                .splitn(4, '|')
                .map(str::trim)
                .collect();
            let name = backticked(cells[0]).into_iter().next()?;
            if !name.starts_with("holdfast_") {
                return None;
            }
            let kind = cells[1].split(' ').next().unwrap().to_string();
            let labels = cells[2]
                .split("; ")
                .filter(|part| !part.is_empty())
                .flat_map(|part| {
                    // "`reason`: `a`, `b`" names values; "`method` (GET, ...), `status`" names
                    // labels only.
                    match part.split_once("`: ") {
                        Some((label, values)) => {
                            vec![(
                                backticked(&format!("{label}`"))[0].clone(),
                                backticked(values),
                            )]
                        }
                        None => backticked(&outside_parentheses(part))
                            .into_iter()
                            .map(|label| (label, Vec::new()))
                            .collect(),
                    }
                })
                .collect();
            Some(DocumentedMetric {
                name,
                kind,
                labels,
                buckets: documented_buckets(cells[3]),
            })
        })
        .collect()
}

fn path_of(path: std::path::PathBuf) -> String {
    path.to_str().unwrap().to_string()
}

/// The family a documented name belongs to: a counter's name carries `_total`, an info's `_info`.
fn doc_family(doc: &DocumentedMetric) -> String {
    let suffix = match doc.kind.as_str() {
        "counter" => "_total",
        "info" => "_info",
        _ => "",
    };
    doc.name
        .strip_suffix(suffix)
        .unwrap_or_else(|| panic!("README: a {} named {}", doc.kind, doc.name))
        .to_string()
}

/// The README's metrics table says what `/metrics` serves: every `holdfast_*` family with its
/// type, every label value it lists (pre-created, so present from the start), every histogram's
/// buckets; and it lists every family holdfast exports. `OTHER` stands for any method outside
/// the listed ones.
#[tokio::test]
async fn the_readme_metrics_table_is_what_holdfast_exports() {
    let upstream =
        Upstream::start(|_| async { response(200, &[("content-type", "text/plain")], "ok") }).await;
    let holdfast = Holdfast::start(&upstream.url()).await;
    // A method outside the listed ones is counted as OTHER.
    let url = holdfast.url("/mcp");
    let got = crate::support::http::call(
        Request::builder()
            .method("PROPFIND")
            .uri(&url)
            .header("host", host_of(&url))
            .body(Full::default())
            .unwrap(),
    )
    .await;
    assert_eq!(got.status, 200);
    let plain = Exported::parse(&holdfast.metrics().await);
    let with_tls = exported_with_tls(&upstream.url()).await;
    let text = &plain.text;
    assert_eq!(
        crate::support::proxy::metric_value(
            text,
            "holdfast_requests_total{method=\"OTHER\",status=\"200\"}"
        ),
        1.0
    );

    let documented = documented_metrics();
    assert!(documented.len() >= 20, "{documented:#?}");
    for doc in &documented {
        let exported = if doc.name.starts_with("holdfast_tls_") {
            &with_tls
        } else {
            &plain
        };
        let text = &exported.text;
        let family = doc_family(doc);
        assert_eq!(
            exported.families.get(&family),
            Some(&doc.kind),
            "README: {} is a {}",
            doc.name,
            doc.kind
        );
        let sample = if doc.kind == "histogram" {
            format!("{}_bucket", doc.name)
        } else {
            doc.name.clone()
        };
        let samples = exported
            .samples
            .get(&sample)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (label, values) in &doc.labels {
            assert!(
                samples.iter().any(|s| s.contains_key(label)),
                "{}: no sample with label {label}:\n{text}",
                doc.name
            );
            for value in values {
                // `resources/*`: the family of methods under that prefix.
                let matches = |v: &String| match value.strip_suffix('*') {
                    Some(prefix) => v.starts_with(prefix),
                    None => v == value,
                };
                assert!(
                    samples.iter().any(|s| s.get(label).is_some_and(matches)),
                    "{}: no {label}=\"{value}\" sample:\n{text}",
                    doc.name
                );
            }
        }
        if doc.kind == "histogram" {
            let exported_buckets: Vec<f64> = samples
                .iter()
                .filter_map(|s| s.get("le"))
                .filter(|le| *le != "+Inf")
                .map(|le| le.parse().unwrap())
                .collect();
            assert!(
                !doc.buckets.is_empty(),
                "{}: buckets not documented",
                doc.name
            );
            assert_eq!(exported_buckets.len(), doc.buckets.len(), "{}", doc.name);
            for (got, want) in exported_buckets.iter().zip(&doc.buckets) {
                assert!(
                    (got - want).abs() < 1e-9,
                    "{}: buckets {exported_buckets:?}, README {:?}",
                    doc.name,
                    doc.buckets
                );
            }
        }
    }
    // And every holdfast family is in the table.
    let named: BTreeSet<String> = documented.iter().map(doc_family).collect();
    for family in with_tls.families.keys() {
        if family.starts_with("holdfast_") {
            assert!(
                named.contains(family),
                "{family} is not in the README's table"
            );
        }
    }
}
