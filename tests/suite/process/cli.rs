//! The built binary, run as users run it: `schema`, `api-key create`, `tenant create|list`,
//! `migrate`, `serve` and SIGTERM.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::fixtures::endpoint_on;
use crate::support::fixtures::submit;
use crate::support::process::{courier_command, spawn_serve, COURIER};
use crate::support::receiver::slow_first_attempt;
use crate::support::{Backend, PartitionProxy, Receiver, TestApp, TestDb};

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

    let partner_without_scope = courier_command(&db.url)
        .args(["api-key", "create", "--name", "p", "--role", "partner"])
        .output()
        .expect("run");
    assert!(!partner_without_scope.status.success());
    assert!(
        partner_without_scope.stdout.is_empty(),
        "no token printed on failure"
    );

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

/// Waits until `expected` deliveries in the database are `delivered`.
async fn all_delivered(api: &TestApp, expected: usize, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let delivered = crate::support::fixtures::count(
            &api.state.db,
            "SELECT count(*) AS n FROM webhook_deliveries WHERE state = 'delivered'",
            vec![],
        )
        .await;
        if delivered == expected as i64 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {delivered} of {expected} delivered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends SIGTERM and returns the exit code, if the process exited within `within`.
async fn terminate(mut child: Child, within: Duration) -> Option<i32> {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        None
    })
    .await
    .expect("wait")
}

/// `courier serve` on the SQLite default answers, and exits 0 on SIGTERM.
#[tokio::test]
async fn serve_answers_and_exits_cleanly_on_sigterm() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (child, addr) = spawn_serve(&db.url, &[]);
    let health = crate::support::http_client()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("healthz answers");
    assert!(health.status().is_success());
    assert_eq!(
        terminate(child, Duration::from_secs(10)).await,
        Some(0),
        "SIGTERM exits 0"
    );
}

/// SIGTERM while deliveries are in flight: the process exits 0 after its grace period, and
/// after a restart every delivery is delivered; what was cut short is reclaimed after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_deliveries_in_flight_loses_nothing() {
    const SUBMISSIONS: usize = 6;
    let db = TestDb::new(Backend::Postgres).await;
    // The first request for each delivery hangs longer than the grace period.
    let receiver = Receiver::start(slow_first_attempt(Duration::from_secs(3))).await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "slow").await;
    for n in 0..SUBMISSIONS {
        let body = submit(&api, &admin, &endpoint, serde_json::json!({ "n": n }), None).await;
        assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    }

    let settings = [
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_WORKER_CONCURRENCY", "4"),
        ("COURIER_LEASE_SECS", "4"),
        ("COURIER_REQUEST_TIMEOUT_MS", "3500"),
        ("COURIER_SHUTDOWN_GRACE_SECS", "1"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
    ];
    let (first, _) = spawn_serve(&db.url, &settings);
    receiver.wait_for(4, Duration::from_secs(20)).await;
    assert_eq!(
        terminate(first, Duration::from_secs(10)).await,
        Some(0),
        "SIGTERM exits 0 with deliveries in flight"
    );

    let (second, _) = spawn_serve(&db.url, &settings);
    all_delivered(&api, SUBMISSIONS, Duration::from_secs(40)).await;
    assert_eq!(terminate(second, Duration::from_secs(10)).await, Some(0));
    let ids: std::collections::HashSet<String> = receiver
        .received()
        .into_iter()
        .map(|r| r.webhook_id)
        .collect();
    assert_eq!(
        ids.len(),
        SUBMISSIONS,
        "every delivery reached the receiver"
    );
}

/// SIGTERM while deliveries are in flight and the database has stopped answering (a real
/// cut in the network: sockets open, nothing moves): the process still exits 0 within its
/// grace period plus bounded flushes, rather than waiting for the network; once the database
/// is back, another process delivers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_database_unreachable_exits_within_its_deadline() {
    const SUBMISSIONS: usize = 4;
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let receiver = Receiver::start(slow_first_attempt(Duration::from_millis(1500))).await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "cut").await;
    let settings = [
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_WORKER_CONCURRENCY", "4"),
        ("COURIER_LEASE_SECS", "4"),
        ("COURIER_SHUTDOWN_GRACE_SECS", "3"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
        ("COURIER_RATE_LIMIT", "1000"),
        ("COURIER_RATE_LIMIT_WINDOW_SECS", "1"),
    ];
    let (first, addr) = spawn_serve(&proxy.url_for(&db.url), &settings);
    // Submitted through the process itself, so its key is in use there (and watched for
    // revocation) when the database goes silent, and a rate limit's windows are kept.
    for n in 0..SUBMISSIONS {
        let body: serde_json::Value = crate::support::http_client()
            .post(format!("http://{addr}/graphql"))
            .bearer_auth(&admin)
            .json(&serde_json::json!({
                "query": crate::support::fixtures::SUBMIT,
                "variables": { "input": { "endpointId": endpoint, "payload": { "n": n } } },
            }))
            .send()
            .await
            .expect("the process answers")
            .json()
            .await
            .expect("a JSON body");
        assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    }
    receiver
        .wait_for(SUBMISSIONS, Duration::from_secs(20))
        .await;

    proxy.partition();
    // Long enough for the periodic work (the revocation watcher's check of the keys in use)
    // to be waiting on the silent database when the signal comes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = std::time::Instant::now();
    assert_eq!(
        terminate(first, Duration::from_secs(30)).await,
        Some(0),
        "SIGTERM exits 0 with the database unreachable"
    );
    // Three seconds of grace, at most five more to record the last outcomes and two to
    // close connections, with room for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(13),
        "exited after {:?}",
        started.elapsed()
    );

    proxy.heal();
    let (second, _) = spawn_serve(&db.url, &settings);
    all_delivered(&api, SUBMISSIONS, Duration::from_secs(40)).await;
    assert_eq!(terminate(second, Duration::from_secs(10)).await, Some(0));
}

/// SIGTERM during start-up (here while another process holds the start-up's sealing turn)
/// stops it cleanly: exit 0, saying so, rather than the signal's default end (exit 143).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_exits_0() {
    let db = TestDb::new(Backend::Postgres).await;
    let other = db.connect(1).await;
    let held = other
        .session_lock(courier::service::sealing::SEALING_LOCK_KEY)
        .await
        .expect("the lock")
        .expect("PostgreSQL");
    let mut child = courier_command(&db.url)
        .args(["serve"])
        .env("COURIER_BIND", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier serve");
    let stderr = child.stderr.take().expect("stderr");
    let (said, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = said.send(line);
        }
    });
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|line: &String| line.contains("\"starting\""))
    {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("it says it starts: {seen:?}"));
        seen.push(line);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        terminate(child, Duration::from_secs(10)).await,
        Some(0),
        "SIGTERM during start-up exits 0"
    );
    // Everything it wrote, to the end of its stderr.
    seen.extend(lines.iter());
    assert!(
        seen.iter()
            .any(|line| line.contains("stopped before serving")),
        "{seen:?}"
    );
    drop(held);
}
