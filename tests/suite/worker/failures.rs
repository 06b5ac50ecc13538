//! Failures stay small: an outcome the database refuses to record holds up no other, a
//! submission whose answer was lost after it committed is recognised by its pre-minted ids,
//! and a receiver slower than the lease gets the cycle's attempts, not a request per lease
//! forever.

use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{delivery_id, expire_leases};
use crate::support::fixtures::{endpoint_on, quick_worker, wait_for_state};
use crate::support::fixtures::{eventually, row_counts, submit, submit_as_one_group};
use crate::support::{Backend, PartitionProxy, Receiver, Reply, TestApp, TestDb};

/// Makes the database refuse to record any attempt answered with HTTP 418.
async fn refuse_teapots(app: &TestApp) {
    let sql = match app.state.db.backend() {
        sea_orm::DbBackend::Postgres => {
            "ALTER TABLE delivery_attempts ADD CONSTRAINT no_teapots CHECK (status_code IS DISTINCT FROM 418)"
        }
        _ => {
            "CREATE TRIGGER no_teapots BEFORE INSERT ON delivery_attempts \
             WHEN NEW.status_code = 418 BEGIN SELECT RAISE(ABORT, 'no teapots'); END"
        }
    };
    app.state
        .db
        .conn()
        .execute_unprepared(sql)
        .await
        .expect("refuse teapots");
}

/// One outcome the database refuses (recorded first, alone) and one refused among others
/// (recorded in a batch with them): every other outcome is recorded at once, and only the
/// refused two are given up, to be reclaimed after their lease.
async fn a_refused_outcome_holds_up_no_other(backend: Backend) {
    const GOOD: usize = 5;
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    refuse_teapots(&app).await;
    let teapot = Receiver::start(|_| Reply::status(418)).await;
    let slow = Duration::from_millis(100);
    let slow_teapot = Receiver::start(move |_| Reply {
        delay: slow,
        ..Reply::status(418)
    })
    .await;
    let accepting = Receiver::start(move |_| Reply {
        delay: slow,
        ..Reply::status(200)
    })
    .await;
    let teapot_endpoint = endpoint_on(&app, &admin, &teapot, "teapot").await;
    let slow_teapot_endpoint = endpoint_on(&app, &admin, &slow_teapot, "slow").await;
    let good_endpoint = endpoint_on(&app, &admin, &accepting, "good").await;

    let started = Instant::now();
    let first = delivery_id(&submit(&app, &admin, &teapot_endpoint, json!({}), None).await);
    let mut good = Vec::new();
    for n in 0..GOOD {
        good.push(delivery_id(
            &submit(&app, &admin, &good_endpoint, json!({ "n": n }), None).await,
        ));
    }
    let second = delivery_id(&submit(&app, &admin, &slow_teapot_endpoint, json!({}), None).await);

    for id in &good {
        let delivery = wait_for_state(&app, &admin, id, "DELIVERED", Duration::from_secs(5)).await;
        assert_eq!(delivery["attempts"].as_array().map(Vec::len), Some(1));
    }
    let given_up = &app.state.metrics.outcomes_given_up;
    eventually(
        "both refusals are given up",
        Duration::from_secs(5),
        || async { given_up.get() >= 2 },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "recorded within seconds, not minutes: {:?}",
        started.elapsed()
    );
    assert_eq!(given_up.get(), 2, "only the refused outcomes are given up");
    for id in [&first, &second] {
        let refused = wait_for_state(&app, &admin, id, "PROCESSING", Duration::from_secs(1)).await;
        assert_eq!(refused["attempts"], json!([]), "{refused}");
    }
}

/// A receiver that answers every request after 2.5 s, behind a lease of one second: each
/// claim's lease runs out before its answer, and every retake counts the lost request as an
/// attempt. The receiver gets the cycle's three attempts, then the delivery fails without a
/// fourth request (before, it got one per lease, forever, and never settled); the late
/// answers are recorded as superseded.
async fn a_receiver_slower_than_the_lease_gets_the_cycles_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(crate::support::receiver::answering_after(
        Duration::from_millis(2_500),
    ))
    .await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.lease_secs = 1;
        config.request_timeout_ms = 8_000;
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "slow").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await);
    let failed = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(30)).await;
    assert_eq!(
        receiver.received().len(),
        3,
        "the cycle's three attempts: {failed}"
    );
    // The worker keeps looking for more than a lease, and sends nothing more.
    let rounds = app.state.metrics.claim_rounds.get();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        app.state.metrics.claim_rounds.get() > rounds,
        "the worker looked"
    );
    assert_eq!(
        receiver.received().len(),
        3,
        "nothing was sent after it failed"
    );
    assert_eq!(
        failed["cycleAttempts"], 3,
        "three attempts, no more: {failed}"
    );
    assert!(
        failed["lastError"]
            .as_str()
            .is_some_and(|error| error.contains("attempts are spent")),
        "{failed}"
    );
    // The attempts are the three requests, their late answers recorded as superseded in
    // the order they came, numbered 1 to 3: ending the cycle made no attempt of its own.
    eventually(
        "the late answers are recorded as superseded",
        Duration::from_secs(10),
        || async {
            let body = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(1)).await;
            let attempts = body["attempts"].as_array().cloned().unwrap_or_default();
            let numbers: Vec<i64> = attempts
                .iter()
                .filter_map(|a| a["number"].as_i64())
                .collect();
            attempts.len() == 3
                && attempts.iter().all(|a| a["superseded"] == true)
                && numbers == [1, 2, 3]
        },
    )
    .await;
}

/// A claim that found its cycle's attempts spent makes no request; should its outcome
/// (`FAILED`) not be recorded within its own lease (a busy recorder, a process that
/// stopped), the claim that retakes it adds no attempt for it: the delivery still ends
/// with the cycle's attempts (before, each such retake added one, and `cycleAttempts`
/// went past the cycle).
async fn retaking_a_spent_cycle_adds_no_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "spent").await;
    let id = delivery_id(&submit(&api, &admin, &endpoint, json!({ "n": 1 }), None).await);
    // As a claim that found the cycle's three attempts spent (the last outlived its lease)
    // leaves it when its own lease runs out before its outcome is recorded.
    {
        use entity::webhook_delivery::{DeliveryState, Entity};
        use sea_orm::{ActiveModelTrait as _, EntityTrait as _, IntoActiveModel as _, Set};
        let pool = &api.state.db;
        let uuid = uuid::Uuid::parse_str(&id).expect("a delivery id");
        let row = Entity::find_by_id(uuid)
            .one(pool.conn())
            .await
            .expect("read the delivery")
            .expect("the delivery");
        let lease = chrono::Utc::now() + chrono::Duration::minutes(1);
        let mut row = row.into_active_model();
        row.state = Set(DeliveryState::Processing);
        row.cycle_attempts = Set(3);
        row.claim_token = Set(Some(uuid::Uuid::new_v4()));
        row.claim_expires_at = Set(Some(lease));
        row.next_attempt_at = Set(Some(lease));
        row.update(pool.conn()).await.expect("hold the delivery");
        expire_leases(pool).await;
    }
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    let failed = wait_for_state(&worker, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    assert_eq!(
        failed["cycleAttempts"], 3,
        "the cycle's three attempts, no more: {failed}"
    );
    assert!(
        failed["lastError"]
            .as_str()
            .is_some_and(|error| error.contains("attempts are spent")),
        "{failed}"
    );
    assert_eq!(
        failed["attempts"],
        json!([]),
        "no attempt recorded: {failed}"
    );
    assert!(receiver.received().is_empty(), "no request made");
}

on_both_backends!(
    a_refused_outcome_holds_up_no_other,
    a_receiver_slower_than_the_lease_gets_the_cycles_attempts,
    retaking_a_spent_cycle_adds_no_attempt
);

/// The connection drops after a submission's statement was sent and committed, before its
/// answer arrives, once in a group statement and once alone: every caller gets its stored
/// submission (neither `SERVICE_UNAVAILABLE` nor an internal error), and nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_after_commit_is_recognised_by_its_ids() {
    const MARKER: &str = "lost-answer-marker";
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let pool = Db::connect(&proxy.plain_url_for(&db.url), 5)
        .await
        .expect("connect through the proxy");
    let app = TestApp::spawn_on(pool, |_| {}).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;

    proxy.lose_answer_to(MARKER);
    let calls = (0..8)
        .map(|n| {
            let (app, admin, endpoint) = (&app, admin.clone(), endpoint.clone());
            async move {
                let (payload, key) = match n {
                    0 => (json!({ "note": MARKER }), None),
                    1 => (json!({ "n": n }), Some(format!("key-{n}"))),
                    _ => (json!({ "n": n }), None),
                };
                submit(app, &admin, &endpoint, payload, key.as_deref()).await
            }
        })
        .collect();
    let answers = submit_as_one_group(&db, &app, &admin, calls).await;
    assert_eq!(
        proxy.answers_lost(),
        1,
        "the group statement lost its answer"
    );
    assert_eq!(app.state.metrics.submission_group_writes.get(), 1);

    proxy.lose_answer_to(MARKER);
    let alone = submit(
        &app,
        &admin,
        &endpoint,
        json!({ "note": MARKER, "alone": true }),
        Some("alone"),
    )
    .await;
    assert_eq!(
        proxy.answers_lost(),
        2,
        "the lone statement lost its answer"
    );

    let mut ids = std::collections::HashSet::new();
    for answer in answers.iter().chain([&alone]) {
        assert_eq!(answer["data"]["submit"]["created"], true, "{answer}");
        ids.insert(answer["data"]["submit"]["submission"]["id"].clone());
    }
    assert_eq!(ids.len(), 9);
    // The gate's submission, eight in the group, one alone: each once.
    assert_eq!(row_counts(&app).await, (10, 10));
    let retry = submit(
        &app,
        &admin,
        &endpoint,
        json!({ "note": MARKER, "alone": true }),
        Some("alone"),
    )
    .await;
    assert_eq!(retry["data"]["submit"]["created"], false, "{retry}");
    assert_eq!(
        retry["data"]["submit"]["submission"]["id"],
        alone["data"]["submit"]["submission"]["id"]
    );
}
