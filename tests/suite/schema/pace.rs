//! Subscribers at the pace of the changes, in process: one that falls behind is told so
//! and ended, a burst of thousands at once reaches one whole, one that reads each change's
//! delivery keeps up with thousands a second (and one that reads what lies under it, see
//! `nested_reads`), and a tenant's passes over its neighbours' changes without reading
//! anything.

use std::time::Duration;

use futures_util::StreamExt as _;

use sea_orm::{ConnectionTrait as _, TransactionTrait as _};

use crate::support::subscribed::{next_told, subscribed_as, subscribed_in_process};
use crate::support::tenants::tenant_with_endpoints;
use crate::support::{response_error_code, Backend, Receiver, Reply, TestApp, TestDb};

/// A subscription to every endpoint's state changes.
const EVERY_CHANGE: &str = "subscription { deliveryStateChanged { deliveryId state } }";

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
        let data = next_told(
            &mut stream,
            Duration::from_secs(30),
            &format!("after {told}"),
        )
        .await;
        let change = &data["deliveryStateChanged"];
        assert_eq!(change["delivery"]["id"], change["deliveryId"], "{data}");
        told += 1;
    }
    producer.await.expect("produced");
    assert_eq!(app.state.metrics.lagged_subscribers.get(), 0);
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
