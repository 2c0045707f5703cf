//! The probe's report: one line per step and the verdict, as text or as one JSON document.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::http::Answer;
use super::verdict::Verdict;

/// Headers worth showing when a step's answer carries them.
const SHOWN: [&str; 5] = [
    "mcp-session-id",
    "www-authenticate",
    "retry-after",
    "location",
    "mcp-protocol-version",
];

/// One request the probe made.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// What it was for: `initialize`, `legacy GET`, `tools/list`...
    pub step: String,
    pub method: String,
    pub url: String,
    pub status: Option<u16>,
    pub content_type: Option<String>,
    /// The headers that mattered, as received.
    pub headers: BTreeMap<String, String>,
    pub ms: f64,
    /// What this step showed, in a few words.
    pub note: String,
}

impl Step {
    /// A step that got `answer`.
    pub fn answered(step: &str, method: &str, url: &str, answer: &Answer, note: String) -> Step {
        let headers = SHOWN
            .iter()
            .filter_map(|name| Some((name.to_string(), answer.header(name)?.to_owned())))
            .collect();
        Step {
            step: step.into(),
            method: method.into(),
            url: url.into(),
            status: Some(answer.status.as_u16()),
            content_type: answer.media_type(),
            headers,
            ms: round_ms(answer.ms),
            note,
        }
    }

    /// A step that got no answer.
    pub fn failed(step: &str, method: &str, url: &str, ms: f64, note: String) -> Step {
        Step {
            step: step.into(),
            method: method.into(),
            url: url.into(),
            status: None,
            content_type: None,
            headers: BTreeMap::new(),
            ms: round_ms(ms),
            note,
        }
    }
}

fn round_ms(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// What a Streamable HTTP server told about itself.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Server {
    pub protocol_version: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
    /// It assigned a session id (holdfast can carry the session across its restarts).
    pub stateful: bool,
    /// `json` or `sse`: how it answered the initialize.
    pub answers: String,
    pub tools: Option<Tools>,
    /// Every list the server offers, as holdfast digests it to tell a deploy's changes
    /// (docs/sessions.md "When the server changed"): the same digest after a restart means
    /// nothing to tell.
    pub lists: Vec<Listed>,
}

/// One list the server offers, read whole.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// `tools`, `prompts`, `resources` or `resource_templates`.
    pub list: &'static str,
    pub items: usize,
    /// `None` when it could not be read whole.
    pub digest: Option<String>,
}

impl Listed {
    /// `list`, which the server did not answer page by page.
    pub fn unread(list: crate::session::told::List) -> Listed {
        Listed {
            list: list.as_str(),
            items: 0,
            digest: None,
        }
    }
}

/// The `tools/list` summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tools {
    pub count: usize,
    /// The first page had a `nextCursor`.
    pub paginates: bool,
    pub read_only_hint: usize,
    pub idempotent_hint: usize,
    /// As holdfast digests it (`None` when the pages ran past the probe's limit).
    #[serde(skip)]
    pub listed: Option<Listed>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub url: String,
    pub steps: Vec<Step>,
    pub server: Option<Server>,
    /// Which protocol eras the endpoint answered.
    pub eras: super::era::Eras,
    /// What the era bridge would do for its clients ([`super::era::Eras::bridge`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<&'static str>,
    pub verdict: Verdict,
    pub exit_code: u8,
    /// For an MCP server: the longest recreation each kind of client survives through holdfast
    /// (empty otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<Gap>,
}

/// How long a kind of client, or a router in front, waits for a held call, and so the longest
/// recreation it survives with a given hold (docs/holding.md "How long the client waits").
#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    pub client: &'static str,
    /// Seconds it waits for a call's answer by default.
    pub waits_secs: u64,
    /// Seconds of recreation it survives: the hold, or its own wait if that is shorter.
    pub survives_secs: f64,
}

/// What each kind of client waits, by default, read from the sources of the versions the suite
/// runs.
const PATIENCE: [(&str, u64); 3] = [
    (
        "the TypeScript SDK client (and mcp-remote's, which waits as its client does)",
        60,
    ),
    ("the Python SDK and fastmcp clients", 300),
    ("nginx in front, by default", 60),
];

/// The gaps each kind of client survives through a hold of `hold`.
pub fn gaps(hold: std::time::Duration) -> Vec<Gap> {
    PATIENCE
        .iter()
        .map(|&(client, waits_secs)| Gap {
            client,
            waits_secs,
            survives_secs: hold.as_secs_f64().min(waits_secs as f64),
        })
        .collect()
}

impl Report {
    /// The text form: a line per step, then the verdict.
    pub fn text(&self) -> String {
        let mut out = format!("holdfast probe {}\n", self.url);
        for s in &self.steps {
            let status = s.status.map_or("---".to_string(), |c| c.to_string());
            let _ = write!(
                out,
                "  {:<6} {:<26} {status:>3} {:<18} {:>8.1} ms",
                s.method,
                s.step,
                s.content_type.as_deref().unwrap_or("-"),
                s.ms
            );
            for (name, value) in &s.headers {
                let _ = write!(out, "  {name}: {value}");
            }
            if !s.note.is_empty() {
                let _ = write!(out, "  {}", s.note);
            }
            out.push('\n');
        }
        if let Some(server) = &self.server {
            let _ = writeln!(out, "server:   {}", server_line(server));
            let _ = writeln!(out, "eras:     {}", self.eras.line());
        }
        if let Some(line) = self.server.as_ref().and_then(|s| lists_line(&s.lists)) {
            let _ = writeln!(out, "lists:    {line}");
        }
        if !self.gaps.is_empty() {
            let each: Vec<String> = (self.gaps.iter())
                .map(|g| {
                    format!(
                        "{} (waits {} s): up to {} s",
                        g.client, g.waits_secs, g.survives_secs
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "gaps:     a recreation survived through holdfast: {}",
                each.join("; ")
            );
        }
        if let Some(bridge) = self.bridge {
            let _ = writeln!(out, "bridge:   {bridge}");
        }
        let _ = writeln!(out, "verdict:  {}", self.verdict.finding);
        let _ = writeln!(out, "holdfast: {}", self.verdict.holdfast);
        let _ = writeln!(out, "next:     {}", self.verdict.next);
        out
    }
}

fn server_line(s: &Server) -> String {
    let mut line = format!(
        "{} {}, protocol {}, {}, answers as {}",
        s.name.as_deref().unwrap_or("(unnamed)"),
        s.version.as_deref().unwrap_or(""),
        s.protocol_version.as_deref().unwrap_or("?"),
        if s.stateful {
            "stateful (session id)"
        } else {
            "stateless"
        },
        s.answers
    );
    if let Some(t) = &s.tools {
        let _ = write!(
            line,
            "; {} tools ({} readOnlyHint, {} idempotentHint){}",
            t.count,
            t.read_only_hint,
            t.idempotent_hint,
            if t.paginates { ", paginated" } else { "" }
        );
    }
    line
}

/// The lists' digests on one line (`None` without any).
fn lists_line(lists: &[Listed]) -> Option<String> {
    let each: Vec<String> = lists
        .iter()
        .map(|l| match &l.digest {
            Some(d) => format!("{} {} ({} items)", l.list, d, l.items),
            None => format!("{} unreadable", l.list),
        })
        .collect();
    (!each.is_empty()).then(|| each.join(", "))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_client_survives_the_hold_or_its_own_wait_whichever_is_shorter() {
        let survived = |hold: u64| -> Vec<f64> {
            super::gaps(Duration::from_secs(hold))
                .iter()
                .map(|g| g.survives_secs)
                .collect()
        };
        assert_eq!(survived(50), [50.0, 50.0, 50.0]);
        assert_eq!(survived(120), [60.0, 120.0, 60.0]);
    }
}
