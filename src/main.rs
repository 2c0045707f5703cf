//! The holdfast binary: parse, load configuration, bind, run, drain on a signal.

use std::process::ExitCode;

use clap::Parser;
use holdfast::cli::{Cli, Command};
use holdfast::config::{self, RawConfig};
use holdfast::{server, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig) => check_config(&cli),
        None => run(&cli),
    }
}

/// `holdfast check-config`: the effective configuration as TOML, or every problem.
fn check_config(cli: &Cli) -> ExitCode {
    let fig = config::figment(cli.config.as_deref(), &cli.flags());
    match config::Config::from_figment(&fig) {
        Ok(_) => {
            let raw: RawConfig = fig.extract().expect("validated above");
            print!(
                "{}",
                toml::to_string(&raw).expect("the raw config serializes")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// Exit status for an invalid configuration (1 is any other failure).
const EXIT_CONFIG: u8 = 2;

fn run(cli: &Cli) -> ExitCode {
    let config = match config::load(cli.config.as_deref(), &cli.flags()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(config.log_format);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = runtime.block_on(async {
        let listener = server::bind(config.listen, "proxy").await?;
        let admin = server::bind(config.admin, "admin").await?;
        server::run(config, listener, admin, shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "holdfast failed");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("signal received");
}
