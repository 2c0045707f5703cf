//! `holdfast probe URL`: diagnose an MCP endpoint the way the transport specification says
//! to, and say what holdfast would do with each answer.
//!
//! The steps: POST a 2026-07-28 `server/discover`, as dual-era clients do first ([`era`]);
//! POST an `initialize` (each step its own time budget); classify its answer
//! ([`verdict::look`]); a server that answered `server/discover` and refuses the handshake
//! speaks only the final revision; after a 400, 404 or 405 that is not HTML, GET with
//! `Accept: text/event-stream` (a fresh budget) and look for a legacy server's `endpoint`
//! event; after 401/403, fetch the protected resource metadata the challenge names; after a
//! successful initialize, send `notifications/initialized` and `tools/list` (following
//! pages), then DELETE the session the probe opened, so it leaves nothing behind.

pub mod era;
pub mod http;
pub mod report;
pub mod verdict;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ::http::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use ::http::{Method, Uri};
use bytes::Bytes;
use serde_json::{json, Value};

use self::http::{Answer, Client, Outgoing};
use self::report::{Listed, Report, Server, Step, Tools};
use self::verdict::{Kind, Look, Verdict};
use crate::session::told::{List, Listing};
use crate::session::MCP_SESSION_ID;

/// The protocol version asked for unless `--protocol-version` says otherwise.
pub const DEFAULT_PROTOCOL_VERSION: &str = "2025-11-25";

/// Most pages of a list followed.
const MAX_PAGES: u64 = 20;

/// A list read page by page.
struct Paged {
    listed: Listed,
    pages: u64,
}

use crate::http1::names::MCP_PROTOCOL_VERSION;

/// What to probe, and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub url: Uri,
    /// Each step's own budget (connect included).
    pub timeout: Duration,
    /// Sent with every request (`-H`).
    pub headers: HeaderMap,
    pub protocol_version: String,
    /// PEM CA certificates to trust for an `https://` URL instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// The TLS settings to use as they are (`check-config --probe`: the configured upstream's),
    /// instead of `ca_file` or the system's roots.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// holdfast's `hold.timeout_secs` in front of it (`check-config --probe`: the configured
    /// one; else the default): what recreation each kind of client survives.
    pub hold: Duration,
}

impl Options {
    /// Checks the command line's values: an http(s) URL with a host, `Name: value` headers, a
    /// positive timeout.
    pub fn new(
        url: &str,
        timeout_secs: f64,
        headers: &[String],
        protocol_version: String,
        ca_file: Option<PathBuf>,
    ) -> Result<Options, String> {
        let url: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
            return Err(format!(
                "{url} is not an http:// or https:// URL with a host"
            ));
        }
        if !(timeout_secs.is_finite() && timeout_secs > 0.0 && timeout_secs <= 3600.0) {
            return Err("--timeout must be a number of seconds, above 0 and at most 3600".into());
        }
        let mut map = HeaderMap::new();
        for h in headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| format!("-H {h:?}: expected 'Name: value'"))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| format!("-H {h:?}: {:?} is not a header name", name.trim()))?;
            let value = HeaderValue::from_str(value.trim())
                .map_err(|_| format!("-H {h:?}: the value is not a valid header value"))?;
            map.append(name, value);
        }
        Ok(Options {
            url,
            timeout: Duration::from_secs_f64(timeout_secs),
            headers: map,
            protocol_version,
            ca_file,
            tls: None,
            hold: Duration::from_secs_f64(crate::config::defaults::HOLD_TIMEOUT_SECS),
        })
    }
}

/// Runs the probe. Fails only when the probe itself cannot start (TLS trust not loadable).
pub async fn run(opts: &Options) -> Result<Report, String> {
    let tls = tls_config(opts)?;
    let client = Client::new(opts.timeout, tls, opts.headers.clone());
    let mut probe = Probe {
        opts,
        client,
        url: opts.url.to_string(),
        steps: Vec::new(),
        server: None,
        eras: era::Eras::default(),
    };
    let verdict = probe.diagnose().await;
    let gaps = if verdict.kind == Kind::McpServer {
        report::gaps(opts.hold)
    } else {
        Vec::new()
    };
    Ok(Report {
        gaps,
        url: probe.url,
        steps: probe.steps,
        server: probe.server,
        bridge: probe.eras.bridge(),
        eras: probe.eras,
        exit_code: verdict.kind.exit_code(),
        verdict,
    })
}

fn tls_config(opts: &Options) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, String> {
    if opts.url.scheme_str() != Some("https") {
        return Ok(None);
    }
    if let Some(tls) = &opts.tls {
        return Ok(Some(tls.clone()));
    }
    let roots = match &opts.ca_file {
        Some(file) => crate::tls::load_roots(file),
        None => crate::tls::system_roots(),
    }
    .map_err(|e| e.to_string())?;
    Ok(Some(crate::tls::client_config(
        crate::tls::Trust::Roots(roots),
        None,
        false,
    )))
}

struct Probe<'a> {
    opts: &'a Options,
    client: Client,
    url: String,
    steps: Vec<Step>,
    server: Option<Server>,
    eras: era::Eras,
}

impl Probe<'_> {
    async fn diagnose(&mut self) -> Verdict {
        // The final revision first, as dual-era clients ask: a failure to connect ends the
        // probe here as it would at the initialize.
        let discover = era::request(0, "server/discover", json!({}));
        let discovered = match self
            .post(
                "server/discover",
                &discover,
                &era::headers("server/discover"),
            )
            .await
        {
            Ok(answer) => era::discovered(&answer),
            Err(failure) => return verdict::failed(&failure, self.opts.timeout.as_secs_f64()),
        };
        if let Some(step) = self.steps.last_mut() {
            step.note = match &discovered {
                Some(versions) => format!("speaks {}", versions.join(", ")),
                None => "not the 2026-07-28 revision".into(),
            };
        }
        self.eras.discover = discovered;
        let body = json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": self.opts.protocol_version,
                "capabilities": {},
                "clientInfo": {"name": "holdfast-probe", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        let answer = match self.post("initialize", &body, &[]).await {
            Ok(a) => a,
            Err(failure) => return verdict::failed(&failure, self.opts.timeout.as_secs_f64()),
        };
        match verdict::look(&answer) {
            Look::Auth { resource_metadata } => self.auth(&answer, resource_metadata).await,
            Look::Initialized(result) => self.initialized(&answer, &result).await,
            // It answered server/discover and refuses the handshake: the final revision only.
            Look::Done(_) | Look::TryGet if self.eras.discover.is_some() => {
                self.modern_only().await
            }
            Look::Done(v) => v,
            Look::TryGet => self.legacy_get(answer.status.as_u16()).await,
        }
    }

    /// POSTs one JSON-RPC message, recording the step.
    async fn post(
        &mut self,
        step: &str,
        body: &Value,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Result<Answer, http::Failure> {
        let mut headers = vec![
            (
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            ),
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
        ];
        headers.extend_from_slice(extra);
        let out = Outgoing {
            method: Method::POST,
            uri: &self.opts.url,
            headers,
            body: Some(Bytes::from(body.to_string())),
        };
        // An answer on a stream is complete at its JSON-RPC response.
        let is_answer = |e: &http::Event| {
            crate::session::rpc::reply(false, e.data.as_bytes())
                != crate::session::rpc::Reply::Nothing
        };
        self.send(step, out, is_answer).await
    }

    /// Sends one request within the step budget, recording it.
    async fn send(
        &mut self,
        step: &str,
        out: Outgoing<'_>,
        enough: impl FnMut(&http::Event) -> bool,
    ) -> Result<Answer, http::Failure> {
        let method = out.method.to_string();
        let url = out.uri.to_string();
        let started = Instant::now();
        let result = self.client.send(out, self.opts.timeout, enough).await;
        match &result {
            Ok(answer) => {
                let note = if answer.cut_by_budget {
                    "(read until the time budget ran out)".to_owned()
                } else {
                    String::new()
                };
                self.steps
                    .push(Step::answered(step, &method, &url, answer, note));
            }
            Err(failure) => {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let note = verdict::failure_text(failure);
                self.steps.push(Step::failed(step, &method, &url, ms, note));
            }
        }
        result
    }

    /// After a 400, 404 or 405: is it a legacy HTTP+SSE server?
    async fn legacy_get(&mut self, post_status: u16) -> Verdict {
        let out = Outgoing {
            method: Method::GET,
            uri: &self.opts.url,
            headers: vec![(ACCEPT, HeaderValue::from_static("text/event-stream"))],
            body: None,
        };
        let got = self
            .send("legacy GET", out, |e| e.event == "endpoint")
            .await;
        verdict::legacy(post_status, got.as_ref())
    }

    /// 401/403 with a challenge: where the credentials come from.
    async fn auth(&mut self, answer: &Answer, resource_metadata: Option<String>) -> Verdict {
        let status = answer.status.as_u16();
        let challenge = answer.header("www-authenticate").unwrap_or("").to_owned();
        let mut finding = format!("a working MCP server that needs credentials ({status})");
        match resource_metadata {
            None => finding.push_str(&format!(
                "; the challenge names no resource_metadata: {challenge}"
            )),
            Some(url) => {
                let servers = self.authorization_servers(&url).await;
                finding.push_str(&format!("; resource metadata at {url}"));
                match servers {
                    Some(list) if !list.is_empty() => {
                        finding.push_str(&format!("; authorization servers: {}", list.join(", ")))
                    }
                    _ => finding.push_str(" (no authorization_servers read from it)"),
                }
            }
        }
        Verdict {
            kind: Kind::McpServer,
            finding,
            holdfast: "holdfast would pass the 401/403 and WWW-Authenticate unchanged: clients \
                       authenticate through it"
                .into(),
            next: "get a token from the authorization server, then probe again with \
                   -H 'Authorization: Bearer TOKEN'"
                .into(),
        }
    }

    /// The `authorization_servers` of the protected resource metadata at `url`.
    async fn authorization_servers(&mut self, url: &str) -> Option<Vec<String>> {
        let uri = resolve(&self.opts.url, url)?;
        let out = Outgoing {
            method: Method::GET,
            uri: &uri,
            headers: vec![(ACCEPT, HeaderValue::from_static("application/json"))],
            body: None,
        };
        let answer = self.send("resource metadata", out, |_| false).await.ok()?;
        let doc: Value = serde_json::from_slice(&answer.body).ok()?;
        let list = doc["authorization_servers"].as_array()?;
        Some(
            list.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect(),
        )
    }

    /// A server of the 2026-07-28 revision only: its tools, asked that revision's way.
    async fn modern_only(&mut self) -> Verdict {
        let versions = self.eras.discover.clone().unwrap_or_default();
        let tools = self.tools(&era::headers("tools/list"), true).await;
        self.server = Some(Server {
            protocol_version: versions.first().cloned(),
            name: None,
            version: None,
            stateful: false,
            answers: "json".into(),
            lists: tools.iter().filter_map(|t| t.listed.clone()).collect(),
            tools,
        });
        era::modern_only(&versions, self.put_in_front())
    }

    /// What to do next with a working server: holdfast in front of it.
    fn put_in_front(&self) -> String {
        let base = format!(
            "{}://{}",
            self.opts.url.scheme_str().unwrap_or("http"),
            self.opts.url.authority().map_or("", |a| a.as_str())
        );
        format!(
            "put holdfast in front: `holdfast --upstream {base}`, and point clients at holdfast \
             with the same path ({})",
            self.opts.url.path()
        )
    }

    /// A Streamable HTTP server initialized: what it is, its tools, then its session closed.
    async fn initialized(&mut self, answer: &Answer, result: &Value) -> Verdict {
        let session = answer.header(MCP_SESSION_ID.as_str()).map(str::to_owned);
        let version = result["protocolVersion"].as_str().map(str::to_owned);
        self.eras.initialize = version.clone();
        let mut extra = Vec::new();
        if let Some(id) = session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            extra.push((MCP_SESSION_ID, id));
        }
        if let Some(v) = version
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            extra.push((MCP_PROTOCOL_VERSION, v));
        }
        let mut server = Server {
            protocol_version: version,
            name: result["serverInfo"]["name"].as_str().map(str::to_owned),
            version: result["serverInfo"]["version"].as_str().map(str::to_owned),
            stateful: session.is_some(),
            answers: if answer.is_event_stream() {
                "sse"
            } else {
                "json"
            }
            .into(),
            tools: None,
            lists: Vec::new(),
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let _ = self.post("notifications/initialized", &note, &extra).await;
        if result["capabilities"].get("tools").is_some() {
            server.tools = self.tools(&extra, false).await;
            server
                .lists
                .extend(server.tools.iter().filter_map(|t| t.listed.clone()));
        }
        for list in [List::Prompts, List::Resources, List::Templates] {
            if result["capabilities"].get(list.capability()).is_some() {
                let paged = self.pages(list, &extra, false, |_| {}).await;
                server
                    .lists
                    .push(paged.map_or_else(|| Listed::unread(list), |p| p.listed));
            }
        }
        if session.is_some() {
            self.close_session(extra).await;
        }
        let stateful = server.stateful;
        self.server = Some(server);
        let finding = if self.eras.discover.is_some() {
            "a Streamable HTTP MCP server of both eras (server/discover and the initialize \
             handshake)"
        } else {
            "a Streamable HTTP MCP server"
        };
        Verdict {
            kind: Kind::McpServer,
            finding: finding.into(),
            holdfast: if stateful {
                "holdfast would forward it, hold requests through its restarts, and carry its \
                 sessions across them (it forgets them when it restarts; holdfast opens them \
                 again). Tools marked readOnlyHint or idempotentHint are the ones holdfast may \
                 send twice after an ambiguous failure"
            } else {
                "holdfast would forward it and hold requests through its restarts; stateless, so \
                 there are no sessions to carry. Tools marked readOnlyHint or idempotentHint are \
                 the ones holdfast may send twice after an ambiguous failure"
            }
            .into(),
            next: self.put_in_front(),
        }
    }

    /// `tools/list`, page after page (`modern`: as the 2026-07-28 revision asks, with `_meta`).
    async fn tools(&mut self, extra: &[(HeaderName, HeaderValue)], modern: bool) -> Option<Tools> {
        let mut tools = Tools::default();
        let paged = self
            .pages(List::Tools, extra, modern, |tool| {
                tools.count += 1;
                let hint = |name: &str| tool["annotations"][name].as_bool() == Some(true);
                tools.read_only_hint += usize::from(hint("readOnlyHint"));
                tools.idempotent_hint += usize::from(hint("idempotentHint"));
            })
            .await?;
        tools.paginates = paged.pages > 1;
        if let Some(step) = self.steps.last_mut() {
            let pages = if tools.paginates {
                ", over several pages"
            } else {
                ""
            };
            step.note = format!("{} tools{pages}", tools.count);
        }
        tools.listed = Some(paged.listed);
        Some(tools)
    }

    /// `list`, page after page (at most [`MAX_PAGES`]), each item given to `each`, digested as
    /// holdfast digests what a client was told (`None`: a page was not answered with one).
    async fn pages(
        &mut self,
        list: List,
        extra: &[(HeaderName, HeaderValue)],
        modern: bool,
        mut each: impl FnMut(&Value),
    ) -> Option<Paged> {
        let mut listing = Listing::default();
        let mut cursor: Option<String> = None;
        let (mut items, mut pages) = (0, 0);
        while pages < MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let (id, method) = (2 + pages, list.method());
            let body = if modern {
                era::request(id, method, params)
            } else {
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            };
            let answer = self.post(method, &body, extra).await.ok()?;
            let crate::session::rpc::Reply::Result(result) = verdict::rpc_reply(&answer) else {
                return None;
            };
            pages += 1;
            cursor = listing.page(list, &result).ok()?;
            for item in result[list.items()].as_array()? {
                items += 1;
                each(item);
            }
            if cursor.is_none() {
                break;
            }
        }
        let digest = cursor.is_none().then(|| listing.finish().to_string());
        let list = list.as_str();
        Some(Paged {
            listed: Listed {
                list,
                items,
                digest,
            },
            pages,
        })
    }

    /// DELETEs the session the probe opened.
    async fn close_session(&mut self, headers: Vec<(HeaderName, HeaderValue)>) {
        let out = Outgoing {
            method: Method::DELETE,
            uri: &self.opts.url,
            headers,
            body: None,
        };
        if let Ok(answer) = self.send("end session", out, |_| false).await {
            let note = if answer.status == 405 {
                "the server does not let clients end sessions (allowed)"
            } else if answer.status.is_success() {
                "session ended"
            } else {
                "the session was not ended"
            };
            if let Some(step) = self.steps.last_mut() {
                step.note = note.into();
            }
        }
    }
}

/// `reference` against `base` (absolute, or a path on the same origin).
fn resolve(base: &Uri, reference: &str) -> Option<Uri> {
    if reference.contains("://") {
        return reference.parse().ok();
    }
    let path = if reference.starts_with('/') {
        reference.to_owned()
    } else {
        format!("/{reference}")
    };
    Uri::builder()
        .scheme(base.scheme()?.clone())
        .authority(base.authority()?.clone())
        .path_and_query(path)
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_values_are_checked() {
        let ok = Options::new(
            "https://mcp.example/mcp",
            5.0,
            &["Authorization: Bearer x".into(), "X-A:1".into()],
            DEFAULT_PROTOCOL_VERSION.into(),
            None,
        )
        .unwrap();
        assert_eq!(ok.headers["authorization"], "Bearer x");
        assert_eq!(ok.headers["x-a"], "1");
        for (url, timeout, header) in [
            ("ftp://a/b", 5.0, "A: b"),
            ("/just/a/path", 5.0, "A: b"),
            ("http://a/mcp", 0.0, "A: b"),
            ("http://a/mcp", f64::NAN, "A: b"),
            ("http://a/mcp", 5.0, "no colon"),
            ("http://a/mcp", 5.0, "bad name: x"),
        ] {
            let got = Options::new(url, timeout, &[header.into()], "v".into(), None);
            assert!(got.is_err(), "{url} {timeout} {header}");
        }
    }

    #[test]
    fn metadata_urls_resolve_against_the_probed_origin() {
        let base: Uri = "https://mcp.example:8443/mcp?x=1".parse().unwrap();
        assert_eq!(
            resolve(&base, "/.well-known/oauth-protected-resource")
                .unwrap()
                .to_string(),
            "https://mcp.example:8443/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            resolve(&base, "https://auth.example/x")
                .unwrap()
                .to_string(),
            "https://auth.example/x"
        );
    }
}
