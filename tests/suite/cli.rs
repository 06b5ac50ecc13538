//! The built binary, run as users run it: `schema`, `api-key create`, `migrate`, `serve` and SIGTERM.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Backend, TestDb};

const COURIER: &str = env!("CARGO_BIN_EXE_courier");

fn courier(database_url: &str) -> Command {
    let mut command = Command::new(COURIER);
    command
        .env("DATABASE_URL", database_url)
        .env("COURIER_LOG_FORMAT", "json");
    command
}

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
        "COURIER_REQUEST_TIMEOUT_MS",
        "COURIER_RATE_LIMIT",
        "COURIER_RATE_LIMIT_WINDOW_SECS",
        "COURIER_ALLOW_PRIVATE_DESTINATIONS",
        "COURIER_LOG_FORMAT",
    ] {
        assert!(
            help.contains(name),
            "--help does not mention {name}:\n{help}"
        );
    }
}

#[tokio::test]
async fn api_key_create_prints_only_the_token_and_stores_its_hash() {
    let db = TestDb::new(Backend::Sqlite).await;
    let output = courier(&db.url)
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

    let partner_without_scope = courier(&db.url)
        .args(["api-key", "create", "--name", "p", "--role", "partner"])
        .output()
        .expect("run");
    assert!(!partner_without_scope.status.success());
    assert!(
        partner_without_scope.stdout.is_empty(),
        "no token printed on failure"
    );

    let unknown_endpoint = courier(&db.url)
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

/// Several processes migrating one fresh PostgreSQL database at once all succeed.
#[tokio::test]
async fn concurrent_migrations_from_several_processes_succeed() {
    let db = TestDb::new_unmigrated(Backend::Postgres).await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            courier(&db.url)
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

/// `courier serve` on the SQLite default answers, and exits 0 on SIGTERM.
#[tokio::test]
async fn serve_answers_and_exits_cleanly_on_sigterm() {
    let db = TestDb::new(Backend::Sqlite).await;
    let mut child = courier(&db.url)
        .arg("serve")
        .env("COURIER_BIND", "127.0.0.1:0")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    let addr = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                let entry: serde_json::Value = serde_json::from_str(&line).ok()?;
                (entry["message"] == "listening")
                    .then(|| entry["addr"].as_str().map(str::to_owned))?
            })
    })
    .await
    .expect("read stderr")
    .expect("serve logs the address it listens on");

    let health = crate::support::http_client()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("healthz answers");
    assert!(health.status().is_success());

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        None
    })
    .await
    .expect("wait");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "SIGTERM exits 0");
}
