//! Retention: settled deliveries older than the retention go with their attempts and
//! submissions, in batches that skip rows others hold; pending and processing rows stay.

use std::time::Duration;

use courier::worker::retention::prune_batch;
use sea_orm::Value as SqlValue;
use serde_json::json;
use uuid::Uuid;

use crate::on_both_backends;
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::submit;
use crate::support::fixtures::{count, eventually, prune_expired, rows};
use crate::support::fixtures::{quick_worker, wait_for_state};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// Moves deliveries' timestamps `days` into the past.
async fn age(app: &TestApp, ids: &[&str], days: i64) {
    let past = courier::db::now() - chrono::Duration::days(days);
    for id in ids {
        let id: Uuid = id.parse().unwrap();
        rows(
            &app.state.db,
            "UPDATE webhook_deliveries SET created_at = $1, updated_at = $1 WHERE id = $2",
            vec![past.into(), id.into()],
        )
        .await;
    }
}

async fn exists(app: &TestApp, table: &str, column: &str, id: &str) -> bool {
    let id: Uuid = id.parse().unwrap();
    let sql = format!("SELECT COUNT(*) AS n FROM {table} WHERE {column} = $1");
    count(&app.state.db, &sql, vec![SqlValue::from(id)]).await > 0
}

/// The submission id of a delivery.
async fn submission_of(app: &TestApp, delivery: &str) -> String {
    let id: Uuid = delivery.parse().unwrap();
    let found = rows(
        &app.state.db,
        "SELECT submission_id FROM webhook_deliveries WHERE id = $1",
        vec![id.into()],
    )
    .await;
    found[0]
        .try_get::<Uuid>("", "submission_id")
        .unwrap()
        .to_string()
}

/// Settles two deliveries (one delivered, one failed) and leaves two unsettled (one
/// pending, one processing), all aged 40 days, plus a recent delivered one.
async fn fixtures(db: &TestDb) -> (TestApp, String, [String; 2], [String; 2], String) {
    let worker = TestApp::spawn_with(db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = worker.admin_token().await;
    let ok = Receiver::accepting().await;
    let bad = Receiver::start(|_| Reply::status(500)).await;
    let (good, _) = worker.create_endpoint(&admin, &ok.url("ok")).await;
    let (failing, _) = worker.create_endpoint(&admin, &bad.url("bad")).await;
    let delivered = delivery_id(&submit(&worker, &admin, &good, json!({ "a": 1 }), None).await);
    let recent = delivery_id(&submit(&worker, &admin, &good, json!({ "a": 2 }), None).await);
    let failed = delivery_id(&submit(&worker, &admin, &failing, json!({ "a": 3 }), None).await);
    for (id, state) in [
        (&delivered, "DELIVERED"),
        (&recent, "DELIVERED"),
        (&failed, "FAILED"),
    ] {
        wait_for_state(&worker, &admin, id, state, Duration::from_secs(10)).await;
    }
    worker.stop().await;

    let api = TestApp::spawn(db).await;
    let pending = delivery_id(&submit(&api, &admin, &good, json!({ "a": 4 }), None).await);
    let processing = delivery_id(&submit(&api, &admin, &good, json!({ "a": 5 }), None).await);
    let processing_id: Uuid = processing.parse().unwrap();
    rows(
        &api.state.db,
        "UPDATE webhook_deliveries SET state = 'processing', claim_token = $1 WHERE id = $2",
        vec![Uuid::now_v7().into(), processing_id.into()],
    )
    .await;
    age(&api, &[&delivered, &failed, &pending, &processing], 40).await;
    (
        api,
        admin,
        [delivered, failed],
        [pending, processing],
        recent,
    )
}

async fn settled_deliveries_past_retention_go_with_their_attempts_and_submissions(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let (app, admin, old, unsettled, recent) = fixtures(&db).await;
    let old_submissions = [
        submission_of(&app, &old[0]).await,
        submission_of(&app, &old[1]).await,
    ];
    for id in &old {
        assert!(exists(&app, "delivery_attempts", "delivery_id", id).await);
    }

    let pruned = prune_expired(&app.state.db).await;
    assert_eq!(pruned, 2, "the two old settled deliveries");
    for (delivery, submission) in old.iter().zip(&old_submissions) {
        assert!(!exists(&app, "webhook_deliveries", "id", delivery).await);
        assert!(!exists(&app, "delivery_attempts", "delivery_id", delivery).await);
        assert!(!exists(&app, "submissions", "id", submission).await);
        let body = app
            .graphql(
                &admin,
                "query($id: ID!) { delivery(id: $id) { id } }",
                json!({ "id": delivery }),
            )
            .await;
        assert!(body["data"]["delivery"].is_null(), "{body}");
    }
    for id in unsettled.iter().chain([&recent]) {
        assert!(
            exists(&app, "webhook_deliveries", "id", id).await,
            "kept {id}"
        );
    }
    assert!(exists(&app, "delivery_attempts", "delivery_id", &recent).await);
    assert_eq!(prune_expired(&app.state.db).await, 0);

    // The pruner of a running instance does the same on its own.
    age(&app, &[&recent], 40).await;
    app.stop().await;
    let pruning = TestApp::spawn_with(&db, |config| config.prune_interval_secs = 1).await;
    let db_handle = &pruning.state.db;
    let recent_id: Uuid = recent.parse().unwrap();
    eventually(
        "the running pruner deletes it",
        Duration::from_secs(10),
        || async {
            count(
                db_handle,
                "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE id = $1",
                vec![recent_id.into()],
            )
            .await
                == 0
        },
    )
    .await;
    let left = count(
        db_handle,
        "SELECT COUNT(*) AS n FROM webhook_deliveries",
        vec![],
    )
    .await;
    assert_eq!(left, 2, "pending and processing are never pruned");
}

on_both_backends!(settled_deliveries_past_retention_go_with_their_attempts_and_submissions);

/// Pruning takes small batches and skips rows another transaction holds, never waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_skips_rows_others_hold_and_goes_in_small_batches() {
    let db = TestDb::new(Backend::Postgres).await;
    let (app, _, old, _, _) = fixtures(&db).await;
    let holder = db.connect(1).await;
    let held: Uuid = old[0].parse().unwrap();
    let txn = holder.begin_write().await.unwrap();
    sea_orm::ConnectionTrait::execute_raw(
        &txn,
        sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT id FROM webhook_deliveries WHERE id = $1 FOR UPDATE",
            [held.into()],
        ),
    )
    .await
    .unwrap();

    let pruned = tokio::time::timeout(Duration::from_secs(5), prune_batch(&app.state.db, 30, 1))
        .await
        .expect("pruning never waits on a held row")
        .unwrap();
    assert_eq!(pruned, 1, "the other old delivery");
    assert!(
        exists(&app, "webhook_deliveries", "id", &old[0]).await,
        "held row skipped"
    );
    assert!(!exists(&app, "webhook_deliveries", "id", &old[1]).await);
    txn.rollback().await.unwrap();
    assert_eq!(prune_batch(&app.state.db, 30, 1).await.unwrap(), 1);
    assert_eq!(prune_batch(&app.state.db, 30, 1).await.unwrap(), 0);
}
