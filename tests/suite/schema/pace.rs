//! Subscribers at the pace of the changes, in process: one that falls behind is told so
//! and ended, a burst of thousands at once reaches one whole, one that reads each change's
//! delivery (and what lies under it) keeps up with thousands a second, and a tenant's
//! passes over its neighbours' changes without reading anything.

use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt as _;

use sea_orm::{ConnectionTrait as _, TransactionTrait as _};

use crate::support::tenants::tenant_with_endpoints;
use crate::support::{response_error_code, Backend, Receiver, Reply, TestApp, TestDb};

/// A subscription to every endpoint's state changes.
const EVERY_CHANGE: &str = "subscription { deliveryStateChanged { deliveryId state } }";

/// `query` run as an admin's subscription on `app`'s schema, in process, once its first
/// poll has subscribed (and, nothing having happened yet, told nothing).
async fn subscribed_in_process(
    app: &TestApp,
    query: &str,
) -> BoxStream<'static, async_graphql::Response> {
    let token = app.admin_token().await;
    subscribed_as(app, &token, query).await
}

/// [`subscribed_in_process`] under the key `token`.
async fn subscribed_as(
    app: &TestApp,
    token: &str,
    query: &str,
) -> BoxStream<'static, async_graphql::Response> {
    let caller = courier::auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let schema = courier::schema::build(Some(app.state.clone()));
    let mut stream = schema
        .execute_stream(async_graphql::Request::new(query).data(caller))
        .boxed();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err(),
        "subscribed, nothing yet"
    );
    stream
}

/// `count` creations of made-up deliveries published on `app`'s bus at once, before any
/// subscriber can read one.
fn publish_changes(app: &TestApp, count: usize) {
    for _ in 0..count {
        let change = courier::bus::StateChange {
            delivery_id: uuid::Uuid::now_v7(),
            endpoint_id: uuid::Uuid::now_v7(),
            previous_state: None,
            state: entity::webhook_delivery::DeliveryState::Pending,
            at: courier::db::now(),
        };
        app.state
            .bus
            .deliver(courier::bus::ChangeMessage::Change(change.into()));
    }
}

/// A subscriber that falls behind is told so, with a stable code, instead of silently
/// missing events; and the open-subscription gauge follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_subscriber_is_told_it_missed_events() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let mut stream = subscribed_in_process(&app, EVERY_CHANGE).await;
    assert_eq!(app.state.metrics.active_subscriptions.get(), 1);

    publish_changes(&app, courier::bus::CHANGE_BUFFER + 1_000);
    let response = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("answered")
        .expect("an item");
    assert_eq!(
        response_error_code(&response).as_deref(),
        Some("SUBSCRIPTION_LAGGED"),
        "{response:?}"
    );
    assert!(
        stream.next().await.is_none(),
        "the lagging subscription ends"
    );
    drop(stream);
    assert_eq!(app.state.metrics.active_subscriptions.get(), 0);
    assert_eq!(app.state.metrics.lagged_subscribers.get(), 1);
}

/// A burst of changes heard at once, as four publishes to 2,300 endpoints each make,
/// reaches a subscriber whole: the buffer holds it (4,096 did not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_four_large_publishes_reaches_a_subscriber_whole() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let mut stream = subscribed_in_process(&app, EVERY_CHANGE).await;
    let burst = 4 * 2_300;
    assert!(burst < courier::bus::CHANGE_BUFFER);
    publish_changes(&app, burst);
    for heard in 0..burst {
        let response = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap_or_else(|_| panic!("change {heard} of the burst never came"))
            .expect("an item");
        assert!(response.errors.is_empty(), "change {heard}: {response:?}");
    }
    assert_eq!(app.state.metrics.lagged_subscribers.get(), 0);
}

/// A subscriber that selects each change's `delivery` keeps up with changes arriving by the
/// thousand (20,000 in eight seconds, over 500 deliveries; a read per change managed under
/// a thousand a second and lagged): the deliveries of the changes waiting are read
/// together, not one round trip each, so it is never told it lagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reading_each_delivery_keeps_up_with_thousands_of_changes() {
    const DELIVERIES: usize = 500;
    const ROUNDS: usize = 40;
    let db = TestDb::new(Backend::Postgres).await;
    let (app, ids) = crate::support::seeding::seed(&db, DELIVERIES).await;
    let mut stream = subscribed_in_process(
        &app,
        "subscription { deliveryStateChanged { deliveryId state delivery { id state } } }",
    )
    .await;
    let endpoint_id = uuid::Uuid::now_v7();
    let bus = app.state.bus.clone();
    let producer = tokio::spawn(async move {
        for _ in 0..ROUNDS {
            for id in &ids {
                let change = courier::bus::StateChange {
                    delivery_id: *id,
                    endpoint_id,
                    previous_state: None,
                    state: entity::webhook_delivery::DeliveryState::Pending,
                    at: courier::db::now(),
                };
                bus.deliver(courier::bus::ChangeMessage::Change(change.into()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut told = 0;
    while told < DELIVERIES * ROUNDS {
        let response = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("answered in time")
            .expect("an item");
        assert!(
            response.errors.is_empty(),
            "after {told}: {:?}",
            response.errors
        );
        let data = response.data.into_json().expect("json");
        let change = &data["deliveryStateChanged"];
        assert_eq!(change["delivery"]["id"], change["deliveryId"], "{data}");
        told += 1;
    }
    producer.await.expect("produced");
    assert_eq!(app.state.metrics.lagged_subscribers.get(), 0);
}

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
    let (endpoint_id, attempts) = {
        let conn = app.state.db.conn();
        let endpoint: String = scalar(
            conn,
            "SELECT endpoint_id::text FROM webhook_deliveries LIMIT 1",
        )
        .await;
        let rows = conn
            .query_all_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT delivery_id::text AS id, number FROM delivery_attempts",
            ))
            .await
            .expect("attempts");
        let attempts: std::collections::HashMap<String, i32> = rows
            .iter()
            .map(|row| {
                (
                    row.try_get::<String>("", "id").expect("id"),
                    row.try_get::<i32>("", "number").expect("number"),
                )
            })
            .collect();
        (endpoint, attempts)
    };
    assert_eq!(attempts.len(), DELIVERIES / 2);
    let bus = app.state.bus.clone();
    let producer = tokio::spawn(async move {
        for _ in 0..ROUNDS {
            for id in &ids {
                let change = courier::bus::StateChange {
                    delivery_id: *id,
                    endpoint_id: uuid::Uuid::nil(),
                    previous_state: None,
                    state: entity::webhook_delivery::DeliveryState::Pending,
                    at: courier::db::now(),
                };
                bus.deliver(courier::bus::ChangeMessage::Change(change.into()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    for told in 0..DELIVERIES * ROUNDS {
        let response = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("answered in time")
            .expect("an item");
        assert!(
            response.errors.is_empty(),
            "after {told}: {:?}",
            response.errors
        );
        let data = response.data.into_json().expect("json");
        let change = &data["deliveryStateChanged"];
        let delivery = &change["delivery"];
        let id = change["deliveryId"].as_str().expect("id");
        assert_eq!(delivery["id"], id, "{data}");
        assert_eq!(delivery["endpoint"]["id"], endpoint_id.as_str(), "{data}");
        assert!(delivery["submission"]["payload"]["n"].is_u64(), "{data}");
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
        let change = courier::bus::StateChange {
            delivery_id: ids[0],
            endpoint_id: uuid::Uuid::nil(),
            previous_state: None,
            state: entity::webhook_delivery::DeliveryState::Pending,
            at: courier::db::now(),
        };
        app.state
            .bus
            .deliver(courier::bus::ChangeMessage::Change(change.into()));
        let response = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("answered in time")
            .expect("an item");
        assert!(response.errors.is_empty(), "{response:?}");
        let data = response.data.into_json().expect("json");
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
    let response = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("answered in time")
        .expect("an item");
    assert!(response.errors.is_empty(), "{response:?}");
    let data = response.data.into_json().expect("json");
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

/// The text of the first column of `sql`'s first row.
async fn scalar(conn: &impl sea_orm::ConnectionTrait, sql: &str) -> String {
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            sql,
        ))
        .await
        .expect("query")
        .expect("a row");
    row.try_get_by_index::<String>(0).expect("text")
}

/// A change of one endpoint, as the bus carries it.
fn change_of(endpoint_id: &str) -> courier::bus::ChangeMessage {
    let change = courier::bus::StateChange {
        delivery_id: uuid::Uuid::now_v7(),
        endpoint_id: endpoint_id.parse().expect("endpoint id"),
        previous_state: None,
        state: entity::webhook_delivery::DeliveryState::Pending,
        at: courier::db::now(),
    };
    courier::bus::ChangeMessage::Change(change.into())
}

/// A tenant's subscriber (the portal's live feed) decides another tenant's changes from
/// what it remembers of their endpoint, reading nothing: with the `endpoints` table locked
/// by another connection, its own change behind 200 of a neighbour's still arrives at once.
/// (Each neighbour's change was a read before: it waited on the lock, and the subscription
/// ended as lagged.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_subscriber_reads_nothing_for_its_neighbours_changes() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let own = tenant_with_endpoints(&app, &admin, "Own", &receiver, &["own"]).await;
    let neighbour =
        tenant_with_endpoints(&app, &admin, "Neighbour", &receiver, &["neighbour"]).await;
    let mut stream = subscribed_as(
        &app,
        &own.token,
        "subscription { deliveryStateChanged { endpointId } }",
    )
    .await;
    // One change of each endpoint: the subscriber learns both endpoints' tenants.
    let bus = app.state.bus.clone();
    bus.deliver(change_of(&neighbour.endpoints[0]));
    bus.deliver(change_of(&own.endpoints[0]));
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("answered")
        .expect("an item");
    let first = first.data.into_json().expect("json");
    assert_eq!(
        first["deliveryStateChanged"]["endpointId"],
        own.endpoints[0].as_str()
    );

    let locker = db.connect(1).await;
    let lock = locker.conn().begin().await.expect("begin");
    lock.execute_unprepared("LOCK TABLE endpoints IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("locked");
    for _ in 0..200 {
        bus.deliver(change_of(&neighbour.endpoints[0]));
    }
    bus.deliver(change_of(&own.endpoints[0]));
    let told = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
    lock.rollback().await.expect("unlocked");
    let told = told
        .expect("its own change arrives while endpoints cannot be read")
        .expect("an item");
    assert!(told.errors.is_empty(), "{:?}", told.errors);
    let told = told.data.into_json().expect("json");
    assert_eq!(
        told["deliveryStateChanged"]["endpointId"],
        own.endpoints[0].as_str(),
        "nothing of the neighbour's is told"
    );
}
