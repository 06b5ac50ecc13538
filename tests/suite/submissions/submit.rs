//! `submit`: idempotency settled by the unique constraint (race 3), validation, and reading back.

use std::sync::Arc;

use courier::auth::Role;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::support::fixtures::row_counts;
use crate::support::fixtures::{submit, SUBMIT};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

/// `racers` submissions of `payload_of(i)` under one key, split over `apps`, released at once.
async fn race(
    apps: &[TestApp],
    token: &str,
    endpoint: &str,
    racers: usize,
    payload_of: impl Fn(usize) -> Value,
) -> Vec<Value> {
    let barrier = Arc::new(Barrier::new(racers));
    let submits = (0..racers).map(|i| {
        let (app, barrier, payload) = (&apps[i % apps.len()], barrier.clone(), payload_of(i));
        async move {
            barrier.wait().await;
            submit(app, token, endpoint, payload, Some("order-42")).await
        }
    });
    futures_util::future::join_all(submits).await
}

async fn setup(backend: Backend, instances: usize) -> (TestDb, Vec<TestApp>, String, String) {
    let db = TestDb::new(backend).await;
    let mut apps = Vec::new();
    for _ in 0..instances {
        apps.push(TestApp::spawn(&db).await);
    }
    let admin = apps[0].admin_token().await;
    let (endpoint, _) = apps[0]
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    (db, apps, admin, endpoint)
}

fn assert_one_created_rest_deduplicated(answers: &[Value]) {
    let created: Vec<&Value> = answers
        .iter()
        .filter(|a| a["data"]["submit"]["created"] == true)
        .collect();
    assert_eq!(created.len(), 1, "exactly one creation: {answers:?}");
    let id = &created[0]["data"]["submit"]["submission"]["id"];
    let delivery = &created[0]["data"]["submit"]["delivery"]["id"];
    for answer in answers {
        assert!(answer.get("errors").is_none(), "{answer}");
        assert_eq!(
            &answer["data"]["submit"]["submission"]["id"], id,
            "every caller gets the same submission"
        );
        assert_eq!(
            &answer["data"]["submit"]["delivery"]["id"], delivery,
            "and the same delivery"
        );
    }
}

async fn same_key_same_content_doubled_creates_once(backend: Backend) {
    let (_db, apps, admin, endpoint) = setup(backend, 2).await;
    let answers = race(&apps, &admin, &endpoint, 2, |_| json!({ "order": 42 })).await;
    assert_one_created_rest_deduplicated(&answers);
    assert_eq!(row_counts(&apps[0]).await, (1, 1));
}

async fn same_key_same_content_sixteen_fold_over_two_instances_creates_once(backend: Backend) {
    let (_db, apps, admin, endpoint) = setup(backend, 2).await;
    // Key order and whitespace differ between racers; the content is the same.
    let answers = race(&apps, &admin, &endpoint, 16, |i| {
        if i % 2 == 0 {
            json!({ "order": 42, "items": [1, 2] })
        } else {
            serde_json::from_str(r#"{"items":[1,2.0],  "order":42}"#).expect("json")
        }
    })
    .await;
    assert_one_created_rest_deduplicated(&answers);
    assert_eq!(
        row_counts(&apps[0]).await,
        (1, 1),
        "exactly one submission and one delivery"
    );
}

async fn same_key_different_content_conflicts(backend: Backend) {
    let (_db, apps, admin, endpoint) = setup(backend, 2).await;
    let answers = race(&apps, &admin, &endpoint, 2, |i| json!({ "racer": i })).await;
    let created = answers
        .iter()
        .filter(|a| a["data"]["submit"]["created"] == true)
        .count();
    let conflicts = answers
        .iter()
        .filter(|a| gql_error_code(a) == Some("IDEMPOTENCY_CONFLICT"))
        .count();
    assert_eq!((created, conflicts), (1, 1), "{answers:?}");
    assert_eq!(row_counts(&apps[0]).await, (1, 1));
}

async fn a_retry_after_commit_sees_the_first_record(backend: Backend) {
    let (_db, apps, admin, endpoint) = setup(backend, 2).await;
    let first = submit(&apps[0], &admin, &endpoint, json!({ "a": 1 }), Some("k")).await;
    assert_eq!(first["data"]["submit"]["created"], true, "{first}");
    let retry = submit(&apps[1], &admin, &endpoint, json!({ "a": 1 }), Some("k")).await;
    assert_eq!(retry["data"]["submit"]["created"], false, "{retry}");
    assert_eq!(
        retry["data"]["submit"]["submission"]["id"],
        first["data"]["submit"]["submission"]["id"]
    );
    let conflict = submit(&apps[1], &admin, &endpoint, json!({ "a": 2 }), Some("k")).await;
    assert_eq!(
        gql_error_code(&conflict),
        Some("IDEMPOTENCY_CONFLICT"),
        "{conflict}"
    );
    assert_eq!(row_counts(&apps[0]).await, (1, 1));

    // Without a key, nothing collides.
    for _ in 0..2 {
        let body = submit(&apps[0], &admin, &endpoint, json!({ "a": 1 }), None).await;
        assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    }
    assert_eq!(row_counts(&apps[0]).await, (3, 3));
}

async fn the_stored_submission_reads_back(backend: Backend) {
    let (_db, apps, admin, endpoint) = setup(backend, 1).await;
    let payload = json!({ "nested": { "list": [1, "two", null, true, 3.5] }, "unicode": "é✓" });
    let body = submit(
        &apps[0],
        &admin,
        &endpoint,
        payload.clone(),
        Some("read-back"),
    )
    .await;
    let result = &body["data"]["submit"];
    assert_eq!(result["submission"]["payload"], payload, "{body}");
    assert_eq!(result["submission"]["idempotencyKey"], "read-back");
    assert_eq!(result["submission"]["endpoint"]["id"], endpoint.as_str());
    assert_eq!(result["delivery"]["state"], "PENDING");
    assert_eq!(result["delivery"]["cycleAttempts"], 0);
    assert!(result["delivery"]["nextAttemptAt"].is_string());
    assert_eq!(
        result["submission"]["delivery"]["id"],
        result["delivery"]["id"]
    );

    let id = result["submission"]["id"].as_str().expect("id");
    let read = apps[0]
        .graphql(&admin, "query($id: ID!) { submission(id: $id) { payload delivery { id state attempts { number } } } }", json!({ "id": id }))
        .await;
    assert_eq!(read["data"]["submission"]["payload"], payload, "{read}");
    assert_eq!(
        read["data"]["submission"]["delivery"]["attempts"],
        json!([])
    );
    let delivery_id = result["delivery"]["id"].as_str().expect("id");
    let delivery = apps[0]
        .graphql(
            &admin,
            "query($id: ID!) { delivery(id: $id) { id submission { id } endpoint { id } } }",
            json!({ "id": delivery_id }),
        )
        .await;
    assert_eq!(
        delivery["data"]["delivery"]["submission"]["id"], id,
        "{delivery}"
    );
}

async fn bad_input_is_refused_and_writes_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| config.max_payload_bytes = 1024).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let (other, _) = app
        .create_endpoint(&admin, "https://example.com/other")
        .await;
    let partner = app
        .token(
            Role::Partner,
            &[uuid::Uuid::parse_str(&endpoint).expect("uuid")],
        )
        .await;

    let unknown = submit(
        &app,
        &admin,
        &uuid::Uuid::now_v7().to_string(),
        json!({}),
        None,
    )
    .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");
    let malformed = submit(&app, &admin, "nope", json!({}), None).await;
    assert_eq!(
        gql_error_code(&malformed),
        Some("BAD_USER_INPUT"),
        "{malformed}"
    );
    let out_of_scope = submit(&app, &partner, &other, json!({}), None).await;
    assert_eq!(
        gql_error_code(&out_of_scope),
        Some("FORBIDDEN"),
        "{out_of_scope}"
    );
    let oversized = submit(
        &app,
        &admin,
        &endpoint,
        json!({ "blob": "x".repeat(2000) }),
        None,
    )
    .await;
    assert_eq!(
        gql_error_code(&oversized),
        Some("BAD_USER_INPUT"),
        "{oversized}"
    );
    let long_key = submit(&app, &admin, &endpoint, json!({}), Some(&"k".repeat(256))).await;
    assert_eq!(
        gql_error_code(&long_key),
        Some("BAD_USER_INPUT"),
        "{long_key}"
    );
    let nul = submit(&app, &admin, &endpoint, json!({ "a\u{0}": "b\u{0}" }), None).await;
    assert_eq!(gql_error_code(&nul), Some("BAD_USER_INPUT"), "{nul}");
    let control_key = submit(&app, &admin, &endpoint, json!({}), Some("a\u{0}b")).await;
    assert_eq!(
        gql_error_code(&control_key),
        Some("BAD_USER_INPUT"),
        "{control_key}"
    );
    let empty_key = submit(&app, &admin, &endpoint, json!({}), Some("")).await;
    assert_eq!(
        gql_error_code(&empty_key),
        Some("BAD_USER_INPUT"),
        "{empty_key}"
    );
    let no_payload = app
        .graphql(
            &admin,
            SUBMIT,
            json!({ "input": { "endpointId": endpoint } }),
        )
        .await;
    assert_eq!(
        gql_error_code(&no_payload),
        Some("BAD_USER_INPUT"),
        "{no_payload}"
    );

    app.graphql(&admin, "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { disabled } } }", json!({ "id": endpoint }))
        .await;
    let disabled = submit(&app, &partner, &endpoint, json!({}), None).await;
    assert_eq!(
        gql_error_code(&disabled),
        Some("BAD_USER_INPUT"),
        "{disabled}"
    );

    assert_eq!(row_counts(&app).await, (0, 0), "nothing was written");

    // A key of exactly 255 characters, by a partner in scope, is fine.
    app.graphql(&admin, "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: false}) { endpoint { disabled } } }", json!({ "id": endpoint }))
        .await;
    let ok = submit(
        &app,
        &partner,
        &endpoint,
        json!({ "ok": true }),
        Some(&"k".repeat(255)),
    )
    .await;
    assert_eq!(ok["data"]["submit"]["created"], true, "{ok}");
}

on_every_backend!(
    same_key_same_content_doubled_creates_once,
    same_key_same_content_sixteen_fold_over_two_instances_creates_once,
    same_key_different_content_conflicts,
    a_retry_after_commit_sees_the_first_record,
    the_stored_submission_reads_back,
    bad_input_is_refused_and_writes_nothing,
);

/// The isolation a connection's transactions get by default.
async fn isolation(conn: &impl ConnectionTrait) -> String {
    conn.query_one_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        "SHOW transaction_isolation",
    ))
    .await
    .expect("show")
    .expect("row")
    .try_get::<String>("", "transaction_isolation")
    .expect("level")
}

/// A database whose default is REPEATABLE READ: Courier's connections are pinned to READ
/// COMMITTED as they connect, and the loser of an idempotency race reads the winner (in a
/// REPEATABLE READ snapshot it would see nothing and fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_holds_at_repeatable_read() {
    let db = TestDb::new(Backend::Postgres).await;
    {
        let admin_pool = db.connect(1).await;
        let name = db.url.rsplit('/').next().expect("database name").to_owned();
        admin_pool
            .conn()
            .execute_unprepared(&format!(
                "ALTER DATABASE {name} SET default_transaction_isolation TO 'repeatable read'"
            ))
            .await
            .expect("set the default isolation");
        admin_pool.close().await.expect("close");
    }
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    assert_eq!(
        isolation(apps[0].state.db.conn()).await,
        "read committed",
        "the database's default does not reach Courier's connections"
    );
    {
        let others = sea_orm::Database::connect(&db.url).await.expect("connect");
        assert_eq!(
            isolation(&others).await,
            "repeatable read",
            "other clients of the database get its default"
        );
        others.close().await.expect("close");
    }

    let admin = apps[0].admin_token().await;
    let (endpoint, _) = apps[0]
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let answers = race(&apps, &admin, &endpoint, 16, |_| json!({ "order": 42 })).await;
    assert_one_created_rest_deduplicated(&answers);
    let retry = submit(
        &apps[1],
        &admin,
        &endpoint,
        json!({ "order": 42 }),
        Some("order-42"),
    )
    .await;
    assert_eq!(retry["data"]["submit"]["created"], false, "{retry}");
    let conflict = submit(
        &apps[1],
        &admin,
        &endpoint,
        json!({ "order": 43 }),
        Some("order-42"),
    )
    .await;
    assert_eq!(
        gql_error_code(&conflict),
        Some("IDEMPOTENCY_CONFLICT"),
        "{conflict}"
    );
    assert_eq!(row_counts(&apps[0]).await, (1, 1));
}

/// Every PostgreSQL connection of the pool plans a statement once (a generic plan), rather
/// than afresh at every run of the larger statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_plan_each_statement_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool = db.connect(2).await;
    let mode = pool
        .conn()
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SHOW plan_cache_mode",
        ))
        .await
        .expect("show")
        .expect("row");
    assert_eq!(
        mode.try_get::<String>("", "plan_cache_mode").expect("mode"),
        "force_generic_plan"
    );
}
