//! Logging setup. `log_level` (`--log-level`, the file's key, `HOLDFAST_LOG_LEVEL`) filters when
//! it is said; `RUST_LOG` only over the default (a unit or an image that sets `RUST_LOG` must not
//! make a file's `log_level` do nothing). The format is text or JSON.
//!
//! Every line logged while a request is served names its id (`request_id`): the request's future
//! runs in [`with_request_id`], and the formatter adds the id to a line written inside it. Not a
//! `tracing` span per request: with the fmt subscriber a span costs every request a registry
//! slot, its fields formatted into a string, and the filter's lock at each of its polls (about
//! 2.5k instructions a request, measured with benches/instructions.sh) whether or not anything
//! is logged; a task-local costs a swap at each poll, and the formatting happens only for a
//! line that is written.

mod export;
mod otlp;
pub mod trace;

use std::future::Future;
use std::sync::OnceLock;

use http::HeaderValue;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Replaces the installed subscriber's filter (a reload's `log_level`).
type Refilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// The installed subscriber's filter handle, once [`init`] installed one.
static REFILTER: OnceLock<Refilter> = OnceLock::new();

/// Takes `level` as the filter from now on (a reload), with the same precedence as at start:
/// `said` (configured, not defaulted) decides whatever `RUST_LOG` says; otherwise a `RUST_LOG`
/// that parses wins. Fails when no subscriber of holdfast's is installed (tests, the demo's).
pub fn set_level(level: &str, said: bool) -> Result<(), String> {
    let refilter = REFILTER
        .get()
        .ok_or("no log subscriber of holdfast's is installed")?;
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = match rust_log.as_deref().map(EnvFilter::try_new) {
        Some(Ok(filter)) if !said => filter,
        _ => EnvFilter::try_new(level).map_err(|e| e.to_string())?,
    };
    refilter(filter)
}

/// Installs the global subscriber. Logs go to stderr; stdout stays free for command output.
/// `said`: `level` was configured, not defaulted, and decides whatever `RUST_LOG` says.
pub fn init(format: LogFormat, level: &str, said: bool) {
    if !said {
        return init_with_default(format, level);
    }
    install(format, EnvFilter::new(level));
    if std::env::var("RUST_LOG").is_ok_and(|v| !v.trim().is_empty()) {
        tracing::info!(
            log_level = level,
            "RUST_LOG is set, and log_level, which is configured, decides instead"
        );
    }
}

/// Like [`init`], with `default` as the filter when `RUST_LOG` is not set. A `RUST_LOG` that
/// does not parse is not silently replaced: the default applies, and a warning says so.
pub fn init_with_default(format: LogFormat, default: &str) {
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (filter, unparsed) = match rust_log.as_deref().map(EnvFilter::try_new) {
        Some(Ok(filter)) => (filter, None),
        Some(Err(e)) => (EnvFilter::new(default), Some(e)),
        None => (EnvFilter::new(default), None),
    };
    install(format, filter);
    if let Some(error) = unparsed {
        tracing::warn!(
            rust_log = rust_log.as_deref().unwrap_or_default(),
            %error,
            using = default,
            "RUST_LOG does not parse as a log filter; it is ignored"
        );
    }
}

tokio::task_local! {
    /// The id of the request whose future is being polled.
    static REQUEST_ID: HeaderValue;
}

/// Runs `served` (one request's future) with its `id` named on every line logged inside it.
pub fn with_request_id<F: Future>(
    id: HeaderValue,
    served: F,
) -> tokio::task::futures::TaskLocalFuture<HeaderValue, F> {
    REQUEST_ID.scope(id, served)
}

/// The id of the request being served here, if any: for what logs about it later, outside its
/// future (an answer's body, read on after the future ended).
pub fn request_id() -> Option<HeaderValue> {
    REQUEST_ID.try_with(HeaderValue::clone).ok()
}

/// Logs with `log` as inside the request `id` (from [`request_id`]), when there was one.
pub fn in_request<R>(id: Option<HeaderValue>, log: impl FnOnce() -> R) -> R {
    match id {
        Some(id) => REQUEST_ID.sync_scope(id, log),
        None => log(),
    }
}

/// A line's format, with the request's id added to a line logged while a request is served
/// (unless the line names one itself, as the access log's do): a `request_id` key first in a
/// JSON object, ` request_id=…` last on a text line. Such a line is formatted into a buffer
/// first, without colours.
struct WithRequestId<E>(E);

impl<S, N, E> FormatEvent<S, N> for WithRequestId<E>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    E: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let named = event.metadata().fields().field("request_id").is_some();
        let id = match REQUEST_ID.try_with(HeaderValue::clone) {
            Ok(id) if !named => id,
            _ => return self.0.format_event(ctx, writer, event),
        };
        // Made of visible ASCII (request_id.rs), so this is the whole id.
        let id = id.to_str().unwrap_or_default();
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                // A client's id may hold quotes or backslashes: written as JSON writes a string.
                let id = serde_json::to_string(id).map_err(|_| std::fmt::Error)?;
                write!(writer, "{{\"request_id\":{id},{rest}")
            }
            None => writeln!(writer, "{} request_id={id}", line.trim_end_matches('\n')),
        }
    }
}

fn install(format: LogFormat, filter: EnvFilter) {
    // Colours only for a person at a terminal, never into a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // The filter stays replaceable: SIGHUP reloads log_level.
    match format {
        LogFormat::Text => {
            let builder = builder
                .map_event_format(WithRequestId)
                .with_filter_reloading();
            keep_refilter(builder.reload_handle());
            builder.init()
        }
        LogFormat::Json => {
            let builder = builder
                .json()
                .flatten_event(true)
                .map_event_format(WithRequestId)
                .with_filter_reloading();
            keep_refilter(builder.reload_handle());
            builder.init()
        }
    }
}

/// Keeps `handle` as the installed subscriber's filter handle ([`set_level`]).
fn keep_refilter<S: 'static>(handle: tracing_subscriber::reload::Handle<EnvFilter, S>)
where
    tracing_subscriber::reload::Handle<EnvFilter, S>: Send + Sync,
{
    let _ = REFILTER.set(Box::new(move |f| {
        handle.reload(f).map_err(|e| e.to_string())
    }));
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs a warning outside any request, one inside request `id`, and one inside it that
    /// names its own `request_id`; what the format `json` (or text) wrote.
    fn logged(json: bool, id: &'static str) -> String {
        let lines = Lines::default();
        let writer = {
            let lines = lines.clone();
            move || lines.clone()
        };
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(writer);
        let log = || {
            tracing::warn!("outside");
            in_request(Some(HeaderValue::from_static(id)), || {
                tracing::warn!(n = 1, "inside");
                tracing::warn!(request_id = "its-own", "named");
            });
        };
        if json {
            let subscriber = builder
                .json()
                .flatten_event(true)
                .map_event_format(WithRequestId)
                .finish();
            tracing::subscriber::with_default(subscriber, log);
        } else {
            let subscriber = builder.map_event_format(WithRequestId).finish();
            tracing::subscriber::with_default(subscriber, log);
        }
        let bytes = lines.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_text_line_logged_inside_a_request_ends_with_its_id() {
        let text = logged(false, "abc-123");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(!lines[0].contains("request_id"), "{text}");
        assert!(
            lines[1].ends_with("inside n=1 request_id=abc-123"),
            "{text}"
        );
        assert!(lines[2].contains("request_id=\"its-own\""), "{text}");
        assert!(!lines[2].contains("abc-123"), "{text}");
    }

    #[test]
    fn a_json_line_logged_inside_a_request_has_its_id_escaped_as_json() {
        let text = logged(true, r#"q"u\o"#);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].get("request_id").is_none(), "{text}");
        assert_eq!(lines[1]["request_id"], r#"q"u\o"#, "{text}");
        assert_eq!(lines[1]["n"], 1, "{text}");
        // The line's own id is its only one.
        assert_eq!(lines[2]["request_id"], "its-own", "{text}");
        assert_eq!(
            text.lines().nth(2).unwrap().matches("request_id").count(),
            1
        );
    }
}
