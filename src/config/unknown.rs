//! Settings a process was given but does not read: a `COURIER_*` variable that backs no
//! flag (a typo, a name from another version, or `COURIER_DATABASE_URL` for `DATABASE_URL`)
//! would otherwise be ignored in silence, and a process meant for PostgreSQL would run on a
//! new SQLite file. Each is warned about at start, with the setting it most likely meant.

use std::collections::HashSet;
use std::ffi::OsString;

/// Variables of this prefix are Courier's.
const PREFIX: &str = "COURIER_";

/// The units a setting's name ends with, which a variable may leave off.
const UNITS: &[&str] = &["_MS", "_SECS", "_DAYS", "_BYTES"];

/// Variables of this prefix belong to Courier's own test suite, not to the process.
const TEST_PREFIX: &str = "COURIER_TEST_";

/// The `COURIER_*` variables among `variables` that no setting of `command` (or of its
/// subcommands) reads, in name order, each with the setting it most likely meant.
pub fn unread_variables(
    command: &clap::Command,
    variables: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(String, Option<String>)> {
    let mut known = HashSet::new();
    settings_of(command, &mut known);
    let mut unread: Vec<(String, Option<String>)> = variables
        .into_iter()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| name.starts_with(PREFIX) && !name.starts_with(TEST_PREFIX))
        .filter(|name| !known.contains(name.as_str()))
        .map(|name| {
            let meant = meant(&name, &known);
            (name, meant)
        })
        .collect();
    unread.sort();
    unread
}

/// Adds the variables the arguments of `command` and its subcommands read to `known`.
fn settings_of(command: &clap::Command, known: &mut HashSet<String>) {
    for argument in command.get_arguments() {
        if let Some(name) = argument.get_env().and_then(|name| name.to_str()) {
            known.insert(name.to_owned());
        }
    }
    for subcommand in command.get_subcommands() {
        settings_of(subcommand, known);
    }
}

/// The setting `name` most likely meant: the known one spelt the same in another case;
/// itself without the prefix if that is one (`COURIER_DATABASE_URL`); what a name with the
/// word in full would mean as `DB` (`COURIER_DATABASE_POOL_SIZE`), else `DATABASE_URL` for
/// a name about the database; `RUST_LOG` for one about log levels; the one known name it is
/// but for a unit (`COURIER_PRUNE_INTERVAL`), or whose words, read without underscores,
/// end with it and are mostly it (`COURIER_MAX_INFLIGHT`); else the known one whose name
/// after the prefix is closest by spelling, if close.
fn meant(name: &str, known: &HashSet<String>) -> Option<String> {
    if let Some(same) = known.iter().find(|known| known.eq_ignore_ascii_case(name)) {
        return Some(same.clone());
    }
    let bare = name.strip_prefix(PREFIX).unwrap_or(name);
    if known.contains(bare) {
        return Some(bare.to_owned());
    }
    let upper = bare.to_ascii_uppercase();
    // A database setting named with the word in full: whatever its `DB` form would mean.
    let short = upper.replace("DATABASE", "DB");
    if short != upper {
        if let Some(setting) = meant(&format!("{PREFIX}{short}"), known) {
            return Some(setting);
        }
    }
    let about = |words: &[&str]| words.iter().any(|word| upper.contains(word));
    if about(&["DATABASE", "DB_URL", "POSTGRES", "PG_URL", "SQLITE", "DSN"]) {
        return Some("DATABASE_URL".to_owned());
    }
    if about(&["RUST_LOG", "LOG_LEVEL", "VERBOSITY"]) || upper == "LOG" || upper == "LOGS" {
        return Some("RUST_LOG".to_owned());
    }
    // Each known name after the prefix (a name without it, such as `DATABASE_URL`, as is).
    let bare_known = || {
        known.iter().map(|candidate| {
            (
                candidate.strip_prefix(PREFIX).unwrap_or(candidate),
                candidate,
            )
        })
    };
    let letters = |text: &str| text.replace('_', "");
    let held = letters(&upper);
    let but_a_unit = |candidate: &str| {
        candidate
            .strip_prefix(upper.as_str())
            .is_some_and(|unit| UNITS.contains(&unit))
    };
    // Its letters the candidate's last words, and at least half of the candidate's.
    let its_last_words = |candidate: &str| {
        let words: Vec<&str> = candidate.split('_').collect();
        (1..words.len()).any(|first| words[first..].concat() == held)
            && held.len() * 2 >= letters(candidate).len()
    };
    let holding: Vec<&String> = bare_known()
        .filter(|(candidate, _)| but_a_unit(candidate) || its_last_words(candidate))
        .map(|(_, candidate)| candidate)
        .collect();
    if let [only] = holding.as_slice() {
        return Some((*only).clone());
    }
    bare_known()
        .filter_map(|(candidate, full)| {
            let likeness = strsim::normalized_damerau_levenshtein(&upper, candidate);
            (likeness >= 0.8).then_some((likeness, full))
        })
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, candidate)| candidate.clone())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn unread(names: &[&str]) -> Vec<(String, Option<String>)> {
        unread_variables(
            &crate::config::Cli::command(),
            names
                .iter()
                .map(|name| (OsString::from(name), OsString::from("x"))),
        )
    }

    #[test]
    fn only_unread_courier_variables_are_told_with_what_they_meant() {
        assert_eq!(
            unread(&[
                "COURIER_WORKER_CONCURRENCY",
                "COURIER_ENCRYPTION_KEY",
                "DATABASE_URL",
                "HOME",
                "COURIER_TEST_CHROMIUM",
                "COURIER_DATABASE_URL",
                "COURIER_WORKER_CONCURENCY",
                "COURIER_SOMETHING_ELSE",
            ]),
            vec![
                (
                    "COURIER_DATABASE_URL".to_owned(),
                    Some("DATABASE_URL".to_owned())
                ),
                ("COURIER_SOMETHING_ELSE".to_owned(), None),
                (
                    "COURIER_WORKER_CONCURENCY".to_owned(),
                    Some("COURIER_WORKER_CONCURRENCY".to_owned())
                ),
            ]
        );
        let meant_for = |name: &str| unread(&[name]).pop().and_then(|(_, meant)| meant);
        for (typed, setting) in [
            ("COURIER_DATABSE_URL", "DATABASE_URL"),
            ("COURIER_PRUNE_INTERVAL", "COURIER_PRUNE_INTERVAL_SECS"),
            ("COURIER_MAX_INFLIGHT", "COURIER_ENDPOINT_MAX_IN_FLIGHT"),
            ("COURIER_RETENTON_DAYS", "COURIER_RETENTION_DAYS"),
            ("COURIER_LOG", "RUST_LOG"),
            ("COURIER_DATABASE_POOL_SIZE", "COURIER_DB_POOL_SIZE"),
            ("COURIER_DATABASE_TIMEOUT_MS", "COURIER_DB_TIMEOUT_MS"),
            (
                "COURIER_DATABASE_ACQUIRE_TIMEOUT",
                "COURIER_DB_ACQUIRE_TIMEOUT_MS",
            ),
            ("COURIER_DATABASE_POOLSIZE", "COURIER_DB_POOL_SIZE"),
            ("COURIER_DATABASE_TIMEOUT", "COURIER_DB_TIMEOUT_MS"),
            ("COURIER_DATABASE_HOST", "DATABASE_URL"),
        ] {
            assert_eq!(meant_for(typed).as_deref(), Some(setting), "{typed}");
        }
        // A name that begins or ends a setting's only in part is no sure guess.
        for vague in [
            "COURIER_AUTH",
            "COURIER_CLAIM",
            "COURIER_SUBMIT",
            "COURIER_DISABLE",
        ] {
            assert_eq!(meant_for(vague), None, "{vague}");
        }
        assert_eq!(meant_for("COURIER_bind").as_deref(), Some("COURIER_BIND"));
        assert_eq!(meant_for("COURIER_DB_URL").as_deref(), Some("DATABASE_URL"));
        assert_eq!(
            meant_for("COURIER_POSTGRES_URL").as_deref(),
            Some("DATABASE_URL")
        );
        assert_eq!(meant_for("COURIER_LOG_LEVEL").as_deref(), Some("RUST_LOG"));
        assert_eq!(meant_for("COURIER_PORT"), None);
        assert_eq!(meant_for("COURIER_FOO"), None);
        assert_eq!(meant_for("COURIER_"), None);
    }
}
