//! Fixtures many test files share: GraphQL submissions, quick worker settings, waiting for
//! the workers to settle, the one polling helper, raw counts, and recording outcomes
//! directly for the claim tests.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::config::ServeArgs;
use courier::db::Db;
use courier::worker::claim::Claim;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use sea_orm::{ConnectionTrait, QueryResult, Statement, Value as SqlValue};
use serde_json::{json, Value};

use super::TestApp;

pub const SUBMIT: &str = "mutation($input: SubmitInput!) { submit(input: $input) { created submission { id idempotencyKey payload endpoint { id } delivery { id } } delivery { id state cycleAttempts nextAttemptAt } } }";

/// Submits and returns the whole response body.
pub async fn submit(
    app: &TestApp,
    token: &str,
    endpoint_id: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "endpointId": endpoint_id, "payload": payload, "idempotencyKey": key });
    app.graphql(token, SUBMIT, json!({ "input": input })).await
}

/// Worker settings that make tests quick: fast polling, short backoff, three attempts.
pub fn quick_worker(config: &mut ServeArgs) {
    config.worker_concurrency = 8;
    config.poll_interval_ms = 50;
    config.retry_base_ms = 50;
    config.retry_max_ms = 2_000;
    config.max_attempts = 3;
    config.request_timeout_ms = 2_000;
    config.lease_secs = 10;
    config.shutdown_grace_secs = 5;
}

/// For "never sent twice" checks, before counting what a receiver got: waits until no
/// delivery is due or held by a claim, gives the workers a few more polls (anything they
/// should not claim, they would claim now), then stops them, which lets every request
/// already on its way arrive. A duplicate can only come later than this from a lease
/// retaken after it expired, and a delivery that is settled holds no lease.
pub async fn settle(apps: impl IntoIterator<Item = TestApp>) {
    let apps: Vec<TestApp> = apps.into_iter().collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let open = apps[0]
            .state
            .db
            .conn()
            .query_one_raw(sea_orm::Statement::from_string(
                apps[0].state.db.backend(),
                "SELECT COUNT(*) AS n FROM webhook_deliveries \
                 WHERE state = 'processing' OR (state = 'pending' AND next_attempt_at IS NOT NULL)",
            ))
            .await
            .expect("count open deliveries")
            .expect("a row")
            .try_get::<i64>("", "n")
            .expect("n");
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} deliveries never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let polls = apps
        .iter()
        .map(|app| app.state.config.poll_interval_ms)
        .max()
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(polls * 10)).await;
    for app in apps {
        app.stop().await;
    }
}

/// Waits until `check` holds, or panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `COUNT(*) AS n` query's count.
pub async fn count(db: &Db, sql: &str, values: Vec<SqlValue>) -> i64 {
    rows(db, sql, values).await[0]
        .try_get::<i64>("", "n")
        .expect("a count")
}

/// Runs one SQL statement and returns its rows.
pub async fn rows(db: &Db, sql: &str, values: Vec<SqlValue>) -> Vec<QueryResult> {
    db.conn()
        .query_all_raw(Statement::from_sql_and_values(db.backend(), sql, values))
        .await
        .expect("query")
}

pub const LONG_LEASE: Duration = Duration::from_secs(60);

/// A publisher for changes made through `pool` (nobody subscribes in these tests).
pub fn events_for(pool: &Db) -> courier::bus::ChangeBus {
    courier::bus::ChangeBus::new(
        pool.backend(),
        Arc::new(courier::metrics::Metrics::default()),
    )
}

pub fn outcome(succeeded: bool) -> AttemptOutcome {
    AttemptOutcome {
        status: Some(if succeeded { 200 } else { 500 }),
        error: (!succeeded).then(|| "HTTP 500".to_owned()),
        retry_after: None,
        duration: Duration::from_millis(3),
        kind: if succeeded {
            OutcomeKind::Success
        } else {
            OutcomeKind::HttpStatus
        },
    }
}

pub async fn record_result(
    pool: &Db,
    claim: &Claim,
    succeeded: bool,
) -> courier::worker::record::Recorded {
    let outcome = outcome(succeeded);
    let step = if succeeded {
        NextStep::Delivered
    } else {
        NextStep::RetryAfter(Duration::from_secs(1))
    };
    let now = courier::db::now();
    record(
        pool,
        &events_for(pool),
        HealthPolicy::default(),
        &[FinishedAttempt {
            claim: claim.clone(),
            outcome,
            step,
            started_at: now,
            finished_at: now,
        }],
    )
    .await
    .expect("record")
    .pop()
    .expect("one result per attempt")
}
