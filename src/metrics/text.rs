//! The two text formats `/metrics` speaks: OpenMetrics, what prometheus-client writes and
//! Prometheus asks for, and the Prometheus text format 0.0.4, for every other reader (`promtool
//! check metrics`, `curl`, older scrapers, exporters' parsers) that does not ask for
//! OpenMetrics and fails on it (`unknown metric type "info"`).
//!
//! The 0.0.4 text is made from the OpenMetrics text, line by line, rather than by a second
//! encoder: the samples are the same, only the metadata differs. In 0.0.4 a family's `HELP` and
//! `TYPE` name the sample (`holdfast_outages_total`, where OpenMetrics names the family
//! `holdfast_outages`), there is no `info` type (an info metric is a gauge named `_info`), no
//! `unknown` (`untyped`), no `UNIT`, no exemplars, no `_created` samples and no `# EOF`.

use std::collections::HashMap;

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` asks for OpenMetrics (with a quality above 0): Prometheus
/// always does. Anything else, no `Accept` included, gets the 0.0.4 text.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>() == Ok(0.0)
                })
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    })
}

/// The Prometheus 0.0.4 text of `openmetrics`, an OpenMetrics exposition.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    // HELP comes before TYPE: the types are read first, to name each family's HELP line.
    let types: HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = types.get(family).copied().unwrap_or("unknown");
            // 0.0.4 escapes only `\\` and `\n` in HELP; OpenMetrics also `\"`.
            let help = help.replace("\\\"", "\"");
            out.push_str(&format!("# HELP {} {help}\n", sample_name(family, kind)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let text_kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                "info" => "gauge",
                // unknown, gaugehistogram, stateset: 0.0.4 has no word for them.
                _ => "untyped",
            };
            out.push_str(&format!(
                "# TYPE {} {text_kind}\n",
                sample_name(family, kind)
            ));
        } else if line.starts_with('#') {
            // `# EOF`, `# UNIT`: not in 0.0.4.
        } else if !line.is_empty() && !is_created(line, &types) {
            // An exemplar follows ` # ` after the value; 0.0.4 has none.
            let sample = line.split_once(" # ").map_or(line, |(sample, _)| sample);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// The name 0.0.4 gives a family's metadata: its counter's samples end in `_total`, an info
/// metric's in `_info`.
fn sample_name(family: &str, kind: &str) -> String {
    match kind {
        "counter" => format!("{family}_total"),
        "info" => format!("{family}_info"),
        _ => family.to_owned(),
    }
}

/// A counter's `_created` sample (OpenMetrics only: in 0.0.4 it would be a family of its own).
fn is_created(line: &str, types: &HashMap<&str, &str>) -> bool {
    let name = line.split(['{', ' ']).next().unwrap_or_default();
    name.strip_suffix("_created").is_some_and(|family| {
        matches!(
            types.get(family),
            Some(&"counter" | &"histogram" | &"summary")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_and_everyone_else_gets_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(wants_openmetrics(Some("Application/OpenMetrics-Text")));
        for other in [
            None,
            Some("*/*"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0, text/plain"),
        ] {
            assert!(!wants_openmetrics(other), "{other:?}");
        }
    }

    #[test]
    fn the_metadata_is_renamed_and_what_0_0_4_lacks_dropped() {
        let openmetrics = "\
# HELP holdfast_outages Upstream outages opened.
# TYPE holdfast_outages counter
holdfast_outages_total 3
holdfast_outages_created 1700000000.0
# HELP holdfast_build Build \\\"information\\\".
# TYPE holdfast_build info
holdfast_build_info{version=\"0.1.0\"} 1
# HELP x_seconds A histogram.
# TYPE x_seconds histogram
# UNIT x_seconds seconds
x_seconds_bucket{le=\"+Inf\"} 1 # {trace_id=\"a\"} 0.5
x_seconds_sum 0.5
x_seconds_count 1
# TYPE y unknown
y 1
# EOF
";
        let text = to_prometheus_text(openmetrics);
        assert_eq!(
            text,
            "\
# HELP holdfast_outages_total Upstream outages opened.
# TYPE holdfast_outages_total counter
holdfast_outages_total 3
# HELP holdfast_build_info Build \"information\".
# TYPE holdfast_build_info gauge
holdfast_build_info{version=\"0.1.0\"} 1
# HELP x_seconds A histogram.
# TYPE x_seconds histogram
x_seconds_bucket{le=\"+Inf\"} 1
x_seconds_sum 0.5
x_seconds_count 1
# TYPE y untyped
y 1
"
        );
    }
}
