//! What a subscriber selects under each change's delivery (its endpoint, submission and
//! attempts, a published submission's event): read for the changes at hand together, so
//! a subscriber keeps up with thousands of changes a second, yet read for those changes,
//! never kept from earlier ones, and each delivery's own.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::ConnectionTrait as _;

use serde_json::json;

use crate::support::fixtures::submit;
use crate::support::subscribed::{next_told, subscribed_as, subscribed_in_process};
use crate::support::tenants::tenant_with_endpoints;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A subscriber that selects what lies under each change's delivery (its endpoint,
/// submission and attempts) keeps up with changes arriving by the thousand, as one that
/// selects the delivery alone does: those are read for the changes waiting together, one
/// statement each, where each change's own reads (and the loaders' batching window each
/// waited for) let it fall minutes behind and lag. What it is told is each delivery's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reading_under_each_delivery_keeps_up_with_thousands_of_changes() {
    const DELIVERIES: usize = 500;
    const ROUNDS: usize = 40;
    let db = TestDb::new(Backend::Postgres).await;
    let (app, ids) = crate::support::seeding::seed(&db, DELIVERIES).await;
    // Every other delivery has an attempt (its number its position), the rest none.
    app.state
        .db
        .conn()
        .execute_unprepared(
            "INSERT INTO delivery_attempts (id, delivery_id, number, claim_token, started_at, \
             finished_at, status_code, superseded) \
             SELECT gen_random_uuid(), d.id, n::int, gen_random_uuid(), now(), now(), 500, false \
             FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM webhook_deliveries) d \
             WHERE n % 2 = 0",
        )
        .await
        .expect("attempts");
    let mut stream = subscribed_in_process(
        &app,
        "subscription { deliveryStateChanged { deliveryId delivery { id \
         endpoint { id } submission { id payload } attempts { number } } } }",
    )
    .await;
    let endpoint_id = endpoint_of(&app, ids[0]).await;
    let position: HashMap<String, u64> = (0u64..)
        .zip(&ids)
        .map(|(n, id)| (id.to_string(), n))
        .collect();
    let attempts: HashMap<String, i32> = app
        .state
        .db
        .conn()
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT delivery_id::text AS id, number FROM delivery_attempts",
        ))
        .await
        .expect("attempts")
        .iter()
        .map(|row| {
            (
                row.try_get::<String>("", "id").expect("id"),
                row.try_get::<i32>("", "number").expect("number"),
            )
        })
        .collect();
    assert_eq!(attempts.len(), DELIVERIES / 2);
    let bus = app.state.bus.clone();
    let producer = tokio::spawn(async move {
        for _ in 0..ROUNDS {
            for id in &ids {
                bus.deliver(creation_of(*id));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    for told in 0..DELIVERIES * ROUNDS {
        let data = next_told(
            &mut stream,
            Duration::from_secs(30),
            &format!("after {told}"),
        )
        .await;
        let change = &data["deliveryStateChanged"];
        let delivery = &change["delivery"];
        let id = change["deliveryId"].as_str().expect("id");
        assert_eq!(delivery["id"], id, "{data}");
        assert_eq!(delivery["endpoint"]["id"], endpoint_id.as_str(), "{data}");
        assert_eq!(
            delivery["submission"]["payload"]["n"], position[id],
            "{data}"
        );
        let numbers: Vec<i64> = delivery["attempts"]
            .as_array()
            .expect("attempts")
            .iter()
            .filter_map(|attempt| attempt["number"].as_i64())
            .collect();
        let expected: Vec<i64> = attempts
            .get(id)
            .map(|n| i64::from(*n))
            .into_iter()
            .collect();
        assert_eq!(numbers, expected, "{data}");
    }
    producer.await.expect("produced");
    assert_eq!(app.state.metrics.lagged_subscribers.get(), 0);
}

/// What a subscriber reads under a change's delivery is read for that change, never kept
/// from an earlier one: an endpoint renamed between two changes is told by its new name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_lies_under_a_changes_delivery_is_read_afresh_for_each_change() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (app, ids) = crate::support::seeding::seed(&db, 1).await;
    let mut stream = subscribed_in_process(
        &app,
        "subscription { deliveryStateChanged { delivery { endpoint { id name } } } }",
    )
    .await;
    let admin = app.admin_token().await;
    let mut told = Vec::new();
    for name in ["before", "after"] {
        let renamed = app
            .graphql(
                &admin,
                "mutation($id: ID!, $name: String!) { updateEndpoint(id: $id, input: {name: $name}) { endpoint { name } } }",
                serde_json::json!({ "id": endpoint_of(&app, ids[0]).await, "name": name }),
            )
            .await;
        assert_eq!(
            renamed["data"]["updateEndpoint"]["endpoint"]["name"], name,
            "{renamed}"
        );
        app.state.bus.deliver(creation_of(ids[0]));
        let data = next_told(&mut stream, Duration::from_secs(10), "the change").await;
        told.push(data["deliveryStateChanged"]["delivery"]["endpoint"]["name"].clone());
    }
    assert_eq!(told, ["before", "after"]);
}

/// A published delivery's payload, stored once on its event, is read with the changes at
/// hand like the rest of what lies under the delivery, and is the event's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_deliverys_payload_is_told_with_its_change() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    crate::support::endpoints::endpoint_with_types(
        &app,
        &admin,
        "https://example.com/hook",
        Some(vec!["order.created"]),
    )
    .await;
    let mut stream = subscribed_in_process(
        &app,
        "subscription { deliveryStateChanged { previousState delivery { submission { \
         payload event { eventType payload } } } } }",
    )
    .await;
    let published = app
        .graphql(
            &admin,
            crate::support::fixtures::PUBLISH,
            serde_json::json!({ "input": { "eventType": "order.created", "payload": { "n": 7 } } }),
        )
        .await;
    assert!(published["errors"].is_null(), "{published}");
    let data = next_told(&mut stream, Duration::from_secs(10), "the change").await;
    let change = &data["deliveryStateChanged"];
    assert!(
        change["previousState"].is_null(),
        "the creation first: {data}"
    );
    let submission = &change["delivery"]["submission"];
    assert_eq!(
        submission["payload"],
        serde_json::json!({ "n": 7 }),
        "{data}"
    );
    assert_eq!(submission["event"]["eventType"], "order.created", "{data}");
    assert_eq!(
        submission["event"]["payload"],
        serde_json::json!({ "n": 7 }),
        "{data}"
    );
}

/// A tenant's subscriber that selects what lies under each delivery is told of its own
/// deliveries only, each with its own endpoint and attempts, though the changes it reads
/// ahead with may include a neighbour's (read, never told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_subscriber_is_told_only_its_own_deliveries_and_what_lies_under_them() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn_with(&db, |config| config.worker_concurrency = 4).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let own = tenant_with_endpoints(&app, &admin, "Own", &receiver, &["own"]).await;
    let neighbour =
        tenant_with_endpoints(&app, &admin, "Neighbour", &receiver, &["neighbour"]).await;
    let mut stream = subscribed_as(
        &app,
        &own.token,
        "subscription { deliveryStateChanged { endpointId state delivery { id \
         endpoint { id } attempts { statusCode } } } }",
    )
    .await;
    for n in 0..5 {
        for endpoint in [&neighbour.endpoints[0], &own.endpoints[0]] {
            let body = submit(&app, &admin, endpoint, json!({ "n": n }), None).await;
            assert!(body["errors"].is_null(), "{body}");
        }
    }
    let mut delivered = 0;
    while delivered < 5 {
        let data = next_told(&mut stream, Duration::from_secs(10), "the change").await;
        let change = &data["deliveryStateChanged"];
        assert_eq!(change["endpointId"], own.endpoints[0].as_str(), "{data}");
        assert_eq!(
            change["delivery"]["endpoint"]["id"],
            own.endpoints[0].as_str(),
            "{data}"
        );
        if change["state"] == "DELIVERED" {
            delivered += 1;
            assert!(
                change["delivery"]["attempts"]
                    .as_array()
                    .is_some_and(|attempts| attempts.iter().any(|a| a["statusCode"] == 200)),
                "a delivered change is told with its attempt: {data}"
            );
        }
    }
}

/// The endpoint of delivery `id`.
async fn endpoint_of(app: &TestApp, id: uuid::Uuid) -> String {
    app.state
        .deliveries
        .load(id)
        .await
        .expect("read")
        .expect("delivery")
        .endpoint_id
        .to_string()
}

/// The creation of delivery `id`, as the bus carries it (of no endpoint in particular: what
/// is told of the delivery is read from it).
fn creation_of(id: uuid::Uuid) -> courier::bus::ChangeMessage {
    let change = courier::bus::StateChange {
        delivery_id: id,
        endpoint_id: uuid::Uuid::nil(),
        previous_state: None,
        state: entity::webhook_delivery::DeliveryState::Pending,
        at: courier::db::now(),
    };
    courier::bus::ChangeMessage::Change(change.into())
}
