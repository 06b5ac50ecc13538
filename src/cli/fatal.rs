//! Fatal errors: told once, on one line of stderr, naming what to change.
//!
//! They are written directly rather than through `tracing`, so a `RUST_LOG` filter can
//! never hide why the process stopped; with `COURIER_LOG_FORMAT=json` the line is a JSON
//! object shaped like every other log line.

use std::io::Write as _;

use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::config::LogFormat;
use crate::error::error_chain;

/// Prints why the process stops, as one line in the log format.
pub fn report(format: LogFormat, err: &(dyn std::error::Error + 'static)) {
    write_line(format, &one_line(&error_chain(err)));
}

/// Writes `message` to stderr as one line in `format`.
fn write_line(format: LogFormat, message: &str) {
    let line = match format {
        LogFormat::Text => format!("error: {message}"),
        LogFormat::Json => serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": "ERROR",
            "message": message,
            "target": "courier",
        })
        .to_string(),
    };
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{line}");
}

/// Reports a command line (or `COURIER_*` variable) that could not be parsed, on one line
/// naming the variable, and returns the exit code. Help and version go out as clap prints them.
pub fn usage(err: &clap::Error, command: &clap::Command) -> std::process::ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            return std::process::ExitCode::SUCCESS;
        }
        // `courier tenant` with no subcommand: the help, on stderr, and a usage error.
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            return std::process::ExitCode::from(2);
        }
        _ => {}
    }
    let rendered = err.to_string();
    // The message and its tips; the usage block and the pointer to --help are left out.
    let mut parts: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more"))
        .filter(|line| !line.is_empty())
        .collect();
    let first = parts
        .first()
        .map_or("", |line| line.strip_prefix("error: ").unwrap_or(line));
    let mut message = first.to_owned();
    // An argument the command does not take was typed as a flag: named as typed.
    let typed = err.kind() == ErrorKind::UnknownArgument;
    if let Some((arg, long, named_as)) = invalid_arg(err, command).filter(|_| !typed) {
        if let Some(env) = arg.get_env() {
            let quoted = format!("'{named_as}'");
            let named = format!("{} (--{long})", env.to_string_lossy());
            message = message.replacen(&quoted, &named, 1);
        }
        // The standard library's word for a number that is none, said plainly.
        if let Some(ContextValue::String(value)) = err.get(ContextKind::InvalidValue) {
            let plain = if value.trim_start().starts_with('-') {
                "it must not be negative"
            } else {
                "it is not a whole number"
            };
            message = message.replacen("invalid digit found in string", plain, 1);
        }
        // A setting that may be a secret (the encryption key) is never echoed back.
        if arg.is_hide_env_values_set() {
            if let Some(ContextValue::String(value)) = err.get(ContextKind::InvalidValue) {
                message = message.replacen(&format!("'{value}'"), "(not shown)", 1);
            }
        }
    }
    if err.kind() == ErrorKind::InvalidUtf8 {
        let named = not_utf8_variables(command);
        if !named.is_empty() {
            message = format!("{} must be valid UTF-8", named.join(", "));
        }
    }
    if !parts.is_empty() {
        parts.remove(0);
    }
    for part in parts {
        // A list introduced by a colon continues the sentence.
        message.push_str(if message.ends_with(':') { " " } else { "; " });
        message.push_str(part);
    }
    // A boolean's parser names two of the words it takes, or none: all of them, as the
    // help does.
    let booleans = "expected true/false, yes/no, on/off or 1/0";
    let message = message
        .replace("[possible values: true, false]", booleans)
        .replace("value was not a boolean", booleans);
    let message = format!("{}; see courier --help", one_line(&message));
    write_line(requested_format(), &message);
    std::process::ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2))
}

/// The log format asked for, read directly (the command line that says it may be the one
/// that could not be parsed): `COURIER_LOG_FORMAT`, or `--log-format`.
fn requested_format() -> LogFormat {
    let json = |value: &str| value.trim().eq_ignore_ascii_case("json");
    let args: Vec<String> = std::env::args_os()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let flag = args.iter().enumerate().find_map(|(at, arg)| {
        arg.strip_prefix("--log-format=")
            .or_else(|| (arg == "--log-format").then(|| args.get(at + 1).map(String::as_str))?)
    });
    let chosen = flag
        .map(str::to_owned)
        .or_else(|| std::env::var("COURIER_LOG_FORMAT").ok());
    match chosen {
        Some(value) if json(&value) => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// The settings' variables whose values are not UTF-8 (clap says only that some argument
/// is not).
fn not_utf8_variables(command: &clap::Command) -> Vec<String> {
    let mut named: Vec<String> = std::iter::once(command)
        .chain(command.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .filter_map(clap::Arg::get_env)
        .filter(|name| std::env::var_os(name).is_some_and(|value| value.to_str().is_none()))
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    named.sort();
    named.dedup();
    named
}

/// The argument a value or usage error is about, with its long name and the way the error
/// names it.
fn invalid_arg<'a>(
    err: &clap::Error,
    command: &'a clap::Command,
) -> Option<(&'a clap::Arg, String, String)> {
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg
        .strip_prefix("--")?
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .to_owned();
    std::iter::once(command)
        .chain(command.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .find(|candidate| candidate.get_long() == Some(long.as_str()))
        .map(|candidate| (candidate, long, arg.to_string()))
}

/// Collapses line breaks and runs of spaces, so a message is exactly one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n\n  b \t c\n"), "a b c");
    }
}
