//! A recording of successes alone takes the endpoint rows whose run of failures it ends
//! before its deliveries, the order every other writer of both takes them in (PostgreSQL).
//! Taken after, a success held its delivery while it waited for the endpoint, which a late
//! outcome of the same delivery from another process (or a replay) held while it waited for
//! the delivery: PostgreSQL broke the deadlock after a second.

use std::time::Duration;

use courier::worker::claim::claim_due;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};
use serde_json::json;

use crate::support::fixtures::{count, events_for, eventually, rows, submit, LONG_LEASE};
use crate::support::{Backend, TestApp, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_locks_the_endpoint_it_heals_before_its_delivery() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let submitted = submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await;
    assert!(submitted["errors"].is_null(), "{submitted}");
    // An endpoint with a run of failures, which this success ends.
    rows(
        &app.state.db,
        &format!("UPDATE endpoints SET consecutive_failures = 3 WHERE id = '{endpoint}'"),
        vec![],
    )
    .await;
    let pool = &app.state.db;
    let claims = claim_due(pool, &events_for(pool), 1, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1);
    let delivery = claims[0].delivery_id;

    // Another session holds the endpoint (as a late outcome or a replay does first).
    let other = db.connect(1).await;
    let txn = other.conn().begin().await.expect("begin");
    txn.execute_raw(Statement::from_string(
        sea_orm::DbBackend::Postgres,
        format!("SELECT id FROM endpoints WHERE id = '{endpoint}' FOR NO KEY UPDATE"),
    ))
    .await
    .expect("hold the endpoint");

    let now = courier::db::now();
    let success = FinishedAttempt {
        claim: claims[0].clone(),
        outcome: AttemptOutcome {
            status: Some(200),
            error: None,
            retry_after: None,
            duration: Duration::from_millis(2),
            kind: OutcomeKind::HttpStatus,
            answer: None,
        },
        step: NextStep::Delivered,
        started_at: now,
        finished_at: now,
    };
    let recorder = {
        let (pool, events) = (pool.clone(), events_for(pool));
        tokio::spawn(
            async move { record(&pool, &events, HealthPolicy::default(), &[success]).await },
        )
    };
    // The recording is waiting for a lock the other session holds.
    let watcher = db.connect(1).await;
    eventually("the recording waits", Duration::from_secs(10), || async {
        count(
            &watcher,
            "SELECT COUNT(*) AS n FROM pg_locks WHERE NOT granted",
            vec![],
        )
        .await
            > 0
    })
    .await;
    // The other session now takes the delivery, as a late outcome of it would: it is free,
    // since the recording waits for the endpoint before touching it.
    let took = tokio::time::timeout(
        Duration::from_secs(30),
        txn.execute_raw(Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!("SELECT id FROM webhook_deliveries WHERE id = '{delivery}' FOR UPDATE"),
        )),
    )
    .await
    .expect("no wait");
    assert!(took.is_ok(), "the other session was failed: {took:?}");
    txn.commit().await.expect("commit");
    let recorded = recorder.await.expect("the recorder").expect("recorded");
    assert_eq!(recorded.len(), 1);
    let healed = count(
        pool,
        &format!("SELECT consecutive_failures::int8 AS n FROM endpoints WHERE id = '{endpoint}'"),
        vec![],
    )
    .await;
    assert_eq!(healed, 0, "the success ended the run");
    assert_eq!(db.deadlocks().await, 0, "PostgreSQL broke no deadlock");
}
