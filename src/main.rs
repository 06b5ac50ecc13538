//! The `courier` binary: parse the command line, start logging, run the command.

use clap::CommandFactory as _;
use courier::cli::{commands, fatal};
use courier::config::Cli;
use courier::telemetry;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let command = Cli::command();
    let cli = match Cli::from_command_line(&command, std::env::args_os()) {
        Ok(cli) => cli,
        Err(err) => return fatal::usage(&err, &command),
    };
    let log_format = cli.log_format;
    let telemetry = match telemetry::init(log_format, &cli.tracing) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            fatal::report(log_format, &err);
            return std::process::ExitCode::FAILURE;
        }
    };
    for (name, meant) in courier::config::unread_variables(&command, std::env::vars_os()) {
        match meant {
            Some(meant) => tracing::warn!(variable = %name, meant = %meant,
                "{name} is not a Courier setting and is ignored: did you mean {meant}?"),
            None => tracing::warn!(variable = %name,
                "{name} is not a Courier setting and is ignored (`courier --help` lists them)"),
        }
    }
    let code = match commands::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // What was logged before goes out first: the fatal line is the last word.
            telemetry::sink::flush();
            fatal::report(log_format, &err);
            std::process::ExitCode::from(err.exit_code())
        }
    };
    telemetry.shutdown().await;
    code
}
