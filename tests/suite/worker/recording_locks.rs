//! Recorders in several processes settling outcomes of the same endpoints (retries, which
//! read an endpoint under the parking rule's share lock, beside failures and recoveries,
//! which write its run of failures, and keyed deliveries handing their lines on, which
//! share-lock it too) lock those endpoints in one order and never deadlock.

use std::time::Duration;

use serde_json::json;

use crate::support::fixtures::{count, endpoint_on, eventually, quick_worker, settle, submit};
use crate::support::ordering::submit_keyed;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// Deadlocks PostgreSQL broke in this test's database.
async fn deadlocks(db: &TestDb) -> i64 {
    let conn = db.connect(1).await;
    let sql = "SELECT deadlocks AS n FROM pg_stat_database WHERE datname = current_database()";
    count(&conn, sql, vec![]).await
}

/// How many deliveries are `delivered` and `failed`.
async fn settled(db: &courier::db::Db) -> (i64, i64) {
    let by_state = |state: &'static str| async move {
        let sql = format!("SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = '{state}'");
        count(db, &sql, vec![]).await
    };
    (by_state("delivered").await, by_state("failed").await)
}

/// Three instances, eight endpoints shared by all: a third of the deliveries always fail
/// (three attempts, then `failed`), a third fail once and then succeed, a third succeed.
/// Every outcome is recorded at its first try, and PostgreSQL breaks no deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorders_across_instances_lock_endpoints_in_one_order() {
    settle_across_instances(|_| None).await;
}

/// The same with ordering keys, each key used on every endpoint: every settled head hands
/// its line on, on endpoints whose other outcomes another recorder is settling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_recorders_across_instances_lock_endpoints_in_one_order() {
    settle_across_instances(|n| Some(format!("k{}", n % 10))).await;
}

/// Submits 240 deliveries (with the ordering key `key_of` gives each) through three
/// instances to eight endpoints, settles them as described above, and checks no recording
/// was retried and no deadlock broken.
async fn settle_across_instances(key_of: fn(usize) -> Option<String>) {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start_by_body(|body, nth| {
        let n = body["n"].as_u64().unwrap_or(0);
        let failing = match n % 3 {
            0 => true,
            1 => nth == 1,
            _ => false,
        };
        Reply::status(if failing { 500 } else { 200 })
    })
    .await;
    let configure = |config: &mut courier::config::ServeArgs| {
        quick_worker(config);
        config.retry_base_ms = Some(20);
        config.retry_max_ms = 100;
        config.disable_after_failures = 0;
    };
    let apps = std::sync::Arc::new([
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
    ]);
    let admin = apps[0].admin_token().await;
    let mut endpoints = Vec::new();
    for n in 0..8 {
        endpoints.push(endpoint_on(&apps[0], &admin, &receiver, &format!("shared-{n}")).await);
    }
    let endpoints = std::sync::Arc::new(endpoints);
    let mut submitters = tokio::task::JoinSet::new();
    for submitter in 0..6 {
        let (apps, admin, endpoints) = (apps.clone(), admin.clone(), endpoints.clone());
        submitters.spawn(async move {
            for k in 0..40 {
                let n = submitter * 40 + k;
                let (app, endpoint) = (&apps[n % 3], &endpoints[n % endpoints.len()]);
                match key_of(n) {
                    None => {
                        let body = submit(app, &admin, endpoint, json!({ "n": n }), None).await;
                        assert!(body["errors"].is_null(), "{body}");
                    }
                    Some(key) => {
                        submit_keyed(app, &admin, endpoint, json!({ "n": n }), Some(&key)).await;
                    }
                }
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.expect("a submitter");
    }
    let apps = std::sync::Arc::into_inner(apps).expect("the submitters are done");
    let counts = db.connect(1).await;
    eventually(
        "every delivery settles",
        Duration::from_secs(60),
        || async { settled(&counts).await.0 + settled(&counts).await.1 == 240 },
    )
    .await;
    assert_eq!(
        settled(&counts).await,
        (160, 80),
        "every delivery settled as its receiver said"
    );
    let retries: Vec<u64> = apps
        .iter()
        .map(|app| app.state.metrics.recording_retries.get())
        .collect();
    assert_eq!(
        retries,
        [0, 0, 0],
        "every batch of outcomes recorded at its first try"
    );
    settle(apps).await;
    counts.close().await.expect("close");
    // The instances' connections have closed, so their statistics are in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(deadlocks(&db).await, 0, "PostgreSQL broke no deadlock");
}
