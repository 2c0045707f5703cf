//! The metrics table of docs/metrics.md is checked against `/metrics`: names, types, listed
//! label values and bucket boundaries, and no family left out; and the build and process
//! footprint holdfast exports about itself.

use std::collections::BTreeSet;
use std::process::Command;

use http::Request;
use http_body_util::Full;

use crate::support::files::read_repo;
use crate::support::http::{host_of, response, Upstream};
use crate::support::observability::{exported_with_tls, Exported};
use crate::support::proxy::Holdfast;

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
