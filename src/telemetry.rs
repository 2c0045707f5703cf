//! Logging setup. `log_level` (`--log-level`) filters, `RUST_LOG` over it when set; the format
//! is text or JSON.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Logs go to stderr; stdout stays free for command output.
pub fn init(format: LogFormat, level: &str) {
    init_with_default(format, level);
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
    // Colours only for a person at a terminal, never into a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    if let Some(error) = unparsed {
        tracing::warn!(
            rust_log = rust_log.as_deref().unwrap_or_default(),
            %error,
            using = default,
            "RUST_LOG does not parse as a log filter; it is ignored"
        );
    }
}
