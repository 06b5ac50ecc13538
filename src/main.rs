//! The `courier` binary: parse the command line, start logging, run the command.

use clap::Parser as _;
use courier::config::Cli;
use courier::{commands, error::error_chain, telemetry};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match commands::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %error_chain(&err), "courier failed");
            eprintln!("error: {}", error_chain(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
