//! Event types and `publish`: routing by type, enabled state and partner scope; idempotency
//! per API key settled by the unique constraint across processes; atomic fan-out; and no
//! due delivery left on an endpoint disabled while an event was being published.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use courier::auth::Role;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::delivery::{endpoint_on, quick_worker};
use crate::on_both_backends;
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};

const PUBLISH: &str = "mutation($input: PublishInput!) { publish(input: $input) { created event { id eventType idempotencyKey payload deliveries(first: 100) { edges { node { id state endpoint { id } submission { eventType event { id } } } } } } } }";

async fn publish(
    app: &TestApp,
    token: &str,
    event_type: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "eventType": event_type, "payload": payload, "idempotencyKey": key });
    app.graphql(token, PUBLISH, json!({ "input": input })).await
}

/// Creates an endpoint subscribed to `types` (`None`: the field omitted) and returns its id.
async fn endpoint_with_types(
    app: &TestApp,
    admin: &str,
    url: &str,
    types: Option<Vec<&str>>,
) -> String {
    let mut input = json!({ "name": "typed", "url": url });
    if let Some(types) = types {
        input["eventTypes"] = json!(types);
    }
    let body = app
        .graphql(
            admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id eventTypes } } }",
            json!({ "input": input }),
        )
        .await;
    body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("created: {body}"))
        .to_owned()
}

async fn set_endpoint(app: &TestApp, admin: &str, id: &str, input: Value) -> Value {
    app.graphql(
        admin,
        "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { id disabled eventTypes } } }",
        json!({ "id": id, "input": input }),
    )
    .await
}

/// The endpoints an answer's event reached, as a set of ids.
fn reached(body: &Value) -> HashSet<String> {
    body["data"]["publish"]["event"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("deliveries: {body}"))
        .iter()
        .map(|edge| {
            edge["node"]["endpoint"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

async fn scalar(app: &TestApp, sql: &str) -> i64 {
    let row = app
        .state
        .db
        .conn()
        .query_one_raw(Statement::from_string(
            app.state.db.backend(),
            sql.to_owned(),
        ))
        .await
        .expect("query")
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a count")
}

async fn publish_routes_by_type_state_and_scope(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let every = endpoint_with_types(&app, &admin, "https://example.com/every", None).await;
    let paid = endpoint_with_types(
        &app,
        &admin,
        "https://example.com/paid",
        Some(vec!["order.paid", "order.paid"]),
    )
    .await;
    let shipped = endpoint_with_types(
        &app,
        &admin,
        "https://example.com/shipped",
        Some(vec!["order.shipped"]),
    )
    .await;
    let disabled = endpoint_with_types(
        &app,
        &admin,
        "https://example.com/off",
        Some(vec!["order.paid"]),
    )
    .await;
    let outside = endpoint_with_types(
        &app,
        &admin,
        "https://example.com/outside",
        Some(vec!["order.paid"]),
    )
    .await;
    let body = set_endpoint(&app, &admin, &disabled, json!({ "disabled": true })).await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{body}"
    );

    // Types are stored sorted and without duplicates; [] means every type.
    let body = app
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { eventTypes } }",
            json!({ "id": paid }),
        )
        .await;
    assert_eq!(
        body["data"]["endpoint"]["eventTypes"],
        json!(["order.paid"]),
        "{body}"
    );

    let body = publish(&app, &admin, "order.paid", json!({ "order": 1 }), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    let expected: HashSet<String> = [&every, &paid, &outside].into_iter().cloned().collect();
    assert_eq!(
        reached(&body),
        expected,
        "an admin's event reaches every matching enabled endpoint"
    );
    let node = &body["data"]["publish"]["event"]["deliveries"]["edges"][0]["node"];
    assert_eq!(node["state"], "PENDING", "{body}");
    assert_eq!(node["submission"]["eventType"], "order.paid");
    assert_eq!(
        node["submission"]["event"]["id"],
        body["data"]["publish"]["event"]["id"]
    );

    let scope: Vec<uuid::Uuid> = [&every, &paid, &shipped, &disabled]
        .into_iter()
        .map(|id| id.parse().expect("uuid"))
        .collect();
    let partner = app.token(Role::Partner, &scope).await;
    let body = publish(&app, &partner, "order.paid", json!({ "order": 2 }), None).await;
    let expected: HashSet<String> = [&every, &paid].into_iter().cloned().collect();
    assert_eq!(
        reached(&body),
        expected,
        "a partner's event stays in its scope"
    );
    let event_id = body["data"]["publish"]["event"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let body = app
        .graphql(
            &partner,
            "query($id: ID!) { event(id: $id) { eventType deliveries { edges { node { id } } } } }",
            json!({ "id": event_id }),
        )
        .await;
    assert_eq!(body["data"]["event"]["eventType"], "order.paid", "{body}");

    // Nobody subscribes: a valid event with no deliveries.
    let body = publish(&app, &partner, "nobody.listens", json!({}), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    assert!(
        reached(&body).contains(&every),
        "an empty type list takes every type: {body}"
    );
    let only_typed = app.token(Role::Partner, &[scope[2]]).await;
    let body = publish(&app, &only_typed, "nobody.listens", json!({}), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    assert!(reached(&body).is_empty(), "{body}");

    // Bad types are refused and write nothing.
    let events_before = scalar(&app, "SELECT COUNT(*) FROM events").await;
    for bad in ["", "order paid", "tab\tinside", &"x".repeat(256)] {
        let body = publish(&app, &admin, bad, json!({}), None).await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{bad:?}: {body}"
        );
    }
    let body = set_endpoint(&app, &admin, &paid, json!({ "eventTypes": ["has space"] })).await;
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    assert_eq!(
        scalar(&app, "SELECT COUNT(*) FROM events").await,
        events_before
    );

    // Deliveries filter by event type; `submit` keeps its label and ignores type filters.
    let body = app
        .graphql(
            &admin,
            "mutation($input: SubmitInput!) { submit(input: $input) { submission { eventType event { id } } } }",
            json!({ "input": { "endpointId": shipped, "payload": {}, "eventType": "order.paid" } }),
        )
        .await;
    assert_eq!(
        body["data"]["submit"]["submission"]["eventType"], "order.paid",
        "{body}"
    );
    assert!(
        body["data"]["submit"]["submission"]["event"].is_null(),
        "{body}"
    );
    let body = app
        .graphql(&admin, "{ deliveries(filter: {eventType: \"order.paid\"}, first: 100) { edges { node { id } } } }", json!({}))
        .await;
    assert_eq!(
        body["data"]["deliveries"]["edges"].as_array().map(Vec::len),
        Some(6),
        "{body}"
    );

    // An empty list on update subscribes to every type again.
    let body = set_endpoint(&app, &admin, &shipped, json!({ "eventTypes": [] })).await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["eventTypes"],
        json!([]),
        "{body}"
    );
}

async fn publish_is_idempotent_per_api_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for n in 0..3 {
        endpoint_with_types(
            &app,
            &admin,
            &format!("https://example.com/{n}"),
            Some(vec!["a.b"]),
        )
        .await;
    }
    let first = publish(&app, &admin, "a.b", json!({ "x": 1, "y": 2 }), Some("k1")).await;
    assert_eq!(first["data"]["publish"]["created"], true, "{first}");
    let again = publish(&app, &admin, "a.b", json!({ "y": 2, "x": 1 }), Some("k1")).await;
    assert_eq!(again["data"]["publish"]["created"], false, "{again}");
    assert_eq!(
        again["data"]["publish"]["event"]["id"],
        first["data"]["publish"]["event"]["id"]
    );
    assert_eq!(
        scalar(&app, "SELECT COUNT(*) FROM webhook_deliveries").await,
        3,
        "no new deliveries"
    );

    let other_payload = publish(&app, &admin, "a.b", json!({ "x": 2 }), Some("k1")).await;
    assert_eq!(
        gql_error_code(&other_payload),
        Some("IDEMPOTENCY_CONFLICT"),
        "{other_payload}"
    );
    let other_type = publish(&app, &admin, "a.c", json!({ "x": 1, "y": 2 }), Some("k1")).await;
    assert_eq!(
        gql_error_code(&other_type),
        Some("IDEMPOTENCY_CONFLICT"),
        "{other_type}"
    );

    // Keys are per API key: another key's `k1` is another event.
    let second_admin = app.admin_token().await;
    let other_key = publish(
        &app,
        &second_admin,
        "a.b",
        json!({ "x": 1, "y": 2 }),
        Some("k1"),
    )
    .await;
    assert_eq!(other_key["data"]["publish"]["created"], true, "{other_key}");
    assert_eq!(scalar(&app, "SELECT COUNT(*) FROM events").await, 2);
    assert_eq!(
        scalar(&app, "SELECT COUNT(*) FROM webhook_deliveries").await,
        6
    );
}

on_both_backends!(
    publish_routes_by_type_state_and_scope,
    publish_is_idempotent_per_api_key,
    events_left_without_deliveries_are_pruned,
);

/// Sixteen publishes of one key over two processes: one event, one delivery per endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishes_with_one_key_over_two_processes_make_one_event() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = apps[0].admin_token().await;
    for n in 0..3 {
        endpoint_with_types(
            &apps[0],
            &admin,
            &format!("https://example.com/{n}"),
            Some(vec!["race"]),
        )
        .await;
    }
    let apps = Arc::new(apps);
    let barrier = Arc::new(Barrier::new(16));
    let racers: Vec<_> = (0..16)
        .map(|n| {
            let apps = apps.clone();
            let barrier = barrier.clone();
            let admin = admin.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                publish(
                    &apps[n % 2],
                    &admin,
                    "race",
                    json!({ "same": true }),
                    Some("once"),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    let mut ids = HashSet::new();
    for racer in racers {
        let body = racer.await.expect("joined");
        assert!(body["errors"].is_null(), "{body}");
        created += usize::from(body["data"]["publish"]["created"] == true);
        ids.insert(
            body["data"]["publish"]["event"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(created, 1, "exactly one publish created the event");
    assert_eq!(ids.len(), 1, "every racer got the same event");
    assert_eq!(scalar(&apps[0], "SELECT COUNT(*) FROM events").await, 1);
    assert_eq!(
        scalar(&apps[0], "SELECT COUNT(*) FROM submissions").await,
        3
    );
    assert_eq!(
        scalar(&apps[0], "SELECT COUNT(*) FROM webhook_deliveries").await,
        3
    );
}

/// A fan-out to 300 endpoints is one transaction: when `publish` answers, every row is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_300_endpoints_writes_every_row_at_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let caller = courier::auth::Identity {
        key_id: uuid::Uuid::now_v7(),
        role: Role::Admin,
        scope: Vec::new(),
    };
    for n in 0..300 {
        let input = courier::service::endpoints::NewEndpoint {
            name: format!("e{n}"),
            url: format!("https://example.com/{n}"),
            event_types: Some(vec!["bulk".into()]),
        };
        app.state
            .endpoints
            .create(&caller, input)
            .await
            .expect("created");
    }
    let body = publish(&app, &admin, "bulk", json!({ "n": 300 }), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    let event_id = body["data"]["publish"]["event"]["id"].as_str().expect("id");
    let sql = format!(
        "SELECT COUNT(*) FROM webhook_deliveries d JOIN submissions s ON s.id = d.submission_id \
         WHERE s.event_id = '{event_id}' AND d.state = 'pending'"
    );
    assert_eq!(scalar(&app, &sql).await, 300);
}

/// Publishes racing a disable (and a change of event types) on another process leave no
/// due delivery on a disabled endpoint; re-enabling delivers each one exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_racing_a_disable_leave_no_due_row() {
    const ROUNDS: usize = 20;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let publisher = TestApp::spawn(&db).await;
    let operator = TestApp::spawn(&db).await;
    let admin = publisher.admin_token().await;
    let target = endpoint_on(&publisher, &admin, &receiver, "target").await;
    let retyped = endpoint_on(&publisher, &admin, &receiver, "retyped").await;
    set_endpoint(
        &operator,
        &admin,
        &retyped,
        json!({ "eventTypes": ["race"] }),
    )
    .await;

    for round in 0..ROUNDS {
        let disable = round % 2 == 0;
        let (published, changed) = tokio::join!(
            publish(&publisher, &admin, "race", json!({ "round": round }), None),
            async {
                set_endpoint(&operator, &admin, &target, json!({ "disabled": disable })).await;
                let types = if disable {
                    json!(["other"])
                } else {
                    json!(["race"])
                };
                set_endpoint(&operator, &admin, &retyped, json!({ "eventTypes": types })).await
            },
        );
        assert_eq!(published["data"]["publish"]["created"], true, "{published}");
        assert!(changed["errors"].is_null(), "{changed}");
        if disable {
            let due = scalar(
                &publisher,
                &format!(
                    "SELECT COUNT(*) FROM webhook_deliveries WHERE endpoint_id = '{target}' \
                     AND state = 'pending' AND next_attempt_at IS NOT NULL"
                ),
            )
            .await;
            assert_eq!(
                due, 0,
                "round {round}: a due delivery on a disabled endpoint"
            );
        }
    }
    set_endpoint(&operator, &admin, &target, json!({ "disabled": true })).await;
    let total = scalar(&publisher, "SELECT COUNT(*) FROM webhook_deliveries").await;

    // Re-enable, run a worker: every delivery made is delivered, each exactly once.
    set_endpoint(&operator, &admin, &target, json!({ "disabled": false })).await;
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    receiver
        .wait_for(total as usize, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = receiver.received();
    let unique: HashSet<&str> = received.iter().map(|r| r.webhook_id.as_str()).collect();
    assert_eq!(unique.len(), total as usize, "every delivery arrived");
    assert_eq!(received.len(), total as usize, "none arrived twice");
    worker.stop().await;
}

/// Retention takes events with their deliveries: an event whose deliveries were all pruned,
/// or that reached nobody, goes once it is older than the retention; a recent one stays.
async fn events_left_without_deliveries_are_pruned(backend: Backend) {
    use courier::retention::prune;
    use sea_orm::Value as SqlValue;
    use tokio_util::sync::CancellationToken;

    use crate::lifecycle::{count, rows};

    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    endpoint_with_types(
        &app,
        &admin,
        "https://example.com/kept",
        Some(vec!["old.reached"]),
    )
    .await;
    let reached = publish(&app, &admin, "old.reached", json!({}), None).await;
    let nobody = publish(&app, &admin, "old.nobody", json!({}), None).await;
    let recent = publish(&app, &admin, "recent.nobody", json!({}), None).await;
    let id_of = |body: &Value| -> uuid::Uuid {
        body["data"]["publish"]["event"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("{body}"))
    };
    let past = courier::db::now() - chrono::Duration::days(40);
    for event in [id_of(&reached), id_of(&nobody)] {
        rows(
            &app.state.db,
            "UPDATE events SET created_at = $1 WHERE id = $2",
            vec![past.into(), event.into()],
        )
        .await;
    }
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL, created_at = $1, updated_at = $1",
        vec![past.into()],
    )
    .await;

    prune(&app.state.db, 30, &CancellationToken::new())
        .await
        .expect("pruned");
    let left = |event: uuid::Uuid| {
        let db = app.state.db.clone();
        async move {
            count(
                &db,
                "SELECT COUNT(*) AS n FROM events WHERE id = $1",
                vec![SqlValue::from(event)],
            )
            .await
        }
    };
    assert_eq!(
        left(id_of(&reached)).await,
        0,
        "its deliveries were pruned, so is it"
    );
    assert_eq!(
        left(id_of(&nobody)).await,
        0,
        "it reached nobody and is old"
    );
    assert_eq!(left(id_of(&recent)).await, 1, "a recent event stays");
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM submissions",
            Vec::new()
        )
        .await,
        0
    );
}
