//! Command-line interface. Flags are the top configuration layer; only flags the user actually
//! gave are passed on, so lower layers (environment, file, defaults) show through the rest.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{RawFlags, RawRequestIdFlags, RawTlsFlags};

/// holdfast: keeps MCP clients connected while their server's container is recreated.
///
/// Forwards everything to one MCP server (Streamable HTTP). While the server is missing
/// (connection refused, DNS failure, a router's route-missing 404) requests are held and sent
/// once it is back, or answered 503 with Retry-After, never the 404 clients would read as
/// "session expired"; sessions outlive the server's restarts and holdfast's own.
#[derive(Debug, Parser)]
#[command(name = "holdfast", version, about, long_about)]
// The proxy's flags belong to running the proxy: given before a subcommand they are an error,
// not silently ignored (each subcommand takes the flags it uses).
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do; without a subcommand holdfast runs the proxy.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The proxy's configuration flags.
    #[command(flatten)]
    pub proxy: ProxyArgs,
}

/// The configuration flags: running the proxy and `check-config` take them all.
#[derive(Debug, Clone, Default, Args)]
pub struct ProxyArgs {
    /// TOML configuration file [env: HOLDFAST_CONFIG].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Proxy listen address: IP:PORT, :PORT or localhost:PORT [default: 0.0.0.0:8080] [env:
    /// HOLDFAST_LISTEN].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// The MCP server's base URL, e.g. http://mcp-backend:8000 [env: HOLDFAST_UPSTREAM].
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,

    /// Admin listen address for /metrics, /healthz, /readyz [default: 127.0.0.1:9362] [env:
    /// HOLDFAST_ADMIN].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,

    /// Retry-After on synthetic 503s, in seconds or as a duration such as 5s [default: 2] [env:
    /// HOLDFAST_RETRY_AFTER_SECS].
    #[arg(long, value_name = "SECS", value_parser = crate::config::duration::whole_secs_flag)]
    pub retry_after: Option<u64>,

    /// Log format [default: text] [env: HOLDFAST_LOG_FORMAT].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormatArg>,

    /// What is logged: error, warn, info, debug, trace, off, or a filter such as
    /// `warn,holdfast::access=info` [default: info] [env: HOLDFAST_LOG_LEVEL]. Given here, in
    /// the environment or the file, it wins over RUST_LOG, which applies only when log_level is
    /// said nowhere.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log one line per request (target holdfast::access) [env: HOLDFAST_ACCESS_LOG].
    #[arg(long)]
    pub access_log: bool,

    /// PEM certificate chain for the proxy listener; with --tls-key it speaks TLS (reloaded
    /// when the file changes) [env: HOLDFAST_TLS__CERT].
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,

    /// PEM private key of --tls-cert [env: HOLDFAST_TLS__KEY].
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,

    /// The header each request's id is read from, sent upstream in and answered with
    /// [default: x-request-id] [env: HOLDFAST_REQUEST_ID__HEADER].
    #[arg(long, value_name = "NAME")]
    pub request_id_header: Option<String>,
}

/// The flags of the commands that talk to a running holdfast's admin listener.
#[derive(Debug, Clone, Default, Args)]
pub struct AdminArgs {
    /// TOML configuration file (its admin address and admin_token_file are used) [env:
    /// HOLDFAST_CONFIG].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The admin listener's address [default: 127.0.0.1:9362] [env: HOLDFAST_ADMIN].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the effective configuration, or every error in it, and exit (non-zero on errors).
    CheckConfig {
        /// The configuration flags.
        #[command(flatten)]
        proxy: ProxyArgs,
        /// Also probe the configured upstream (`holdfast probe`) at PATH under its URL, and
        /// warn, on stderr, when it is not a Streamable HTTP MCP endpoint.
        #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "/mcp")]
        probe: Option<String>,
    },
    /// Ask the admin listener's /readyz; exit 0 when ready, 1 otherwise (for container
    /// HEALTHCHECKs: a minimal image has no curl). Uses the configured admin address.
    Healthcheck(AdminArgs),
    /// Pause for a planned restart: new requests are held before they are sent; returns once
    /// nothing is in flight (exit 0) or when the drain timeout passes, naming what is still in
    /// flight (the pause stays): exit 3 when only GET streams are (they carry no call: safe to
    /// restart), exit 4 when calls are (a restart now would cut them). holdfast resumes by itself once a new instance
    /// answers, after pause.max_secs, or with `holdfast resume`. Uses the configured admin
    /// address and admin_token_file.
    Pause {
        /// Where the admin listener is.
        #[command(flatten)]
        admin: AdminArgs,
        /// Longest wait for requests in flight (SSE streams included) to finish.
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        drain_timeout: f64,
    },
    /// End a pause now: held requests go out, oldest first.
    Resume(AdminArgs),
    /// Run a self-contained demonstration: an embedded MCP backend that is recreated every few
    /// seconds, and two clients calling it, one directly and one through holdfast.
    Demo {
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 12.0, value_name = "SECS")]
        duration: f64,
        /// Seconds per recreation cycle (half up, a quarter router 404, a quarter refused).
        #[arg(long, default_value_t = 4.0, value_name = "SECS")]
        period: f64,
    },
    /// Diagnose an MCP endpoint: POST an initialize, follow what the answer calls for (a GET
    /// for a legacy HTTP+SSE server, the authorization metadata of a 401, tools/list and a
    /// DELETE of the session on a working server), and say what holdfast would do with it.
    ///
    /// Exit status: 0 an MCP server answered (credentials required included), 3 a legacy
    /// HTTP+SSE server, 4 not an MCP endpoint (web page, retired, an SSE service, wrong URL),
    /// 5 an outage (refused, DNS, TLS, timeout, a router's route-missing answer), 2 a usage
    /// error, 1 the probe itself could not run.
    #[command(verbatim_doc_comment)]
    Probe(ProbeArgs),
    /// Print a shell completion script for SHELL to stdout (e.g. `holdfast completions bash >
    /// /etc/bash_completion.d/holdfast`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout (e.g. `holdfast man > holdfast.1; man ./holdfast.1`).
    Man,
}

/// Writes the completion script for `shell`, generated from the definitions above.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cmd, "holdfast", out);
}

/// Every exit status of every command: the manual page's EXIT STATUS section, and the README's
/// table (a test keeps them equal).
pub const EXIT_STATUSES: &[(&str, &str, &str)] = &[
    (
        "holdfast",
        "0",
        "stopped by SIGTERM or SIGINT after its drain",
    ),
    (
        "holdfast",
        "1",
        "could not run (a listener could not be bound)",
    ),
    (
        "any command",
        "2",
        "a usage or configuration error (the message names the key)",
    ),
    (
        "check-config",
        "0",
        "the configuration is valid (printed as TOML)",
    ),
    (
        "healthcheck",
        "0 / 1",
        "holdfast is ready / is not, or does not answer",
    ),
    ("pause", "0", "paused, nothing in flight"),
    (
        "pause",
        "1",
        "the pause could not be asked for (admin unreachable, refused)",
    ),
    (
        "pause",
        "3",
        "paused; only GET streams (no call) still in flight after the drain timeout",
    ),
    (
        "pause",
        "4",
        "paused; calls still in flight after the drain timeout",
    ),
    (
        "resume",
        "0 / 1",
        "resumed, or nothing was paused / could not be asked",
    ),
    ("probe", "0", "a Streamable HTTP MCP server answered"),
    ("probe", "1", "the probe could not start (no CA to trust)"),
    ("probe", "3", "a legacy (2024-11-05 HTTP+SSE) server"),
    ("probe", "4", "not an MCP endpoint"),
    (
        "probe",
        "5",
        "nothing answers for the MCP server (an outage)",
    ),
    ("demo", "0 / 1", "the demo ran / could not"),
];

/// Writes the manual page, generated from the definitions above, with the sections clap does
/// not know about: EXIT STATUS, ENVIRONMENT, FILES.
pub fn man(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    writeln!(out, ".SH \"EXIT STATUS\"")?;
    for (command, status, meaning) in EXIT_STATUSES {
        writeln!(
            out,
            ".TP\n\\fB{}\\fR {}\n{}",
            roff(command),
            roff(status),
            roff(meaning)
        )?;
    }
    writeln!(out, ".SH ENVIRONMENT")?;
    writeln!(
        out,
        ".TP\n\\fBHOLDFAST_*\\fR\nEvery configuration key, nested keys joined by two \
         underscores (HOLDFAST_HOLD__TIMEOUT_SECS). The environment beats the file, flags beat \
         the environment. A HOLDFAST_ variable that names no key is warned about and ignored."
    )?;
    writeln!(
        out,
        ".TP\n\\fBHOLDFAST_CONFIG\\fR\nThe configuration file (as \\-\\-config)."
    )?;
    writeln!(
        out,
        ".TP\n\\fBRUST_LOG\\fR\nWhat is logged, unless log_level is set (file, environment or \
         flag)."
    )?;
    writeln!(out, ".SH FILES")?;
    writeln!(
        out,
        ".TP\n\\fI/etc/holdfast/holdfast.toml\\fR\nThe configuration in the container image and \
         the recipes (config/holdfast.toml documents every key)."
    )?;
    writeln!(
        out,
        ".TP\n\\fIsessions.key_file\\fR\nThe keys that seal session ids, one per line (openssl \
         rand \\-hex 32); re\\-read when it changes."
    )?;
    man.render_version_section(out)?;
    Ok(())
}

/// `text` safe in a roff line: backslashes and hyphens escaped, no line starting with a dot.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// The flags of `holdfast probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// The MCP endpoint, e.g. http://localhost:8000/mcp.
    pub url: String,
    /// Print the report as one JSON document.
    #[arg(long)]
    pub json: bool,
    /// Each step's own time budget (connecting included).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub timeout: f64,
    /// A header sent with every request (repeatable), e.g. -H 'Authorization: Bearer TOKEN'.
    #[arg(short = 'H', long = "header", value_name = "'NAME: VALUE'")]
    pub headers: Vec<String>,
    /// The protocol version the initialize asks for.
    #[arg(long, default_value = crate::probe::DEFAULT_PROTOCOL_VERSION, value_name = "V")]
    pub protocol_version: String,
    /// PEM CA certificates to trust for an https:// URL instead of the system's.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl ProxyArgs {
    /// The flags as the top configuration layer.
    pub fn flags(&self) -> RawFlags {
        RawFlags {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            admin: self.admin.clone(),
            retry_after_secs: self.retry_after,
            log_format: self.log_format.map(|f| match f {
                LogFormatArg::Text => "text".into(),
                LogFormatArg::Json => "json".into(),
            }),
            log_level: self.log_level.clone(),
            access_log: self.access_log.then_some(true),
            tls: RawTlsFlags {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
            },
            request_id: RawRequestIdFlags {
                header: self.request_id_header.clone(),
            },
        }
    }
}

impl AdminArgs {
    /// The flags as the top configuration layer.
    pub fn flags(&self) -> RawFlags {
        RawFlags {
            admin: self.admin.clone(),
            ..RawFlags::default()
        }
    }
}

/// The admin flags of a holdfast that serves, read from its command line (`/proc/1/cmdline`:
/// NUL-separated arguments): its `--config` and `--admin`. None when the command line is not
/// holdfast serving (another program, or a holdfast subcommand).
///
/// `holdfast healthcheck` in a container's HEALTHCHECK is a second process: it sees the
/// container's environment and files, but not the flags the serving holdfast (PID 1) was started
/// with. Read from here, an `--admin` given to the container counts for its health check too.
pub fn admin_args_of(cmdline: &[u8]) -> Option<AdminArgs> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let program = std::path::Path::new(args.first()?).file_name()?;
    if program != "holdfast" {
        return None;
    }
    match Cli::try_parse_from(&args).ok()? {
        Cli {
            command: None,
            proxy,
            ..
        } => Some(AdminArgs {
            config: proxy.config,
            admin: proxy.admin,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_holdfasts_admin_flags_are_read_from_its_command_line() {
        let args = admin_args_of(
            b"/usr/local/bin/holdfast\0--admin\x00127.0.0.1:27002\0--upstream\0http://b:1\0",
        )
        .expect("holdfast serving");
        assert_eq!(args.admin.as_deref(), Some("127.0.0.1:27002"));
        assert_eq!(args.config, None);
        let args = admin_args_of(b"holdfast\0--config\0/etc/holdfast.toml\0").unwrap();
        assert_eq!(args.config, Some(PathBuf::from("/etc/holdfast.toml")));
        assert_eq!(args.admin, None);
        // Not holdfast, or not serving: nothing to read.
        assert!(admin_args_of(b"/bin/sh\0-c\0holdfast --admin 1.2.3.4:5\0").is_none());
        assert!(admin_args_of(b"holdfast\0healthcheck\0").is_none());
        assert!(admin_args_of(b"").is_none());
    }
}
