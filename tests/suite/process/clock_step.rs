//! A host whose wall clock is stepped while Courier runs (an NTP correction, a virtual
//! machine resumed): what it stamps keeps the database's time at once. Before, its stamps
//! moved with the step until the next measurement of the database's clock, up to a minute
//! later, and every webhook signed meanwhile failed the official verifier (ten minutes off,
//! where it allows five).

use std::time::Duration;

use serde_json::json;

use crate::support::process::{admin_token, courier_command, libfaketime, start_serve, Served};
use crate::support::{Backend, Receiver, TestDb};

const SUBMIT: &str =
    "mutation($id: ID!, $n: JSON!) { submit(input: {endpointId: $id, payload: $n}) { created } }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_stepped_while_running_changes_no_stamp() {
    let db = TestDb::new(Backend::Postgres).await;
    let token = admin_token(&db).await;
    let dir = std::env::temp_dir().join(format!("courier-clock-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let clock = dir.join("faketime");
    std::fs::write(&clock, "+0s").expect("the clock's offset");

    // The wall clock read from the file (again each second); the monotonic one left true,
    // as a step leaves it.
    let mut command = courier_command(&db.url);
    command
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &clock)
        .env("FAKETIME_CACHE_DURATION", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let settings = [
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_WORKER_CONCURRENCY", "4"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
    ];
    let (child, addr, _) = start_serve(command, &settings);
    let served = Served::new(child, addr);
    let receiver = Receiver::accepting().await;
    let endpoint = served.create_endpoint(&token, &receiver, "hook", &[]).await;

    served
        .graphql(&token, SUBMIT, json!({ "id": endpoint, "n": 0 }))
        .await;
    receiver.wait_for(1, Duration::from_secs(20)).await;

    // The host's wall clock jumps ten minutes ahead; libfaketime reads it within a second.
    std::fs::write(&clock, "+600s").expect("the clock stepped");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for n in 1..=3 {
        served
            .graphql(&token, SUBMIT, json!({ "id": endpoint, "n": n }))
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let received = receiver.wait_for(4, Duration::from_secs(20)).await;
    let now = chrono::Utc::now().timestamp();
    for webhook in &received {
        assert!(
            webhook.verified,
            "the official verifier accepts every webhook: {}",
            webhook.timestamp
        );
        assert!(
            (webhook.timestamp_secs - now).abs() < 30,
            "webhook-timestamp {} is the database's time, not the stepped clock's",
            webhook.timestamp
        );
    }
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}
