//! Logging setup. `log_level` (`--log-level`, the file's key, `HOLDFAST_LOG_LEVEL`) filters when
//! it is said; `RUST_LOG` only over the default (a unit or an image that sets `RUST_LOG` must not
//! make a file's `log_level` do nothing). The format is text or JSON.

use std::sync::OnceLock;

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
            let builder = builder.with_filter_reloading();
            let handle = builder.reload_handle();
            let _ = REFILTER.set(Box::new(move |f| {
                handle.reload(f).map_err(|e| e.to_string())
            }));
            builder.init()
        }
        LogFormat::Json => {
            let builder = builder.json().flatten_event(true).with_filter_reloading();
            let handle = builder.reload_handle();
            let _ = REFILTER.set(Box::new(move |f| {
                handle.reload(f).map_err(|e| e.to_string())
            }));
            builder.init()
        }
    }
}
