//! Replays of one endpoint's keyed lines at once, on two processes (bulk replays, single
//! replays, beside new keyed submissions and the recordings of their outcomes), take the
//! endpoint in one order and never deadlock: each rejoins lines, updating rows of a line
//! in its own order, and two holding the endpoint at once deadlocked on those rows (tens
//! of times in 30 s, stalling submissions and replays for seconds, some answered
//! `SERVICE_UNAVAILABLE`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fixtures::{endpoint_on, failing_at_once, settle};
use crate::support::ordering::{id_of, submit_keyed};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

const REPLAY_ALL: &str =
    "mutation($f: ReplayFilter!) { replayDeliveries(filter: $f) { replayed } }";
const REPLAY_ONE: &str = "mutation($id: ID!) { replayDelivery(id: $id) { id } }";

/// How long the replays and submissions go on.
const RACING: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_of_keyed_lines_at_once_never_deadlock() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let apps = [
        TestApp::spawn_with(&db, failing_at_once).await,
        TestApp::spawn_with(&db, failing_at_once).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "down").await;
    let mut failed = Vec::new();
    for n in 0..60 {
        let key = format!("k{}", n % 12);
        let submitted = submit_keyed(
            &apps[n % 2],
            &admin,
            &endpoint,
            json!({ "n": n }),
            Some(&key),
        )
        .await;
        failed.push(id_of(&submitted));
    }

    let until = Instant::now() + RACING;
    let [first, second] = &apps;
    let loops = tokio::join!(
        bulk(first, &admin, &endpoint, until),
        bulk(second, &admin, &endpoint, until),
        bulk(first, &admin, &endpoint, until),
        bulk(second, &admin, &endpoint, until),
        single(first, &admin, &failed, 0, until),
        single(second, &admin, &failed, 3, until),
        submitting(first, &admin, &endpoint, 100, until),
        submitting(second, &admin, &endpoint, 200, until),
    );
    let refusals: Vec<String> = [
        loops.0, loops.1, loops.2, loops.3, loops.4, loops.5, loops.6, loops.7,
    ]
    .concat();
    assert!(refusals.is_empty(), "answers refused: {refusals:?}");

    let [first, second] = apps;
    settle([first, second]).await;
    assert_eq!(db.deadlocks().await, 0, "PostgreSQL broke no deadlock");
}

/// The answer's error, unless it has none or one of the `expected` codes.
fn refused(answer: &Value, expected: &[&str]) -> Option<String> {
    let code = answer["errors"][0]["extensions"]["code"].as_str()?;
    (!expected.contains(&code)).then(|| answer.to_string())
}

/// Bulk replays of the endpoint's failures, one after the other until `until`.
async fn bulk(app: &TestApp, admin: &str, endpoint: &str, until: Instant) -> Vec<String> {
    let mut refusals = Vec::new();
    while Instant::now() < until {
        let filter = json!({ "f": { "endpointId": endpoint } });
        let answer = app.graphql(admin, REPLAY_ALL, filter).await;
        refusals.extend(refused(&answer, &[]));
    }
    refusals
}

/// Replays of single deliveries among `failed` (some no longer failed) until `until`.
async fn single(
    app: &TestApp,
    admin: &str,
    failed: &[String],
    mut n: usize,
    until: Instant,
) -> Vec<String> {
    let mut refusals = Vec::new();
    while Instant::now() < until {
        let id = &failed[n % failed.len()];
        let answer = app.graphql(admin, REPLAY_ONE, json!({ "id": id })).await;
        refusals.extend(refused(&answer, &["DELIVERY_NOT_REPLAYABLE"]));
        n += 7;
    }
    refusals
}

/// Keyed submissions to the endpoint until `until`.
async fn submitting(
    app: &TestApp,
    admin: &str,
    endpoint: &str,
    mut n: usize,
    until: Instant,
) -> Vec<String> {
    let mut refusals = Vec::new();
    while Instant::now() < until {
        let key = format!("k{}", n % 12);
        let answer = submit_keyed(app, admin, endpoint, json!({ "n": n }), Some(&key)).await;
        refusals.extend(refused(&answer, &[]));
        n += 1;
    }
    refusals
}
