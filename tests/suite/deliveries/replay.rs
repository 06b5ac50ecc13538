//! Race 4: replaying a failed delivery, settled by one conditional UPDATE.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use courier::auth::Role;
use sea_orm::{ConnectionTrait as _, DbBackend, Statement};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::submit;
use crate::support::fixtures::{
    assert_not_replayable, endpoint_on, quick_worker, settle, wait_for_state,
};
use crate::support::fixtures::{delivery, lock_endpoint_row, rows, until_one_waits_on_a_lock, V7};
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

const REPLAY: &str =
    "mutation($id: ID!) { replayDelivery(id: $id) { id state cycleAttempts nextAttemptAt } }";

/// Twelve replays over two instances at once: one wins, the rest are told the state the
/// database settled on; the delivery then runs one new cycle, numbering on from before.
async fn concurrent_replays_have_exactly_one_winner(backend: Backend) {
    const RACERS: usize = 12;
    let db = TestDb::new(backend).await;
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = worker.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(500, || Reply::status(200)).await;
    let endpoint = endpoint_on(&worker, &admin, &receiver, "replay").await;
    let id =
        delivery_id(&submit(&worker, &admin, &endpoint, json!({ "replay": true }), None).await);
    wait_for_state(&worker, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    healthy.store(true, Ordering::SeqCst);

    let barrier = Arc::new(Barrier::new(RACERS));
    let racers = (0..RACERS).map(|i| {
        let (app, barrier, admin, id) = (&apps[i % 2], barrier.clone(), admin.clone(), id.clone());
        async move {
            barrier.wait().await;
            app.graphql(&admin, REPLAY, json!({ "id": id })).await
        }
    });
    let answers = futures_util::future::join_all(racers).await;
    let winners: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("errors").is_none())
        .collect();
    assert_eq!(winners.len(), 1, "exactly one replay wins: {answers:?}");
    assert_eq!(winners[0]["data"]["replayDelivery"]["cycleAttempts"], 0);
    for loser in answers.iter().filter(|a| a.get("errors").is_some()) {
        assert_eq!(
            gql_error_code(loser),
            Some("DELIVERY_NOT_REPLAYABLE"),
            "{loser}"
        );
        let state = loser["errors"][0]["extensions"]["state"]
            .as_str()
            .unwrap_or_default();
        assert!(
            ["PENDING", "PROCESSING", "DELIVERED"].contains(&state),
            "the settled state: {loser}"
        );
    }

    let delivery = wait_for_state(&worker, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let numbers: Vec<i64> = delivery["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["number"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(
        numbers,
        vec![1, 2, 3, 4],
        "lifetime numbers continue across the replay"
    );
    assert_eq!(delivery["cycleAttempts"], 1, "one attempt in the new cycle");
    settle([worker]).await;
    assert_eq!(
        receiver.received().len(),
        4,
        "nothing sent after the delivery"
    );
}

async fn only_failed_deliveries_can_be_replayed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);

    let pending = app.graphql(&admin, REPLAY, json!({ "id": id })).await;
    assert_not_replayable(&pending, "PENDING", None);

    use sea_orm::ConnectionTrait;
    app.state
        .db
        .conn()
        .execute_unprepared(
            "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL",
        )
        .await
        .expect("deliver");
    let delivered = app.graphql(&admin, REPLAY, json!({ "id": id })).await;
    assert_not_replayable(
        &delivered,
        "DELIVERED",
        Some("delivery is delivered, only failed deliveries can be replayed"),
    );

    let unknown = app
        .graphql(
            &admin,
            REPLAY,
            json!({ "id": uuid::Uuid::now_v7().to_string() }),
        )
        .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");
    let malformed = app.graphql(&admin, REPLAY, json!({ "id": "nope" })).await;
    assert_eq!(
        gql_error_code(&malformed),
        Some("BAD_USER_INPUT"),
        "{malformed}"
    );
    // An ID is a UUID as Courier writes it (in either case), not another spelling of one.
    let simple = id.replace('-', "");
    for other in [format!("{{{id}}}"), simple, format!("urn:uuid:{id}")] {
        let answer = app.graphql(&admin, REPLAY, json!({ "id": other })).await;
        assert_eq!(gql_error_code(&answer), Some("BAD_USER_INPUT"), "{answer}");
    }
    let upper = app
        .graphql(&admin, REPLAY, json!({ "id": id.to_uppercase() }))
        .await;
    assert_not_replayable(&upper, "DELIVERED", None);

    app.state
        .db
        .conn()
        .execute_unprepared("UPDATE webhook_deliveries SET state = 'failed'")
        .await
        .expect("fail");
    let (elsewhere, _) = app
        .create_endpoint(&admin, "https://example.com/elsewhere")
        .await;
    let outsider = app
        .token(
            Role::Partner,
            &[uuid::Uuid::parse_str(&elsewhere).expect("uuid")],
        )
        .await;
    let forbidden = app.graphql(&outsider, REPLAY, json!({ "id": id })).await;
    assert_eq!(gql_error_code(&forbidden), Some("FORBIDDEN"), "{forbidden}");

    let replayed = app.graphql(&admin, REPLAY, json!({ "id": id })).await;
    assert_eq!(
        replayed["data"]["replayDelivery"]["state"], "PENDING",
        "{replayed}"
    );
    assert!(replayed["data"]["replayDelivery"]["nextAttemptAt"].is_string());
    let metrics = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("courier_replays_total 1"), "{metrics}");
}

/// A bulk replay bounded by `until` reads its batch, then waits for the endpoint (another
/// session holds it); meanwhile one of the batch is replayed and fails again, now after
/// `until`. Under its lock the replay finds it failed outside its window and leaves it:
/// each delivery is replayed by the failure the filter names, not by an earlier one.
async fn a_bulk_replay_rechecks_when_each_failed_under_its_lock(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/window")
        .await;
    let failed_at = |ago: &str| {
        format!(
            "INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at) \
             SELECT {v7}, '{endpoint}', '{{}}', md5(random()::text), now() - interval '{ago}' \
             RETURNING id",
            v7 = V7.replace("{at}", &format!("now() - interval '{ago}'")),
        )
    };
    let mut failures = Vec::new();
    for _ in 0..3 {
        let submission: uuid::Uuid = rows(&app.state.db, &failed_at("2 days"), vec![]).await[0]
            .try_get("", "id")
            .expect("a submission");
        let delivery: uuid::Uuid = rows(
            &app.state.db,
            &format!(
                "INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, \
                 cycle_attempts, created_at, updated_at) SELECT {v7}, '{submission}', \
                 '{endpoint}', 'failed', 8, now() - interval '2 days', now() - interval '2 days' \
                 RETURNING id",
                v7 = V7.replace("{at}", "now() - interval '2 days'"),
            ),
            vec![],
        )
        .await[0]
            .try_get("", "id")
            .expect("a delivery");
        failures.push(delivery);
    }
    let until = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();

    let holder = db.connect(2).await;
    let lock = lock_endpoint_row(&holder, &endpoint).await;
    let replay = app.graphql(
        &admin,
        "mutation($endpoint: ID!, $until: DateTime!) { replayDeliveries(filter: \
         {endpointId: $endpoint, until: $until}) { replayed } }",
        json!({ "endpoint": endpoint, "until": until }),
    );
    let meanwhile = async {
        until_one_waits_on_a_lock(&holder, "the replay waits for the endpoint").await;
        // Replayed and failed again, today.
        lock.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "UPDATE webhook_deliveries SET updated_at = now() WHERE id = $1",
            [failures[0].into()],
        ))
        .await
        .expect("failed again");
        lock.commit().await.expect("released");
    };
    let (answer, ()) = futures_util::future::join(replay, meanwhile).await;
    assert_eq!(
        answer["data"]["replayDeliveries"]["replayed"], 2,
        "{answer}"
    );
    let left = delivery(&app.state.db, failures[0]).await;
    assert_eq!(left.state, entity::webhook_delivery::DeliveryState::Failed);
}

on_every_backend!(only_failed_deliveries_can_be_replayed);

crate::on_postgres!(
    concurrent_replays_have_exactly_one_winner,
    a_bulk_replay_rechecks_when_each_failed_under_its_lock,
);
