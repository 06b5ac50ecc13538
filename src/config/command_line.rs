//! Reading the command line: settings every command shares (database, logging, traces) may
//! come before or after the command's name; the settings of `serve` written before another
//! command are refused, as that command would ignore them.

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Args as _, FromArgMatches as _};

use super::{Cli, ServeArgs};

impl Cli {
    /// Parses `args` (the program's name first) with `command`, this CLI's
    /// [`clap::Command`] (`Cli::command()`).
    pub fn from_command_line<I, T>(command: &clap::Command, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = command.clone().try_get_matches_from(args)?;
        if let Some((name, _)) = matches.subcommand() {
            let serve = ServeArgs::augment_args(clap::Command::new("serve"));
            let typed = serve.get_arguments().find(|arg| {
                matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine)
            });
            if let Some(arg) = typed {
                let flag = arg.get_long().unwrap_or_else(|| arg.get_id().as_str());
                let message = if name == "serve" {
                    format!("--{flag} before `serve` would be ignored: write it after (`courier serve --{flag} ...`)")
                } else {
                    format!("--{flag} is a setting of `serve`; `{name}` does not take it")
                };
                return Err(command.clone().error(ErrorKind::ArgumentConflict, message));
            }
        }
        Self::from_arg_matches(&matches)
    }
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
        assert!(err.to_string().contains("write it after"), "{err}");
        // With no command named they are `serve`'s settings...
        let cli = parse(&["courier", "--bind", "127.0.0.1:1"]).expect("parsed");
        assert!(cli.command.is_none());
        // ...and after `serve`, its own.
        let cli = parse(&["courier", "serve", "--bind", "127.0.0.1:1"]).expect("parsed");
        assert!(matches!(cli.command, Some(Command::Serve(_))));
    }
}
