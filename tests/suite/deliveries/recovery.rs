//! Recovering from a receiver's outage: bulk replay (racing itself and single replays, on
//! two instances), its filters and window, and partners' scope.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::auth::Role;
use courier::service::deliveries::REPLAY_BATCH;
use sea_orm::ActiveEnum as _;
use sea_orm::Value as SqlValue;
use serde_json::{json, Value};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::on_both_backends;
use crate::support::fixtures::{
    count, delivery, delivery_id, endpoint_on, eventually, quick_worker, rows, settle, submit,
};
use crate::support::seeding::seed_spread;
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

const REPLAY_ALL: &str =
    "mutation($filter: ReplayFilter!) { replayDeliveries(filter: $filter) { replayed } }";
const REPLAY: &str = "mutation($id: ID!) { replayDelivery(id: $id) { id state } }";
/// The `replayed` count of an answer, or a panic naming it.
fn replayed(answer: &Value) -> i64 {
    answer["data"]["replayDeliveries"]["replayed"]
        .as_i64()
        .unwrap_or_else(|| panic!("a replay count: {answer}"))
}

/// Marks `ids` failed as of `at`, as the worker would have.
async fn fail_at(app: &TestApp, ids: &[Uuid], at: DateTime<Utc>) {
    for id in ids {
        rows(
            &app.state.db,
            "UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL, \
             cycle_attempts = 1, updated_at = $1 WHERE id = $2",
            vec![SqlValue::from(at), SqlValue::from(*id)],
        )
        .await;
    }
}

async fn endpoint_of(app: &TestApp, id: Uuid) -> Uuid {
    delivery(&app.state.db, id).await.endpoint_id
}

/// The states of `ids`, in order, as stored.
async fn states(app: &TestApp, ids: &[Uuid]) -> Vec<String> {
    let mut states = Vec::with_capacity(ids.len());
    for id in ids {
        states.push(delivery(&app.state.db, *id).await.state.to_value());
    }
    states
}

/// Four bulk replays and forty single replays over two instances at once, while a worker on
/// a third delivers: every failed delivery is replayed exactly once, the counts add up, and
/// the receiver gets each one exactly once more.
async fn bulk_and_single_replays_racing_replay_each_delivery_once(backend: Backend) {
    const FAILED: usize = 2 * REPLAY_BATCH + 37;
    const SINGLES: usize = 40;
    let db = TestDb::new(backend).await;
    let (receiver, healthy) = Receiver::switchable(503, || Reply::status(200)).await;
    let worker = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.disable_after_failures = 0;
        config.worker_concurrency = 32;
    })
    .await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = worker.admin_token().await;
    let endpoints = [
        endpoint_on(&worker, &admin, &receiver, "one").await,
        endpoint_on(&worker, &admin, &receiver, "two").await,
    ];
    let mut ids = Vec::with_capacity(FAILED);
    for chunk in (0..FAILED).collect::<Vec<_>>().chunks(50) {
        let submits = chunk.iter().map(|n| {
            let endpoint = &endpoints[n % 2];
            let (app, admin) = (&apps[n % 2], &admin);
            async move { submit(app, admin, endpoint, json!({ "n": n }), None).await }
        });
        for answer in futures_util::future::join_all(submits).await {
            ids.push(delivery_id(&answer));
        }
    }
    let pool = &worker.state.db;
    eventually("every delivery fails", Duration::from_secs(60), || async {
        count(
            pool,
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'failed'",
            vec![],
        )
        .await
            == FAILED as i64
    })
    .await;
    healthy.store(true, Ordering::SeqCst);

    let barrier = Arc::new(Barrier::new(4 + SINGLES));
    let bulk = (0..4).map(|i| {
        let (app, admin, barrier) = (&apps[i % 2], &admin, barrier.clone());
        async move {
            barrier.wait().await;
            replayed(
                &app.graphql(admin, REPLAY_ALL, json!({ "filter": {} }))
                    .await,
            )
        }
    });
    let singles = (0..SINGLES).map(|i| {
        let (app, admin, barrier) = (&apps[i % 2], &admin, barrier.clone());
        // Spread over the whole walk: early, middle and late ids.
        let id = ids[(i * 997) % FAILED].clone();
        async move {
            barrier.wait().await;
            let answer = app.graphql(admin, REPLAY, json!({ "id": id })).await;
            match gql_error_code(&answer) {
                None => 1,
                Some("DELIVERY_NOT_REPLAYABLE") => 0,
                Some(other) => panic!("{other}: {answer}"),
            }
        }
    });
    let (bulk, singles) = tokio::join!(
        futures_util::future::join_all(bulk),
        futures_util::future::join_all(singles)
    );
    let total: i64 = bulk.iter().sum::<i64>() + singles.iter().sum::<i64>();
    assert_eq!(
        total, FAILED as i64,
        "each failed delivery replayed exactly once: bulk {bulk:?}, singles {singles:?}"
    );

    eventually(
        "every delivery is delivered",
        Duration::from_secs(60),
        || async {
            count(
                pool,
                "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'delivered'",
                vec![],
            )
            .await
                == FAILED as i64
        },
    )
    .await;
    settle([worker]).await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for received in receiver.received() {
        assert!(received.verified, "every request verifies");
        *per_id.entry(received.webhook_id).or_default() += 1;
    }
    assert_eq!(per_id.len(), FAILED);
    assert!(
        per_id.values().all(|sent| *sent == 2),
        "each sent once, then once more after the replay: {:?}",
        per_id.values().filter(|sent| **sent != 2).count()
    );
}

/// The window, the endpoint and the event type narrow a bulk replay; only failed
/// deliveries are touched; a backwards window is refused.
async fn filters_and_the_window_choose_what_is_replayed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed_spread(&db, 2, 6).await;
    let admin = app.admin_token().await;
    let first_endpoint = endpoint_of(&app, ids[0]).await;
    let noon: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().expect("time");
    let hour = chrono::Duration::hours(1);
    // ids alternate between the two endpoints: 0, 2, 4... are the first's.
    fail_at(&app, &ids[0..4], noon - hour).await;
    fail_at(&app, &ids[4..8], noon + hour).await;
    fail_at(&app, &ids[8..10], noon + hour * 3).await;
    // ids[10] and ids[11] stay pending.

    let backwards = app
        .graphql(
            &admin,
            REPLAY_ALL,
            json!({ "filter": { "since": noon, "until": noon - hour } }),
        )
        .await;
    assert_eq!(
        gql_error_code(&backwards),
        Some("BAD_USER_INPUT"),
        "{backwards}"
    );

    // An endpoint that does not exist is named, as it is for a single replay.
    let unknown = app
        .graphql(
            &admin,
            REPLAY_ALL,
            json!({ "filter": { "endpointId": Uuid::now_v7().to_string() } }),
        )
        .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");

    let window = json!({ "since": noon, "until": noon + hour * 2 });
    let mut first_only = window.clone();
    first_only["endpointId"] = json!(first_endpoint.to_string());
    let answer = app
        .graphql(&admin, REPLAY_ALL, json!({ "filter": first_only }))
        .await;
    assert_eq!(replayed(&answer), 2, "ids 4 and 6: {answer}");
    let answer = app
        .graphql(&admin, REPLAY_ALL, json!({ "filter": window }))
        .await;
    assert_eq!(
        replayed(&answer),
        2,
        "ids 5 and 7, the rest of the window: {answer}"
    );
    assert_eq!(
        states(&app, &ids).await,
        [
            "failed", "failed", "failed", "failed", "pending", "pending", "pending", "pending",
            "failed", "failed", "pending", "pending"
        ]
    );

    // No submission here has this event type; then give two of them one.
    let typed = json!({ "filter": { "eventType": "order.paid" } });
    assert_eq!(
        replayed(&app.graphql(&admin, REPLAY_ALL, typed.clone()).await),
        0
    );
    for id in [&ids[1], &ids[8]] {
        rows(
            &app.state.db,
            "UPDATE submissions SET event_type = 'order.paid' WHERE id = \
             (SELECT submission_id FROM webhook_deliveries WHERE id = $1)",
            vec![SqlValue::from(*id)],
        )
        .await;
        // Courier keeps the type on the delivery too.
        rows(
            &app.state.db,
            "UPDATE webhook_deliveries SET event_type = 'order.paid' WHERE id = $1",
            vec![SqlValue::from(*id)],
        )
        .await;
    }
    assert_eq!(replayed(&app.graphql(&admin, REPLAY_ALL, typed).await), 2);
    assert_eq!(
        replayed(
            &app.graphql(&admin, REPLAY_ALL, json!({ "filter": { "until": noon } }))
                .await
        ),
        3,
        "ids 0, 2 and 3 failed before noon"
    );
    assert_eq!(
        replayed(
            &app.graphql(&admin, REPLAY_ALL, json!({ "filter": {} }))
                .await
        ),
        1,
        "id 9 was all that was left"
    );
    assert!(states(&app, &ids)
        .await
        .iter()
        .all(|state| state == "pending"));
    let metrics = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("courier_replays_total 10"), "{metrics}");
}

/// Partners replay (single and bulk) within their scope only.
async fn partners_replay_within_their_scope(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed_spread(&db, 2, 3).await;
    let (mine, theirs) = (
        endpoint_of(&app, ids[0]).await,
        endpoint_of(&app, ids[1]).await,
    );
    fail_at(&app, &ids, Utc::now()).await;
    let partner = app.token(Role::Partner, &[mine]).await;

    let foreign = app
        .graphql(
            &partner,
            REPLAY_ALL,
            json!({ "filter": { "endpointId": theirs.to_string() } }),
        )
        .await;
    assert_eq!(gql_error_code(&foreign), Some("FORBIDDEN"), "{foreign}");
    let foreign = app
        .graphql(&partner, REPLAY, json!({ "id": ids[1].to_string() }))
        .await;
    assert_eq!(gql_error_code(&foreign), Some("FORBIDDEN"), "{foreign}");

    let single = app
        .graphql(&partner, REPLAY, json!({ "id": ids[0].to_string() }))
        .await;
    assert_eq!(
        single["data"]["replayDelivery"]["state"], "PENDING",
        "{single}"
    );
    let bulk = app
        .graphql(&partner, REPLAY_ALL, json!({ "filter": {} }))
        .await;
    assert_eq!(replayed(&bulk), 2, "the rest of its own: {bulk}");
    assert_eq!(
        states(&app, &ids).await,
        ["pending", "failed", "pending", "failed", "pending", "failed"],
        "nothing of the other endpoint moved"
    );
}

/// One call walks every batch: all of many failed deliveries, whatever their order of
/// creation across endpoints, are replayed by a single bulk replay.
async fn one_bulk_replay_takes_every_batch(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed_spread(&db, 3, REPLAY_BATCH + 150).await;
    let admin = app.admin_token().await;
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL",
        vec![],
    )
    .await;
    let first = endpoint_of(&app, ids[0]).await;
    let one = app
        .graphql(
            &admin,
            REPLAY_ALL,
            json!({ "filter": { "endpointId": first.to_string() } }),
        )
        .await;
    assert_eq!(replayed(&one), (REPLAY_BATCH + 150) as i64, "{one}");
    let rest = app
        .graphql(&admin, REPLAY_ALL, json!({ "filter": {} }))
        .await;
    assert_eq!(replayed(&rest), 2 * (REPLAY_BATCH + 150) as i64, "{rest}");
}

/// A bulk replay into a disabled endpoint parks what it replays, like any other replay.
async fn a_bulk_replay_into_a_disabled_endpoint_parks(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed_spread(&db, 1, 3).await;
    let admin = app.admin_token().await;
    fail_at(&app, &ids, Utc::now()).await;
    rows(
        &app.state.db,
        "UPDATE endpoints SET disabled = TRUE",
        vec![],
    )
    .await;
    let answer = app
        .graphql(&admin, REPLAY_ALL, json!({ "filter": {} }))
        .await;
    assert_eq!(replayed(&answer), 3, "{answer}");
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM webhook_deliveries \
             WHERE state = 'pending' AND next_attempt_at IS NULL",
            vec![],
        )
        .await,
        3,
        "parked until the endpoint is enabled"
    );
}

on_both_backends!(
    filters_and_the_window_choose_what_is_replayed,
    partners_replay_within_their_scope,
    a_bulk_replay_into_a_disabled_endpoint_parks,
    one_bulk_replay_takes_every_batch,
);

crate::on_postgres!(bulk_and_single_replays_racing_replay_each_delivery_once,);
