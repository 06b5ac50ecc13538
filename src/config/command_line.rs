//! Reading the command line: settings every command shares (database, logging, traces) may
//! come before or after the command's name, and so may a setting of `serve` that the command
//! takes too (`--encryption-key` of `endpoint rotate-secret`); the other settings of `serve`
//! written before a command are refused, as that command would ignore them. And the
//! variables of `serve`'s settings are read for `serve` alone: a bad one (a shared
//! environment file's) never stops `migrate` or `api-key`.

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args as _, FromArgMatches as _};

use super::{Cli, Command, EndpointCommand, ServeArgs};

/// The settings of `serve` another command takes too, by id: given before that command,
/// they are its own (see [`Cli::from_command_line`]).
const SHARED_WITH_SERVE: &[&str] = &["encryption_key"];

impl Cli {
    /// Parses `args` (the program's name first) with `command`, this CLI's
    /// [`clap::Command`] (`Cli::command()`).
    pub fn from_command_line<I, T>(command: &clap::Command, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        // Which command is named, read leniently first.
        let named = command
            .clone()
            .ignore_errors(true)
            .try_get_matches_from(&args)
            .ok()
            .and_then(|matches| matches.subcommand_name().map(str::to_owned));
        let reading = match named.as_deref() {
            Some(name) if name != "serve" => without_serve_variables(command),
            _ => command.clone(),
        };
        let matches = reading.try_get_matches_from(&args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        let Some((name, _)) = matches.subcommand() else {
            return Ok(cli);
        };
        let (path, leaf) = named_command(&matches);
        let serve = ServeArgs::augment_args(clap::Command::new("serve"));
        for arg in serve.get_arguments() {
            let id = arg.get_id().as_str();
            if matches.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            let flag = arg.get_long().unwrap_or(id);
            if name != "serve" && SHARED_WITH_SERVE.contains(&id) && takes(command, &path, id) {
                // The command's own value, unless it was written after the command too.
                if leaf.value_source(id) != Some(ValueSource::CommandLine) {
                    cli.carry_over(id);
                }
                continue;
            }
            let message = if name == "serve" {
                format!(
                    "--{flag} goes after `serve` (`courier serve --{flag} ...`), or leave \
                     `serve` out (`courier --{flag} ...`)"
                )
            } else {
                format!(
                    "--{flag} is a setting of `serve`; `{}` does not take it",
                    path.join(" ")
                )
            };
            return Err(command.clone().error(ErrorKind::ArgumentConflict, message));
        }
        Ok(cli)
    }

    /// Gives the named command the value of `id` written before it.
    fn carry_over(&mut self, id: &str) {
        if let ("encryption_key", Some(Command::Endpoint(EndpointCommand::RotateSecret(args)))) =
            (id, &mut self.command)
        {
            args.encryption_key.clone_from(&self.serve.encryption_key);
        }
    }
}

/// `command` with the settings of `serve` it takes before a command's name reading no
/// variable (they take their defaults: the command named does not use them).
fn without_serve_variables(command: &clap::Command) -> clap::Command {
    let serve = ServeArgs::augment_args(clap::Command::new("serve"));
    serve.get_arguments().fold(command.clone(), |command, arg| {
        command.mut_arg(arg.get_id().clone(), |arg| arg.env(None))
    })
}

/// The names of the command `matches` names, outermost first (`["endpoint",
/// "rotate-secret"]`), and the innermost one's matches.
fn named_command(matches: &ArgMatches) -> (Vec<String>, &ArgMatches) {
    let mut path = Vec::new();
    let mut leaf = matches;
    while let Some((name, sub)) = leaf.subcommand() {
        path.push(name.to_owned());
        leaf = sub;
    }
    (path, leaf)
}

/// Whether the command at `path` under `command` takes an argument `id` of its own.
fn takes(command: &clap::Command, path: &[String], id: &str) -> bool {
    let mut at = command;
    for name in path {
        match at.find_subcommand(name) {
            Some(sub) => at = sub,
            None => return false,
        }
    }
    at.get_arguments().any(|arg| arg.get_id().as_str() == id)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;
    use crate::config::{Command, LogFormat};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::from_command_line(&Cli::command(), args)
    }

    #[test]
    fn shared_settings_may_come_before_the_command() {
        let cli = parse(&[
            "courier",
            "--log-format",
            "json",
            "--database-url",
            "sqlite://elsewhere.db?mode=rwc",
            "migrate",
        ])
        .expect("parsed");
        assert_eq!(cli.log_format, LogFormat::Json);
        assert_eq!(cli.database.database_url, "sqlite://elsewhere.db?mode=rwc");
        assert!(matches!(cli.command, Some(Command::Migrate)));
        // And after it, as before.
        let cli = parse(&["courier", "schema", "--log-format", "json"]).expect("parsed");
        assert_eq!(cli.log_format, LogFormat::Json);
    }

    #[test]
    fn serve_settings_before_another_command_are_refused() {
        let err = parse(&["courier", "--bind", "127.0.0.1:1", "migrate"]).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        assert!(err.to_string().contains("--bind"), "{err}");
        assert!(err.to_string().contains("migrate"), "{err}");
        let err = parse(&["courier", "--bind", "127.0.0.1:1", "serve"]).expect_err("refused");
        assert!(err.to_string().contains("goes after `serve`"), "{err}");
        // With no command named they are `serve`'s settings...
        let cli = parse(&["courier", "--bind", "127.0.0.1:1"]).expect("parsed");
        assert!(cli.command.is_none());
        // ...and after `serve`, its own.
        let cli = parse(&["courier", "serve", "--bind", "127.0.0.1:1"]).expect("parsed");
        assert!(matches!(cli.command, Some(Command::Serve(_))));
    }

    #[test]
    fn a_setting_a_command_shares_with_serve_may_come_before_it() {
        let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let id = "01a24f5e-5cea-7608-b169-c45afe3c8f0e";
        let rotate = |cli: Cli| match cli.command {
            Some(Command::Endpoint(EndpointCommand::RotateSecret(args))) => args,
            other => panic!("{other:?}"),
        };
        let before = parse(&[
            "courier",
            "--encryption-key",
            key,
            "endpoint",
            "rotate-secret",
            id,
        ])
        .expect("parsed");
        assert!(rotate(before).encryption_key.is_some(), "carried over");
        let after = parse(&[
            "courier",
            "endpoint",
            "rotate-secret",
            id,
            "--encryption-key",
            key,
        ])
        .expect("parsed");
        assert!(rotate(after).encryption_key.is_some());
        // Every setting of `serve` another command takes is one `from_command_line` carries.
        let command = Cli::command();
        let serve = ServeArgs::augment_args(clap::Command::new("serve"));
        let mut shared = Vec::new();
        for top in command
            .get_subcommands()
            .filter(|sub| sub.get_name() != "serve")
        {
            let leaves: Vec<&clap::Command> = if top.has_subcommands() {
                top.get_subcommands().collect()
            } else {
                vec![top]
            };
            for leaf in leaves {
                for arg in leaf.get_arguments() {
                    let id = arg.get_id().as_str();
                    let global = command
                        .get_arguments()
                        .any(|top| top.get_id() == id && top.is_global_set());
                    if !global && serve.get_arguments().any(|s| s.get_id() == id) {
                        shared.push(id.to_owned());
                    }
                }
            }
        }
        shared.sort();
        shared.dedup();
        assert_eq!(shared, SHARED_WITH_SERVE, "settings shared with serve");
    }
}
