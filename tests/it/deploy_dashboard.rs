//! The Grafana dashboard (`deploy/grafana/holdfast.json`), checked against what holdfast really
//! exports (`support::observability`): its names and label values, its shape as a Grafana model
//! on a data source variable, and every query parsed as PromQL by promtool.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::files::{read_repo, TempDir};
use crate::support::observability::{
    check_uses, exported, is_name_char, promtool, DASHBOARD, DATASOURCE,
};

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
