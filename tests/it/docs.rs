//! The documentation's own links: every relative link names a file that exists, and every
//! `#anchor` a heading of that file (as GitHub spells anchors). The README links into docs/ and
//! the pages link into each other, so a moved or renamed section must not leave dead links.

use std::path::{Path, PathBuf};

use crate::support::files::{read_repo, repo_path};

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped (hyphens and
/// underscores kept), each space a hyphen.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            out.push(anchor(&line[hashes + 1..]));
        }
    }
    out
}

/// Every `](target)` of a Markdown text.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_owned()))
        .filter(|t| !t.contains(char::is_whitespace))
        .collect()
}

fn documents() -> Vec<String> {
    let mut docs = vec![
        "README.md".to_owned(),
        "CHANGELOG.md".to_owned(),
        "SECURITY.md".to_owned(),
    ];
    // docs/ and its folders (docs/platforms/).
    let mut dirs = vec!["docs".to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(repo_path(&dir)).expect("docs/") {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(format!("{dir}/{name}"));
            } else if name.ends_with(".md") {
                docs.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(docs.iter().any(|d| d.starts_with("docs/platforms/")));
    docs
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_exists() {
    let mut dead = Vec::new();
    for doc in documents() {
        let text = read_repo(&doc);
        let dir = Path::new(&doc).parent().unwrap_or(Path::new(""));
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target: PathBuf = if path.is_empty() {
                PathBuf::from(&doc)
            } else {
                dir.join(path)
            };
            let Ok(target) = repo_path(target.to_str().unwrap()).canonicalize() else {
                dead.push(format!("{doc}: {link} (no such file)"));
                continue;
            };
            if !fragment.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let there = std::fs::read_to_string(&target).unwrap();
                if !anchors(&there).iter().any(|a| a == fragment) {
                    dead.push(format!("{doc}: {link} (no such heading)"));
                }
            }
        }
    }
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn anchors_are_spelled_as_github_spells_them() {
    assert_eq!(anchor("Rollouts and replicas"), "rollouts-and-replicas");
    assert_eq!(
        anchor("Diagnosing an endpoint: `holdfast probe`"),
        "diagnosing-an-endpoint-holdfast-probe"
    );
    assert_eq!(
        anchor("A legacy (2024-11-05 HTTP+SSE) server behind holdfast"),
        "a-legacy-2024-11-05-httpsse-server-behind-holdfast"
    );
    assert_eq!(anchor("Clients → holdfast"), "clients--holdfast");
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## B c\n"),
        ["a", "b-c"]
    );
}

/// Every key of the sample configuration (which sets every key: `config_sample.rs` checks that)
/// has a row in the configuration page, or in the TLS page for the TLS keys.
#[test]
fn every_configuration_key_is_documented() {
    fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
        for (name, value) in table {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                toml::Value::Table(inner) => leaves(&key, inner, out),
                _ => out.push(key),
            }
        }
    }
    let sample: toml::Table = toml::from_str(&read_repo("config/holdfast.toml")).unwrap();
    let mut keys = Vec::new();
    leaves("", &sample, &mut keys);
    assert!(keys.len() >= 40, "{keys:?}");
    let pages = read_repo("docs/configuration.md") + &read_repo("docs/tls.md");
    let rows: Vec<&str> = pages.lines().filter(|l| l.starts_with("| `")).collect();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let cell = format!("`{k}`");
            !rows
                .iter()
                .any(|row| row.split('|').nth(1).is_some_and(|c| c.contains(&cell)))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "keys without a row in docs/configuration.md (or docs/tls.md): {missing:?}"
    );
}

/// A size as the limits table writes it: `4096`, `4096 bytes`, `64 KiB`, `1 MiB`.
fn size(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    Some(match words.next() {
        None | Some("bytes") => n,
        Some("KiB") => n << 10,
        Some("MiB") => n << 20,
        Some(_) => return None,
    })
}

/// A constant's value as its source writes it: a number, `a * b`, `a << b`, or `(u16::MAX - 1)
/// as usize`.
fn constant(source: &str, name: &str) -> Option<u64> {
    let at = source.find(&format!("const {name}: "))?;
    let rest = &source[at..];
    let expr = rest[rest.find('=')? + 1..rest.find(';')?].trim();
    let number = |t: &str| t.trim().replace('_', "").parse::<u64>().ok();
    if let Some((a, b)) = expr.split_once(" * ") {
        return Some(number(a)? * number(b)?);
    }
    if let Some((a, b)) = expr.split_once(" << ") {
        return Some(number(a)? << number(b)?);
    }
    if expr == "(u16::MAX - 1) as usize" {
        return Some(u64::from(u16::MAX) - 1);
    }
    number(expr)
}

/// docs/limits.md's table of fixed limits says what the code does: each row names a constant
/// that exists in the file it names, with the row's value.
#[test]
fn the_fixed_limits_table_matches_the_code() {
    let page = read_repo("docs/limits.md");
    let table = &page[page.find("## Fixed").expect("a Fixed section")..];
    let mut rows = 0;
    for row in table
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("`src/"))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (value, place) = (cells[2], cells[4]);
        let mut ticked = place.split('`').skip(1).step_by(2);
        let (file, name) = (ticked.next().unwrap(), ticked.next().unwrap());
        let source = read_repo(file);
        let actual = constant(&source, name)
            .unwrap_or_else(|| panic!("{file} has no constant {name} the test can read: {row}"));
        let stated = size(value).unwrap_or_else(|| panic!("unreadable value {value:?}: {row}"));
        assert_eq!(stated, actual, "{row}");
        rows += 1;
    }
    assert!(rows >= 15, "only {rows} rows read");
}
