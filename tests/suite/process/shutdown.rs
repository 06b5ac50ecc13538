//! SIGTERM, SIGHUP and Ctrl-C to the built binary: a graceful stop that loses nothing, within its
//! deadline even when the database has gone silent, during start-up, and at once on a
//! second signal.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::fixtures::endpoint_on;
use crate::support::fixtures::submit;
use crate::support::process::{courier_command, spawn_serve};
use crate::support::receiver::slow_first_attempt;
use crate::support::{Backend, PartitionProxy, Receiver, TestApp, TestDb};

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

/// Sends `signal` (a name `kill` knows: `TERM`, `INT`) to `child`.
fn send(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// The exit code of `child`, if it exits within `within` (else it is killed).
async fn exit_code_within(mut child: Child, within: Duration) -> Option<i32> {
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

/// Sends SIGTERM and returns the exit code, if the process exited within `within`.
async fn terminate(child: Child, within: Duration) -> Option<i32> {
    send(&child, "TERM");
    exit_code_within(child, within).await
}

/// `courier serve` on the SQLite default answers, and exits 0 on SIGTERM, and so on
/// SIGHUP (the terminal it was started from went away), rather than being killed by it.
#[tokio::test]
async fn serve_answers_and_exits_cleanly_on_sigterm() {
    let db = TestDb::new(Backend::Sqlite).await;
    for signal in ["TERM", "HUP"] {
        let (child, addr) = spawn_serve(&db.url, &[]);
        let health = crate::support::http_client()
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .expect("healthz answers");
        assert!(health.status().is_success());
        send(&child, signal);
        assert_eq!(
            exit_code_within(child, Duration::from_secs(10)).await,
            Some(0),
            "SIG{signal} exits 0"
        );
    }
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

/// A second signal during the grace period stops the process at once, with the code the
/// signal's default action gives (143 for SIGTERM, 130 for Ctrl-C), rather than waiting out
/// the grace for a request that hangs; the delivery cut short is sent again after its
/// lease by the next process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_at_once() {
    let db = TestDb::new(Backend::Postgres).await;
    // The first request for each delivery hangs far past the test.
    let receiver = Receiver::start(slow_first_attempt(Duration::from_secs(120))).await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "hangs").await;
    let settings = [
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_LEASE_SECS", "10"),
        ("COURIER_REQUEST_TIMEOUT_MS", "120000"),
        ("COURIER_SHUTDOWN_GRACE_SECS", "120"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
    ];

    for (second, code) in [("TERM", 143), ("INT", 130)] {
        let body = submit(
            &api,
            &admin,
            &endpoint,
            serde_json::json!({ "code": code }),
            None,
        )
        .await;
        assert_eq!(body["data"]["submit"]["created"], true, "{body}");
        let attempts = receiver.received().len();
        let (child, _) = spawn_serve(&db.url, &settings);
        receiver
            .wait_for(attempts + 1, Duration::from_secs(20))
            .await;
        send(&child, "TERM");
        // The first signal alone waits for the hanging request.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = std::time::Instant::now();
        send(&child, second);
        assert_eq!(
            exit_code_within(child, Duration::from_secs(10)).await,
            Some(code),
            "SIGTERM then SIG{second} stops at once"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "stopped {:?} after the second signal",
            started.elapsed()
        );
    }

    // Only first attempts hang: once their leases are over, a process that is left to run
    // delivers what the stopped ones were sending.
    let (last, _) = spawn_serve(&db.url, &settings);
    all_delivered(&api, 2, Duration::from_secs(40)).await;
    assert_eq!(terminate(last, Duration::from_secs(10)).await, Some(0));
}
