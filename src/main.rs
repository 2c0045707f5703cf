//! The holdfast binary: parse, load configuration, bind, run, drain on a signal.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use holdfast::cli::{AdminArgs, Cli, Command, ProxyArgs};
use holdfast::config::{self, RawConfig};
use holdfast::{server, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { proxy, probe }) => check_config(&proxy, probe.as_deref()),
        Some(Command::Healthcheck(args)) => healthcheck(&serving_admin(args)),
        Some(Command::Pause {
            admin,
            drain_timeout,
        }) => pause(&serving_admin(admin), Some(drain_timeout)),
        Some(Command::Resume(args)) => pause(&serving_admin(args), None),
        Some(Command::Demo { duration, period }) => demo(duration, period),
        Some(Command::Probe(args)) => probe(&args),
        Some(Command::Completions { shell }) => {
            // clap_complete panics on a failed write: it writes into memory, and the script
            // goes out below.
            let mut script = Vec::new();
            holdfast::cli::completions(shell, &mut script);
            print_out("completions", |out| out.write_all(&script))
        }
        Some(Command::Man) => print_out("man", |out| holdfast::cli::man(out)),
        None => run(&cli.proxy),
    }
}

/// Writes a command's output to stdout. A reader that stops early (`holdfast man | head`)
/// closes the pipe, and the rest of the output has nobody to go to: that ends the command
/// quietly, with success, as the shell's own tools end (holdfast ignores SIGPIPE, as every Rust
/// program does, so the write fails instead of the signal ending it).
fn print_out(command: &str, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match write(&mut stdout).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{command}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The admin flags to use: `cli`'s when it names an address or a file; otherwise, in a
/// container whose holdfast serves as PID 1, that holdfast's own (its `--admin`, its
/// `--config`), so a HEALTHCHECK finds the admin listener the running holdfast was started
/// with. The environment is the container's either way.
fn serving_admin(cli: AdminArgs) -> AdminArgs {
    if cli.admin.is_some() || cli.config.is_some() {
        return cli;
    }
    std::fs::read("/proc/1/cmdline")
        .ok()
        .and_then(|cmdline| holdfast::cli::admin_args_of(&cmdline))
        .unwrap_or(cli)
}

/// The configured admin address (flag, environment or file); a valid upstream is not needed.
fn admin_addr(cli: &AdminArgs, command: &str) -> Result<std::net::SocketAddr, ExitCode> {
    let fig = config::figment(cli.config.as_deref(), &cli.flags());
    fig.extract_inner::<String>("admin")
        .ok()
        .and_then(|a| config::listen_addr(&a))
        .ok_or_else(|| {
            eprintln!("{command}: no valid admin address configured");
            ExitCode::from(EXIT_CONFIG)
        })
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `holdfast pause` (with a drain timeout) and `holdfast resume` (without).
fn pause(cli: &AdminArgs, drain_timeout: Option<f64>) -> ExitCode {
    let command = if drain_timeout.is_some() {
        "pause"
    } else {
        "resume"
    };
    let addr = match admin_addr(cli, command) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let fig = config::figment(cli.config.as_deref(), &cli.flags());
    let token = match fig.extract_inner::<Option<String>>("admin_token_file") {
        Ok(Some(file)) => match config::AdminToken::read(std::path::Path::new(&file)) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("{command}: admin_token_file: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        _ => None,
    };
    let runtime = current_thread_runtime();
    let outcome = match drain_timeout {
        Some(secs) if !(secs.is_finite() && secs >= 0.0) => {
            eprintln!("pause: --drain-timeout must be a number of seconds");
            return ExitCode::from(EXIT_CONFIG);
        }
        Some(secs) => runtime.block_on(holdfast::admin::client::pause(
            addr,
            token.as_ref(),
            // The admin caps a drain at an hour too.
            Duration::from_secs_f64(secs.min(3600.0)),
        )),
        None => runtime.block_on(holdfast::admin::client::resume(addr, token.as_ref())),
    };
    if outcome.code == 0 {
        println!("{}", outcome.message);
    } else {
        eprintln!("{command}: {}", outcome.message);
    }
    ExitCode::from(outcome.code)
}

/// `holdfast healthcheck`: exit 0 when the admin listener says ready. Needs only the admin
/// address (flag, environment or file), not a valid upstream.
fn healthcheck(cli: &AdminArgs) -> ExitCode {
    let admin = match admin_addr(cli, "healthcheck") {
        Ok(a) => a,
        Err(code) => return code,
    };
    let runtime = current_thread_runtime();
    if runtime.block_on(holdfast::admin::is_ready(admin, Duration::from_secs(3))) {
        ExitCode::SUCCESS
    } else {
        eprintln!("healthcheck: {admin}/readyz is not ready");
        ExitCode::FAILURE
    }
}

/// `holdfast probe URL`.
fn probe(args: &holdfast::cli::ProbeArgs) -> ExitCode {
    let opts = match holdfast::probe::Options::new(
        &args.url,
        args.timeout,
        &args.headers,
        args.protocol_version.clone(),
        args.ca_file.clone(),
    ) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("probe: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let report = match current_thread_runtime().block_on(holdfast::probe::run(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
    } else {
        print!("{}", report.text());
    }
    ExitCode::from(report.exit_code)
}

/// `holdfast demo`.
fn demo(duration: f64, period: f64) -> ExitCode {
    if !(duration.is_finite() && duration > 0.0 && period.is_finite() && period >= 0.4) {
        eprintln!("demo: --duration must be positive and --period at least 0.4 s");
        return ExitCode::from(EXIT_CONFIG);
    }
    // holdfast's outage lines explain what happens; the rest would be noise here.
    telemetry::init_with_default(
        config::LogFormat::Text,
        "holdfast=info,holdfast::access=off",
    );
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let opts = holdfast::demo::DemoOptions {
        duration: Duration::from_secs_f64(duration),
        period: Duration::from_secs_f64(period),
    };
    match runtime.block_on(holdfast::demo::run(opts)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `holdfast check-config`: the effective configuration as TOML, or every problem; with
/// `--probe`, then the upstream probed.
fn check_config(cli: &ProxyArgs, probe_path: Option<&str>) -> ExitCode {
    let fig = config::figment(cli.config.as_deref(), &cli.flags());
    let config = match config::load(cli.config.as_deref(), &cli.flags()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Some(warning) = &config.sessions.key_file_warning {
        eprintln!("warning: sessions.key_file: {warning}");
    }
    let unknown = config::unknown_env();
    if !unknown.is_empty() {
        eprintln!(
            "warning: not read, as they name no configuration key: {}",
            unknown.join(", ")
        );
    }
    let mut raw: RawConfig = fig.extract().expect("validated above");
    // Printed configurations end up in CI logs and tickets: no password in them.
    raw.sessions.store = raw.sessions.store.as_deref().map(config::redact_store_url);
    print!(
        "{}",
        toml::to_string(&raw).expect("the raw config serializes")
    );
    // Where each value not at its default came from, as TOML comments: the output stays the
    // configuration, and a value that an environment variable set is not taken for the file's.
    let origins = config::origins(&fig);
    if !origins.is_empty() {
        println!("\n# Where each value not at its default came from:");
        for (key, origin) in origins {
            println!("#   {key}: {origin}");
        }
    }
    if let Some(path) = probe_path {
        probe_upstream(&config, path);
    }
    ExitCode::SUCCESS
}

/// Probes the configured upstream at `path` under its URL; a warning unless it is a
/// Streamable HTTP MCP endpoint (the configuration itself is valid either way).
fn probe_upstream(config: &config::Config, path: &str) {
    let up = &config.upstream;
    let path = format!("/{}", path.trim_start_matches('/'));
    let url = format!("{}://{}{}{path}", up.scheme(), up.authority, up.path_prefix);
    let mut opts = match holdfast::probe::Options::new(
        &url,
        10.0,
        &[],
        holdfast::probe::DEFAULT_PROTOCOL_VERSION.into(),
        None,
    ) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("warning: cannot probe the upstream: {e}");
            return;
        }
    };
    opts.tls = config.upstream_tls.as_ref().map(|t| t.config.clone());
    opts.hold = config.hold.timeout;
    match current_thread_runtime().block_on(holdfast::probe::run(&opts)) {
        Ok(report) => {
            if report.verdict.kind != holdfast::probe::verdict::Kind::McpServer {
                eprintln!(
                    "warning: the upstream at {url} is not a Streamable HTTP MCP endpoint: {}",
                    report.verdict.finding
                );
            }
            eprint!("{}", report.text());
        }
        Err(e) => eprintln!("warning: cannot probe the upstream: {e}"),
    }
}

/// Exit status for an invalid configuration (1 is any other failure).
const EXIT_CONFIG: u8 = 2;

fn run(cli: &ProxyArgs) -> ExitCode {
    let config = match config::load(cli.config.as_deref(), &cli.flags()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(config.log_format, &config.log_level, config.log_level_said);
    let unknown = config::unknown_env();
    if !unknown.is_empty() {
        // Not fatal: a pod gets variables for every Service in its namespace, and one named
        // `holdfast-…` gives `HOLDFAST_…_SERVICE_HOST`. A typo shows here.
        tracing::warn!(
            variables = unknown.join(", "),
            "HOLDFAST_* environment variables that name no configuration key are not read"
        );
    }
    holdfast::rlimit::raise_and_log(config.max_connections);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    // Once, beside serving: a wrong upstream URL must be loud at start, not after the first
    // request's hold (50 s by default). holdfast serves either way (the backend may come later).
    runtime.spawn(server::try_upstream_once(
        config.upstream.clone(),
        config.connect_timeout,
    ));
    let result = runtime.block_on(async {
        let asks = signals(cli.clone());
        let listener = server::bind(config.listen, "proxy").await?;
        let admin = server::bind(config.admin, "admin").await?;
        server::run(config, listener, admin, asks).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %holdfast::errors::ErrorChain(&e), "holdfast failed");
            ExitCode::FAILURE
        }
    }
}

/// What the signals ask of the running holdfast: the first SIGTERM or SIGINT a drain, the next
/// one to stop at once; SIGHUP a reload, with the configuration read again from the sources it
/// was read from at start (the same file, the environment, the flags as given). The handlers
/// are installed when this is *called*, not when the task first runs: a signal that arrives
/// while holdfast is still starting must be handled, not take the default action (for SIGHUP,
/// the process's end).
fn signals(cli: ProxyArgs) -> tokio::sync::mpsc::UnboundedReceiver<server::Ask> {
    let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        let mut hup = signal(SignalKind::hangup()).ok();
        tokio::spawn(async move {
            let mut stopping = false;
            loop {
                let stop = tokio::select! {
                    Some(()) = recv(&mut term) => true,
                    Some(()) = recv(&mut int) => true,
                    Some(()) = recv(&mut hup) => false,
                    else => return,
                };
                let ask = if stop {
                    tracing::info!(again = stopping, "signal received");
                    let ask = if stopping {
                        server::Ask::StopNow
                    } else {
                        server::Ask::Stop
                    };
                    stopping = true;
                    ask
                } else {
                    tracing::info!("SIGHUP received: reloading the configuration");
                    let cli = cli.clone();
                    let read = tokio::task::spawn_blocking(move || {
                        config::load(cli.config.as_deref(), &cli.flags())
                    })
                    .await
                    .expect("reading the configuration does not panic");
                    server::Ask::Reload(read.map(Box::new).map_err(|e| e.to_string()))
                };
                if asks.send(ask).is_err() {
                    return;
                }
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("signal received");
        let _ = asks.send(server::Ask::Stop);
    });
    asked
}

/// The next delivery of `signal`, or never when its handler could not be installed.
#[cfg(unix)]
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal.as_mut() {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}
