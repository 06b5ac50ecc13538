//! The built binary, run as users run it: `schema` (read whole or in part), `--help`,
//! `api-key create`, `tenant create|list` and `migrate`, settings given that no command
//! reads, and settings it cannot read.

use std::process::{Command, Stdio};

use sea_orm::ConnectionTrait as _;

use crate::support::process::{courier_command, COURIER};
use crate::support::{Backend, TestDb};

#[test]
fn schema_command_prints_the_checked_in_sdl() {
    let output = Command::new(COURIER)
        .arg("schema")
        .output()
        .expect("run courier schema");
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).expect("utf-8");
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql"))
            .expect("schema.graphql");
    assert_eq!(printed.trim_end(), checked_in.trim_end());
}

/// A reader that stops reading a listing (`courier schema | head -1`) leaves the command
/// successful and silent: the pipe it closed is no error of the command's.
#[test]
fn a_listing_whose_reader_stops_early_is_no_error() {
    let mut child = Command::new(COURIER)
        .arg("schema")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run courier schema");
    // Closed before the command writes: its first write finds no reader.
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("courier schema ends");
    assert!(output.status.success(), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
}

/// A setting that cannot be read is named, in the log format asked for (a JSON line when
/// `COURIER_LOG_FORMAT=json`), even when its value is not UTF-8 (clap says only that some
/// argument is not) or is negative.
#[test]
fn unreadable_settings_are_named_in_the_log_format() {
    use std::os::unix::ffi::OsStrExt as _;

    let not_utf8 = std::ffi::OsStr::from_bytes(b"127.0.0.1:\xff");
    for (name, value, said) in [
        ("COURIER_BIND", not_utf8, "COURIER_BIND must be valid UTF-8"),
        (
            "COURIER_LEASE_SECS",
            std::ffi::OsStr::new("-5"),
            "COURIER_LEASE_SECS (--lease-secs): it must not be negative",
        ),
    ] {
        let output = Command::new(COURIER)
            .arg("serve")
            .env(name, value)
            .env("COURIER_LOG_FORMAT", "json")
            .output()
            .expect("run courier serve");
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(line["level"], "ERROR", "{line}");
        let message = line["message"].as_str().unwrap_or_default();
        assert!(message.contains(said), "{message}");
    }
}

/// A boolean setting left without a value, or given a word it does not take, is told every
/// word it takes.
#[test]
fn a_boolean_setting_is_told_the_words_it_takes() {
    let missing = Command::new(COURIER)
        .args(["serve", "--allow-private-destinations"])
        .output()
        .expect("run courier serve");
    let unknown = Command::new(COURIER)
        .arg("serve")
        .env("COURIER_ALLOW_PRIVATE_DESTINATIONS", "maybe")
        .output()
        .expect("run courier serve");
    for output in [missing, unknown] {
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("COURIER_ALLOW_PRIVATE_DESTINATIONS (--allow-private-destinations)")
                && stderr.contains("expected true/false, yes/no, on/off or 1/0"),
            "{stderr}"
        );
    }
}

#[test]
fn help_documents_every_fixed_setting() {
    let output = Command::new(COURIER)
        .args(["serve", "--help"])
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&output.stdout);
    for name in [
        "DATABASE_URL",
        "COURIER_BIND",
        "COURIER_WORKER_CONCURRENCY",
        "COURIER_LEASE_SECS",
        "COURIER_MAX_ATTEMPTS",
        "COURIER_RETRY_BASE_MS",
        "COURIER_RETRY_SCHEDULE",
        "COURIER_REQUEST_TIMEOUT_MS",
        "COURIER_RATE_LIMIT",
        "COURIER_RATE_LIMIT_WINDOW_SECS",
        "COURIER_ALLOW_PRIVATE_DESTINATIONS",
        "COURIER_LOG_FORMAT",
        "COURIER_DISABLE_AFTER_FAILURES",
        "COURIER_ENCRYPTION_KEY",
        "COURIER_RETENTION_DAYS",
        "COURIER_PRUNE_INTERVAL_SECS",
    ] {
        assert!(
            help.contains(name),
            "--help does not mention {name}:\n{help}"
        );
    }
}

/// A `COURIER_*` variable no setting reads is warned about with the one it most likely
/// meant: `COURIER_DATABASE_URL` (for `DATABASE_URL`) was ignored in silence, and the
/// command ran on a new SQLite file in the working directory.
#[test]
fn a_variable_no_setting_reads_is_told_with_what_it_meant() {
    let dir = std::env::temp_dir().join(format!("courier-unread-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let output = Command::new(COURIER)
        .arg("migrate")
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env("COURIER_DATABASE_URL", "postgres://db.example/courier")
        .env("COURIER_WORKER_CONCURENCY", "4")
        .env("COURIER_LOG_FORMAT", "json")
        .output()
        .expect("run courier migrate");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warned: Vec<(String, String)> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["level"] == "WARN" && entry["variable"].is_string())
        .map(|entry| {
            (
                entry["variable"].as_str().unwrap_or_default().to_owned(),
                entry["meant"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    // Contained, not equal: the environment the tests run in may hold others.
    for expected in [
        ("COURIER_DATABASE_URL", "DATABASE_URL"),
        ("COURIER_WORKER_CONCURENCY", "COURIER_WORKER_CONCURRENCY"),
    ] {
        assert!(
            warned
                .iter()
                .any(|(name, meant)| (name.as_str(), meant.as_str()) == expected),
            "{expected:?}: {stderr}"
        );
    }
    assert!(
        !warned.iter().any(|(name, _)| name == "COURIER_LOG_FORMAT"),
        "a setting read is not warned about: {stderr}"
    );
}

#[test]
fn help_never_shows_a_secret_setting() {
    for command in [
        &["--help"][..],
        &["serve", "--help"],
        &["api-key", "list", "--help"],
    ] {
        let output = Command::new(COURIER)
            .args(command)
            .env(
                "DATABASE_URL",
                "postgres://courier:hunter2@db.example.com/courier",
            )
            .env(
                "COURIER_ENCRYPTION_KEY",
                "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=",
            )
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "https://traces:hunter2@collector.example.com:4318",
            )
            .output()
            .expect("run --help");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(help.contains("DATABASE_URL"), "{command:?}: {help}");
        for secret in ["hunter2", "c2VjcmV0"] {
            assert!(
                !help.contains(secret),
                "{command:?} shows {secret}:\n{help}"
            );
        }
    }
}

#[tokio::test]
async fn api_key_create_prints_only_the_token_and_stores_its_hash() {
    let db = TestDb::new(Backend::Sqlite).await;
    let output = courier_command(&db.url)
        .args(["api-key", "create", "--name", "ops", "--role", "admin"])
        .output()
        .expect("run api-key create");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "the token alone on stdout: {stdout:?}");
    let token = lines[0];
    assert!(token.starts_with("courier_") && token.len() > 40, "{token}");

    let pool = db.connect(1).await;
    let identity = courier::auth::authenticate(&pool, Some(&format!("Bearer {token}")))
        .await
        .expect("the token works");
    assert_eq!(identity.role, courier::auth::Role::Admin);

    let admin_with_scope = courier_command(&db.url)
        .args(["api-key", "create", "--name", "a", "--role", "admin"])
        .args(["--endpoint", &uuid::Uuid::now_v7().to_string()])
        .output()
        .expect("run");
    assert!(!admin_with_scope.status.success());
    assert!(
        admin_with_scope.stdout.is_empty(),
        "no token printed on failure"
    );

    // `--endpoint` is optional for a partner too: with none, the key reaches no endpoint.
    let partner_without_scope = courier_command(&db.url)
        .args(["api-key", "create", "--name", "p", "--role", "partner"])
        .output()
        .expect("run");
    assert!(
        partner_without_scope.status.success(),
        "{}",
        String::from_utf8_lossy(&partner_without_scope.stderr)
    );
    let partner_token = String::from_utf8(partner_without_scope.stdout).expect("utf-8");
    let partner =
        courier::auth::authenticate(&pool, Some(&format!("Bearer {}", partner_token.trim())))
            .await
            .expect("the partner's token works");
    assert_eq!(partner.role, courier::auth::Role::Partner);
    assert!(partner.scope.is_empty() && partner.tenant.is_none());

    // A token nobody can see would be a key nobody holds: none is made.
    let unseen = courier_command(&db.url)
        .args(["api-key", "create", "--name", "lost", "--role", "admin"])
        .stdout(Stdio::null())
        .output()
        .expect("run");
    assert!(!unseen.status.success());
    let listed = courier_command(&db.url)
        .args(["api-key", "list"])
        .output()
        .expect("run api-key list");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(!listed.contains("\tlost\t"), "{listed}");

    let unknown_endpoint = courier_command(&db.url)
        .args([
            "api-key",
            "create",
            "--name",
            "p",
            "--role",
            "partner",
            "--endpoint",
        ])
        .arg(uuid::Uuid::now_v7().to_string())
        .output()
        .expect("run");
    assert!(!unknown_endpoint.status.success());
}

/// `courier tenant create` prints the tenant's id alone; `tenant list` shows it; a partner
/// key created for it with `--tenant` speaks for it; bad input is refused with nothing
/// printed on stdout.
#[tokio::test]
async fn tenant_commands_create_list_and_key_a_tenant() {
    let db = TestDb::new(Backend::Sqlite).await;
    let run = |args: &[&str]| {
        courier_command(&db.url)
            .args(args)
            .output()
            .expect("run courier")
    };
    let created = run(&["tenant", "create", "--name", "Acme Corp"]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let stdout = String::from_utf8(created.stdout).expect("utf-8");
    let tenant = uuid::Uuid::parse_str(stdout.trim()).expect("the id alone on stdout");
    let tenant_id = tenant.to_string();

    let listed = run(&["tenant", "list"]);
    let listed = String::from_utf8(listed.stdout).expect("utf-8");
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines[0], "id\tname\tcreated", "{listed}");
    assert!(
        lines[1].starts_with(&format!("{tenant}\tAcme Corp\t")),
        "{listed}"
    );

    let key = run(&[
        "api-key", "create", "--name", "acme", "--role", "partner", "--tenant", &tenant_id,
    ]);
    assert!(
        key.status.success(),
        "{}",
        String::from_utf8_lossy(&key.stderr)
    );
    let token = String::from_utf8(key.stdout).expect("utf-8");
    let pool = db.connect(1).await;
    let identity = courier::auth::authenticate(&pool, Some(&format!("Bearer {}", token.trim())))
        .await
        .expect("the token works");
    assert_eq!(identity.tenant, Some(tenant));
    let keys = String::from_utf8(run(&["api-key", "list"]).stdout).expect("utf-8");
    assert!(keys.contains(&format!("tenant:{tenant}")), "{keys}");

    // A name stored before the rules refused what it holds is listed without its
    // direction overrides or control characters (a terminal would show it reordered).
    pool.conn()
        .execute_unprepared("UPDATE tenants SET name = 'evil\u{202E}txt.exe'")
        .await
        .expect("a name from before the rules");
    let listed = String::from_utf8(run(&["tenant", "list"]).stdout).expect("utf-8");
    assert!(listed.contains("\teviltxt.exe\t"), "{listed}");

    for refused in [
        vec!["tenant", "create", "--name", " "],
        vec![
            "api-key",
            "create",
            "--name",
            "x",
            "--role",
            "partner",
            "--tenant",
            "0190a0a0-0000-7000-8000-000000000000",
        ],
        vec![
            "api-key", "create", "--name", "x", "--role", "admin", "--tenant", &tenant_id,
        ],
    ] {
        let output = run(&refused);
        assert!(!output.status.success(), "{refused:?} was accepted");
        assert!(output.stdout.is_empty(), "{refused:?} printed on stdout");
    }
}

/// Several processes migrating one fresh PostgreSQL database at once all succeed.
#[tokio::test]
async fn concurrent_migrations_from_several_processes_succeed() {
    let db = TestDb::new_unmigrated(Backend::Postgres).await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            courier_command(&db.url)
                .arg("migrate")
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().expect("wait");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_serve_variable_stops_serve_alone() {
    let db = TestDb::new(Backend::Sqlite).await;
    let run = |args: &[&str]| {
        courier_command(&db.url)
            .env("COURIER_RATE_LIMIT", "0")
            .env("COURIER_BIND", "127.0.0.1:0")
            .args(args)
            .output()
            .expect("run courier")
    };
    // A shared environment with a value only `serve` reads, and a bad one.
    for command in [&["migrate"][..], &["tenant", "list"], &["api-key", "list"]] {
        let ran = run(command);
        assert!(
            ran.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
    }
    for command in [&["serve"][..], &[]] {
        let refused = run(command);
        assert_eq!(refused.status.code(), Some(2), "{command:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("COURIER_RATE_LIMIT"),
            "{command:?}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
}
