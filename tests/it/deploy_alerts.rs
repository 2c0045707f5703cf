//! The Prometheus alert rules (`deploy/prometheus/`), checked against what holdfast really
//! exports (`support::observability`); promtool then checks the rules, runs their unit tests
//! (`alerts.test.yaml`) and checks `prometheus.yml`. Every alert links its runbook section.

use std::process::Command;

use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::observability::{
    check_uses, exported, exported_with_tls, promtool, uses, ALERTS, ALERT_TESTS, PROMETHEUS,
};

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
    assert_eq!(rules.len(), 11, "{rules:?}");
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
