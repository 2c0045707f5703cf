//! What an endpoint's answers mean, and what holdfast would do with each: one flat set of
//! rules, in the order the transport specification asks for (a 400, 404 or 405 to the POST is
//! not a verdict until a GET has looked for a legacy server's `endpoint` event).

use serde::Serialize;

use super::http::{Answer, Failure};
use crate::session::rpc::Reply;
use crate::signature::{Preset, Signature};
use crate::upstream::ConnectErrorKind;

/// The kinds of verdict, each with its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A Streamable HTTP MCP server answered (credentials required counts: it is there).
    McpServer,
    /// A server on the deprecated 2024-11-05 HTTP+SSE transport.
    LegacyServer,
    /// Not an MCP endpoint: a web page, a retired endpoint, an SSE service, a wrong URL.
    NotMcp,
    /// Nothing answers for the MCP server: refused, DNS, TLS, timeout, a router's "missing".
    Outage,
}

impl Kind {
    /// The process exit status (2 is clap's usage error; 1 a failure of the probe itself).
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::McpServer => 0,
            Kind::LegacyServer => 3,
            Kind::NotMcp => 4,
            Kind::Outage => 5,
        }
    }
}

/// The conclusion: what was found, what holdfast would do in front of it, what to do next.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub kind: Kind,
    pub finding: String,
    pub holdfast: String,
    pub next: String,
}

fn verdict(kind: Kind, finding: String, holdfast: &str, next: &str) -> Verdict {
    Verdict {
        kind,
        finding,
        holdfast: holdfast.to_owned(),
        next: next.to_owned(),
    }
}

/// What the answer to the `initialize` POST leads to.
#[derive(Debug)]
pub enum Look {
    /// Decided.
    Done(Verdict),
    /// 401/403 with `WWW-Authenticate`: fetch the protected resource metadata, if named.
    Auth { resource_metadata: Option<String> },
    /// 400, 404 or 405 without HTML: a GET must look for a legacy `endpoint` event.
    TryGet,
    /// The server initialized: its result.
    Initialized(serde_json::Value),
}

/// The POST failed before an answer.
pub fn failed(failure: &Failure, budget_secs: f64) -> Verdict {
    let held = "holdfast would hold the request (it never reached the application) for up to \
                hold.timeout_secs and send it once the server is back, else answer 503 with \
                Retry-After; it never answers 404";
    match failure {
        Failure::Connect { kind, cause } => {
            let (what, next) = match kind {
                ConnectErrorKind::Refused => (
                    "connection refused: nothing listens on that port",
                    "start the server, or check the URL's port",
                ),
                ConnectErrorKind::Dns => (
                    "the name does not resolve",
                    "check the host name (a container's name resolves only on its network)",
                ),
                ConnectErrorKind::Timeout => (
                    "the connection did not complete in time",
                    "check that the host is up and no firewall drops the port",
                ),
                ConnectErrorKind::Unreachable => (
                    "no route to the host",
                    "check the address and the network between",
                ),
                ConnectErrorKind::Tls => return verdict(
                    Kind::Outage,
                    format!("the TLS handshake failed: {cause}"),
                    "holdfast would answer 502 (upstream_tls) and log the cause: the server is \
                         there, but its certificate is not accepted",
                    "give holdfast the CA that signed it (client.ca_file; here --ca-file), or \
                         use the name the certificate is for",
                ),
                ConnectErrorKind::Other => ("the connection failed", "check the URL"),
            };
            verdict(Kind::Outage, format!("{what} ({cause})"), held, next)
        }
        Failure::Timeout => verdict(
            Kind::Outage,
            format!("connected, but no answer to the initialize within {budget_secs} s"),
            "holdfast would wait client.response_timeout_secs for the answer, then answer 502 \
             (response_timeout); it never sends the request twice",
            "check the server's logs: it accepts connections but does not answer",
        ),
        Failure::Protocol(cause) => verdict(
            Kind::NotMcp,
            format!("the answer is not HTTP: {cause}"),
            "holdfast would answer 502 (upstream_protocol)",
            "check the URL's scheme and port: this is not an HTTP server",
        ),
    }
}

/// The answer to the `initialize` POST.
pub fn look(answer: &Answer) -> Look {
    let status = answer.status.as_u16();
    if let Some(found) = router_signature(answer) {
        return Look::Done(found);
    }
    if answer.media_type().as_deref() == Some("text/html") {
        return Look::Done(verdict(
            Kind::NotMcp,
            format!("a web page (text/html, status {status}), not an MCP endpoint"),
            "holdfast would pass it unchanged: it is the server's own answer",
            "find the MCP endpoint's URL in the server's documentation (often /mcp)",
        ));
    }
    if status == 401 || status == 403 {
        return match answer.header("www-authenticate") {
            Some(challenge) => Look::Auth {
                resource_metadata: auth_param(challenge, "resource_metadata"),
            },
            None => Look::Done(verdict(
                Kind::McpServer,
                format!(
                    "{status} without WWW-Authenticate: it wants credentials but does not say \
                     how to get them (a server bug: MCP authorization requires the header)"
                ),
                "holdfast would pass the answer unchanged",
                "send credentials with -H 'Authorization: Bearer ...', and report the missing \
                 header to the server's authors",
            )),
        };
    }
    if status == 410 {
        let message = excerpt(&answer.body);
        return Look::Done(verdict(
            Kind::NotMcp,
            format!("410 Gone: a retired endpoint. It says: {message}"),
            "holdfast would pass it unchanged",
            "use the URL it names, if any",
        ));
    }
    let reply = rpc_reply(answer);
    if answer.status.is_success() {
        return match reply {
            Reply::Result(result) if is_initialize_result(&result) => Look::Initialized(result),
            Reply::Result(result) => Look::Done(not_an_initialize_result(status, &result)),
            Reply::Error(code, message) => Look::Done(refused(code, &message, status)),
            Reply::Nothing => Look::Done(verdict(
                Kind::NotMcp,
                format!("status {status}, but the body is not a JSON-RPC answer"),
                "holdfast would pass it unchanged",
                "check the URL: this answers POSTs, but not as an MCP server",
            )),
        };
    }
    if status == 503 {
        return Look::Done(unavailable(answer));
    }
    if let Reply::Error(code, message) = reply {
        // A JSON-RPC error is a modern server's answer: no legacy server writes one to a POST.
        return Look::Done(refused(code, &message, status));
    }
    match status {
        400 | 404 | 405 => Look::TryGet,
        502..=504 => Look::Done(verdict(
            Kind::Outage,
            format!("{status} from something in between that matches no known router"),
            "holdfast would pass it unchanged (a 5xx is not a 404): to have it held, describe \
             it as a routes.signatures entry",
            "check the proxy in front of the server and the server itself",
        )),
        _ => Look::Done(verdict(
            Kind::NotMcp,
            format!("status {status} to an MCP initialize"),
            "holdfast would pass it unchanged",
            "check the URL",
        )),
    }
}

/// Whether `result` is what an MCP server answers an `initialize` with: it names the protocol
/// version it settled on and itself (`serverInfo`). A JSON-RPC result without them (`{}`, what a
/// catch-all JSON-RPC service answers to anything) proves nothing about MCP.
fn is_initialize_result(result: &serde_json::Value) -> bool {
    result["protocolVersion"].is_string() && result["serverInfo"].is_object()
}

/// A success and a JSON-RPC result that is no initialize result: said as it was seen.
fn not_an_initialize_result(status: u16, result: &serde_json::Value) -> Verdict {
    let mut missing = Vec::new();
    if !result["protocolVersion"].is_string() {
        missing.push("protocolVersion");
    }
    if !result["serverInfo"].is_object() {
        missing.push("serverInfo");
    }
    let seen = excerpt(result.to_string().as_bytes());
    verdict(
        Kind::NotMcp,
        format!(
            "status {status} and a JSON-RPC result to the initialize, but not an MCP \
             server's: it has no {} (the result was {seen})",
            missing.join(" and no ")
        ),
        "holdfast would pass its answers unchanged, but could not carry its sessions: no \
         initialize was answered",
        "check the URL: something answers JSON-RPC here, but not as an MCP server (whose \
         initialize result names its protocolVersion and serverInfo)",
    )
}

/// A 503: the server, or something in front of it, says it is not there now.
fn unavailable(answer: &Answer) -> Verdict {
    let retry = answer
        .header("retry-after")
        .map(|r| format!(", Retry-After {r}"))
        .unwrap_or_default();
    verdict(
        Kind::Outage,
        format!(
            "503{retry}: the server, or a proxy in front of it (holdfast answers so while the \
             backend is missing), says it is unavailable"
        ),
        "holdfast would pass the server's own 503 unchanged; with a JSON-RPC error body \
         clients see the message",
        "probe the MCP server's own address to see what is behind",
    )
}

/// A JSON-RPC error to the initialize.
fn refused(code: i64, message: &str, status: u16) -> Verdict {
    verdict(
        Kind::McpServer,
        format!(
            "an MCP server refused the initialize (status {status}, JSON-RPC error {code}: \
             {message})"
        ),
        "holdfast would pass the answer unchanged",
        "try another --protocol-version, or read the error",
    )
}

/// A router's answer that holdfast recognises.
fn router_signature(answer: &Answer) -> Option<Verdict> {
    let preset = Preset::names()
        .into_iter()
        .filter_map(Preset::from_name)
        .find(|p| {
            let s: Signature = p.signature();
            s.matches(answer.status, &answer.headers, Some(&answer.body))
        })?;
    let signature = preset.signature();
    let holdfast = if signature.replay_safe {
        "holdfast masks it: the request never reached the application, so it is held and sent \
         once the route is back (503 with Retry-After if that takes longer than \
         hold.timeout_secs)"
    } else {
        "holdfast masks it as 503 with Retry-After, and does not send it again (the request may \
         have reached the application)"
    };
    let what = if signature.is_route_missing() {
        "a router answered: route missing (the MCP server's container is gone or not yet \
         routed)"
    } else {
        "a router answered: the MCP server behind it is failing"
    };
    Some(verdict(
        Kind::Outage,
        format!("{what} [{}]", preset.name()),
        holdfast,
        "check the server's container and the router's rule for it",
    ))
}

/// What the GET (`Accept: text/event-stream`) found, after a 400, 404 or 405 to the POST.
pub fn legacy(post_status: u16, get: Result<&Answer, &Failure>) -> Verdict {
    let wrong_url = |found: String| {
        verdict(
            Kind::NotMcp,
            found,
            "holdfast would pass the answers unchanged (a 404 from the server itself is its own)",
            "check the URL: the MCP endpoint is often /mcp, or /sse on legacy servers",
        )
    };
    let answer = match get {
        Ok(a) => a,
        Err(failure) => {
            return wrong_url(format!(
                "the POST got {post_status} and the GET no answer ({})",
                failure_text(failure)
            ))
        }
    };
    let status = answer.status.as_u16();
    if !(answer.status.is_success() && answer.is_event_stream()) {
        return wrong_url(format!(
            "the POST got {post_status} and the GET {status} ({}): no MCP endpoint here",
            answer
                .media_type()
                .unwrap_or_else(|| "no content type".into())
        ));
    }
    match answer.events.iter().find(|e| e.event == "endpoint") {
        Some(endpoint) => {
            let url = endpoint.data.trim();
            let form = if url.contains("://") {
                "absolute"
            } else {
                "relative"
            };
            verdict(
                Kind::LegacyServer,
                format!(
                    "a legacy HTTP+SSE server (2024-11-05 transport): its endpoint event names \
                     {url} ({form})"
                ),
                "holdfast would forward it, but legacy sessions live in the SSE stream: a \
                 restart ends them, and holdfast cannot carry them",
                "upgrade the server to Streamable HTTP, or point clients at the /sse URL with a \
                 client that speaks the legacy transport",
            )
        }
        None => wrong_url(format!(
            "an SSE service, not MCP: the stream sent {} event(s), none of them `endpoint`",
            answer.events.len()
        )),
    }
}

/// A failure in words, for steps after the first.
pub fn failure_text(failure: &Failure) -> String {
    match failure {
        Failure::Connect { kind, cause } => format!("{kind:?}: {cause}").to_lowercase(),
        Failure::Timeout => "no answer in time".into(),
        Failure::Protocol(cause) => cause.clone(),
    }
}

/// The JSON-RPC response in an answer: its body, or the first event of a stream that is one
/// (the parser session continuity uses for its own requests).
pub fn rpc_reply(answer: &Answer) -> Reply {
    crate::session::rpc::reply(answer.is_event_stream(), &answer.body)
}

/// A parameter of a `WWW-Authenticate` challenge (`name="value"` or `name=value`).
pub fn auth_param(challenge: &str, name: &str) -> Option<String> {
    let at = challenge.find(&format!("{name}="))? + name.len() + 1;
    let rest = &challenge[at..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest.split([',', ' ']).next().unwrap_or(""),
    };
    Some(value.to_owned())
}

/// The start of a body as one line of text.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > 200 {
        format!("{}...", line.chars().take(200).collect::<String>())
    } else if line.is_empty() {
        "(empty body)".into()
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_parameters_quoted_or_not() {
        let c = r#"Bearer realm="mcp", resource_metadata="https://a.example/.well-known/oauth-protected-resource", error=invalid_token"#;
        assert_eq!(
            auth_param(c, "resource_metadata").as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource")
        );
        assert_eq!(auth_param(c, "error").as_deref(), Some("invalid_token"));
        assert_eq!(auth_param("Bearer", "resource_metadata"), None);
    }

    #[test]
    fn each_kind_has_its_own_exit_status() {
        let codes = [
            Kind::McpServer,
            Kind::LegacyServer,
            Kind::NotMcp,
            Kind::Outage,
        ]
        .map(Kind::exit_code);
        assert_eq!(codes, [0, 3, 4, 5]);
    }
}
