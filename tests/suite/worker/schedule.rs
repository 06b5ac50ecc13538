//! The retry schedule as the worker applies it, read back from the database without
//! waiting: after each failed attempt the planned delay is read, then the delivery is made
//! due at once, until the cycle ends.

use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::config::{RetrySchedule, ServeArgs};
use courier::worker::schedule::{DEFAULT_DELAYS, JITTER_FRACTION};
use sea_orm::Value as SqlValue;
use serde_json::json;
use uuid::Uuid;

use crate::support::fixtures::{delivery_id, endpoint_on, poll, rows, submit, wait_for_state};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// Quick polling, but the retry settings left as given.
fn polling_fast(config: &mut ServeArgs) {
    config.worker_concurrency = 4;
    config.poll_interval_ms = 50;
    config.request_timeout_ms = 2_000;
    config.lease_secs = 10;
    config.shutdown_grace_secs = 5;
}

/// Runs one delivery to a receiver that always fails through two instances configured by
/// `configure`, skipping every wait; returns the delay planned after each failed attempt
/// and checks the cycle ended `FAILED` after `attempts` attempts.
async fn planned_delays(configure: fn(&mut ServeArgs), attempts: usize) -> Vec<Duration> {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let apps = [
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "down").await;
    let endpoint_id = Uuid::parse_str(&endpoint).expect("uuid");
    let id = delivery_id(&submit(&apps[1], &admin, &endpoint, json!({ "down": true }), None).await);
    let delivery = Uuid::parse_str(&id).expect("uuid");
    let pool = &apps[0].state.db;
    let mut delays = Vec::new();
    for failed in 1..attempts {
        let planned = poll(
            &format!("attempt {failed} fails and plans a retry"),
            Duration::from_secs(20),
            || async {
                let row = &rows(
                    pool,
                    "SELECT state, cycle_attempts, next_attempt_at, updated_at \
                     FROM webhook_deliveries WHERE id = $1",
                    vec![SqlValue::from(delivery)],
                )
                .await[0];
                let state: String = row.try_get("", "state").expect("state");
                let cycle: i32 = row.try_get("", "cycle_attempts").expect("count");
                let due: Option<DateTime<Utc>> = row.try_get("", "next_attempt_at").expect("due");
                let at: DateTime<Utc> = row.try_get("", "updated_at").expect("at");
                match due {
                    Some(due) if state == "pending" && cycle == failed as i32 => {
                        Ok((due - at).to_std().expect("a delay ahead"))
                    }
                    _ => Err(format!("{state} after {cycle}")),
                }
            },
        )
        .await;
        delays.push(planned);
        // Skip the wait: due now, and the endpoint's turn with it.
        rows(
            pool,
            "UPDATE webhook_deliveries SET next_attempt_at = updated_at WHERE id = $1",
            vec![SqlValue::from(delivery)],
        )
        .await;
        courier::service::flow::wake_endpoints(pool.conn(), pool.backend(), &[endpoint_id])
            .await
            .expect("wake");
    }
    let ended = wait_for_state(&apps[0], &admin, &id, "FAILED", Duration::from_secs(20)).await;
    assert_eq!(
        ended["attempts"].as_array().map(Vec::len),
        Some(attempts),
        "{ended}"
    );
    assert_eq!(receiver.received().len(), attempts);
    delays
}

/// Each planned delay is the nominal one shortened by at most the jitter.
fn assert_jittered(planned: &[Duration], nominal: &[Duration]) {
    assert_eq!(planned.len(), nominal.len());
    for (n, (planned, nominal)) in planned.iter().zip(nominal).enumerate() {
        let shortest = nominal.mul_f64(1.0 - JITTER_FRACTION) - Duration::from_millis(1);
        assert!(
            *planned <= *nominal + Duration::from_millis(1) && *planned >= shortest,
            "retry {}: planned {planned:?}, nominal {nominal:?}",
            n + 1
        );
    }
}

/// With default settings a cycle is ten attempts over more than a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_schedule_retries_for_more_than_a_day() {
    let planned = planned_delays(polling_fast, DEFAULT_DELAYS.len() + 1).await;
    assert_jittered(&planned, &DEFAULT_DELAYS);
    let span: Duration = planned.iter().sum();
    assert!(
        span >= Duration::from_secs(24 * 3_600),
        "the cycle spans {span:?}"
    );
}

/// A listed schedule overrides COURIER_MAX_ATTEMPTS: its delays, its number of attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listed_schedule_sets_the_delays_and_the_attempts() {
    let planned = planned_delays(
        |config| {
            polling_fast(config);
            config.max_attempts = Some(7);
            config.retry_schedule = Some(RetrySchedule(vec![
                Duration::from_secs(90),
                Duration::from_secs(4 * 3_600),
            ]));
        },
        3,
    )
    .await;
    assert_jittered(
        &planned,
        &[Duration::from_secs(90), Duration::from_secs(4 * 3_600)],
    );
}

/// Doubling keeps working when only COURIER_RETRY_BASE_MS is set (eight attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doubling_from_a_base_still_works_alone() {
    let planned = planned_delays(
        |config| {
            polling_fast(config);
            config.retry_base_ms = Some(60_000);
            config.retry_max_ms = 3_600_000;
        },
        8,
    )
    .await;
    let nominal: Vec<Duration> = [1, 2, 4, 8, 16, 32, 60]
        .iter()
        .map(|minutes| Duration::from_secs(minutes * 60))
        .collect();
    assert_jittered(&planned, &nominal);
}
