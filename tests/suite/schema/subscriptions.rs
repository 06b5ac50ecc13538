//! `deliveryStateChanged` over real WebSockets, in both protocols and across app instances.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier::auth::Role;
use futures_util::StreamExt as _;
use sea_orm::ConnectionTrait as _;
use serde_json::{json, Value};

use crate::support::fixtures::submit;
use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::websocket::{connect, next, send, Socket};
use crate::support::{response_error_code, Backend, Receiver, Reply, TestApp, TestDb};

const SUBSCRIPTION: &str =
    "subscription($endpointId: ID) { deliveryStateChanged(endpointId: $endpointId) {
    deliveryId endpointId previousState state at delivery { id state } } }";

/// Opens a socket, authenticates, and starts the subscription.
async fn subscribe(app: &TestApp, token: &str, protocol: &str, endpoint: Option<&str>) -> Socket {
    let mut socket = connect(app, protocol).await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    let start = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    send(&mut socket, json!({ "id": "s", "type": start, "payload": { "query": SUBSCRIPTION, "variables": { "endpointId": endpoint } } })).await;
    socket
}

/// The next payload (`{data}` or `{errors}`) of the subscription, or `None` if nothing
/// arrives within `wait`.
async fn next_payload(socket: &mut Socket, wait: Duration) -> Option<Value> {
    let message = tokio::time::timeout(wait, next(socket)).await.ok()??;
    match message["type"].as_str() {
        Some("next") | Some("data") => Some(message["payload"].clone()),
        Some("error") => Some(json!({ "errors": message["payload"] })),
        _ => Some(json!({ "other": message })),
    }
}

/// Submits sentinels until the subscriber sees an event: a subscribe has no acknowledgement.
async fn until_live(socket: &mut Socket, app: &TestApp, token: &str, endpoint: &str) {
    for _ in 0..50 {
        submit(app, token, endpoint, json!({ "sentinel": true }), None).await;
        if next_payload(socket, Duration::from_millis(200))
            .await
            .is_some()
        {
            // Drain whatever else the sentinels produced.
            while next_payload(socket, Duration::from_millis(300))
                .await
                .is_some()
            {}
            return;
        }
    }
    panic!("the subscription never went live");
}

fn change(payload: &Value) -> &Value {
    &payload["data"]["deliveryStateChanged"]
}

/// A subscriber on instance A (no worker) sees every transition, in order, of a delivery
/// submitted through A and delivered, after one retry, by the worker of instance B.
async fn every_transition_crosses_instances_in_order(protocol: &str) {
    let db = TestDb::new(Backend::Postgres).await;
    let api = TestApp::spawn(&db).await;
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    let admin = api.admin_token().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let receiver = Receiver::start(move |_| {
        Reply::status(if counter.fetch_add(1, Ordering::SeqCst) == 0 {
            500
        } else {
            200
        })
    })
    .await;
    let sentinel_receiver = Receiver::accepting().await;
    let sentinel = endpoint_on(&api, &admin, &sentinel_receiver, "sentinel").await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "watched").await;

    let mut socket = subscribe(&api, &admin, protocol, None).await;
    until_live(&mut socket, &api, &admin, &sentinel).await;

    let submitted = submit(&api, &admin, &endpoint, json!({ "watch": true }), None).await;
    let id = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut seen = Vec::new();
    while seen.last().map(|(_, state): &(Value, Value)| state.clone()) != Some(json!("DELIVERED")) {
        let payload = next_payload(&mut socket, Duration::from_secs(10))
            .await
            .expect("an event");
        let event = change(&payload);
        assert!(payload.get("errors").is_none(), "{payload}");
        if event["deliveryId"] == id.as_str() {
            assert_eq!(event["endpointId"], endpoint.as_str());
            assert_eq!(event["delivery"]["id"], id.as_str());
            seen.push((event["previousState"].clone(), event["state"].clone()));
        }
    }
    let expected = [
        (Value::Null, "PENDING"),
        (json!("PENDING"), "PROCESSING"),
        (json!("PROCESSING"), "PENDING"),
        (json!("PENDING"), "PROCESSING"),
        (json!("PROCESSING"), "DELIVERED"),
    ];
    let expected: Vec<(Value, Value)> = expected.into_iter().map(|(p, s)| (p, json!(s))).collect();
    assert_eq!(seen, expected, "every transition, in commit order");
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graphql_transport_ws_sees_every_transition_across_instances() {
    every_transition_crosses_instances_in_order("graphql-transport-ws").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_graphql_ws_sees_every_transition_across_instances() {
    every_transition_crosses_instances_in_order("graphql-ws").await;
}

/// Partners see only their endpoints' events; an endpoint filter narrows further; a filter
/// outside the partner's scope, or on no endpoint at all, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_filtered_by_endpoint_and_scoped_to_partners() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let app = TestApp::spawn(&db).await;
        let admin = app.admin_token().await;
        let (mine, _) = app
            .create_endpoint(&admin, "https://example.com/mine")
            .await;
        let (theirs, _) = app
            .create_endpoint(&admin, "https://example.com/theirs")
            .await;
        let partner = app
            .token(
                Role::Partner,
                &[uuid::Uuid::parse_str(&mine).expect("uuid")],
            )
            .await;

        let mut refused = subscribe(&app, &partner, "graphql-transport-ws", Some(&theirs)).await;
        let payload = next_payload(&mut refused, Duration::from_secs(5))
            .await
            .expect("an answer");
        assert_eq!(
            payload["errors"][0]["extensions"]["code"], "FORBIDDEN",
            "{payload}"
        );
        // An admin's filter on an endpoint that does not exist (and never will) is refused
        // too, rather than left waiting forever; a partner's is FORBIDDEN, as above.
        let nowhere = uuid::Uuid::now_v7().to_string();
        for (token, code) in [(&admin, "NOT_FOUND"), (&partner, "FORBIDDEN")] {
            let mut refused = subscribe(&app, token, "graphql-transport-ws", Some(&nowhere)).await;
            let payload = next_payload(&mut refused, Duration::from_secs(5))
                .await
                .expect("an answer");
            assert_eq!(
                payload["errors"][0]["extensions"]["code"], code,
                "{payload}"
            );
        }

        let mut partner_socket = subscribe(&app, &partner, "graphql-transport-ws", None).await;
        until_live(&mut partner_socket, &app, &admin, &mine).await;
        let mut filtered = subscribe(&app, &admin, "graphql-transport-ws", Some(&theirs)).await;
        until_live(&mut filtered, &app, &admin, &theirs).await;

        for endpoint in [&mine, &theirs, &mine] {
            submit(&app, &admin, endpoint, json!({}), None).await;
        }
        let mut partner_events = Vec::new();
        while let Some(payload) =
            next_payload(&mut partner_socket, Duration::from_millis(500)).await
        {
            partner_events.push(change(&payload)["endpointId"].clone());
        }
        assert_eq!(
            partner_events,
            vec![json!(mine), json!(mine)],
            "the partner sees its two creations only"
        );
        let mut filtered_events = Vec::new();
        while let Some(payload) = next_payload(&mut filtered, Duration::from_millis(500)).await {
            filtered_events.push(change(&payload)["endpointId"].clone());
        }
        assert_eq!(
            filtered_events,
            vec![json!(theirs)],
            "the filter admits one endpoint"
        );
    }
}

/// An admin's `deliveryStateChanged { deliveryId state }` on `app`'s schema, in process,
/// not yet polled (the subscription starts at the first poll).
async fn admin_changes_in_process(
    app: &TestApp,
) -> futures_util::stream::BoxStream<'static, async_graphql::Response> {
    let token = app.admin_token().await;
    let caller = courier::auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let schema = courier::schema::build(Some(app.state.clone()));
    let request =
        async_graphql::Request::new("subscription { deliveryStateChanged { deliveryId state } }")
            .data(caller);
    schema.execute_stream(request).boxed()
}

/// A subscriber starts while the listener is down; before it runs again the listener comes
/// back, is lost again (its gap marker sent) and comes back once more. The subscriber
/// subscribed before checking, so the marker reaches it: it is told it may have missed
/// events instead of silently missing them. One thread, so nothing runs in between.
#[tokio::test]
async fn a_subscriber_starting_while_the_listener_is_down_cannot_miss_the_gap() {
    use courier::bus::ChangeMessage;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let events = &app.state.bus;
    events.set_live(false);
    let mut stream = admin_changes_in_process(&app).await;
    // The first poll starts the subscription, which waits for the listener.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err()
    );
    events.set_live(true);
    events.set_live(false);
    events.deliver(ChangeMessage::Gap);
    events.set_live(true);

    let response = tokio::time::timeout(Duration::from_secs(3), stream.next())
        .await
        .expect("the subscriber is told at once")
        .expect("an item");
    assert_eq!(
        response_error_code(&response).as_deref(),
        Some("SUBSCRIPTION_LAGGED"),
        "{response:?}"
    );
}

/// A notification on the changes channel that this process cannot read (another version's,
/// or anything an operator sends there) means changes it missed: its subscribers are told
/// so, as after a lost connection, instead of silently missing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_notification_tells_subscribers_they_missed_events() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let mut stream = admin_changes_in_process(&app).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.next())
            .await
            .is_err(),
        "subscribed, nothing yet"
    );
    let other = db.connect(1).await;
    other
        .conn()
        .execute_unprepared(&format!(
            "SELECT pg_notify('{}', '[{{\"no\": \"such change\"}}]')",
            courier::bus::CHANGES_CHANNEL
        ))
        .await
        .expect("notified");
    let response = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("told")
        .expect("an item");
    assert_eq!(
        response_error_code(&response).as_deref(),
        Some("SUBSCRIPTION_LAGGED"),
        "{response:?}"
    );
}

/// Reads a subscription's payloads until its first error (events before it are skipped).
async fn until_error(socket: &mut Socket, within: Duration) -> Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let payload = next_payload(socket, left)
            .await
            .expect("an error before the deadline");
        if payload.get("errors").is_some() {
            return payload;
        }
    }
}

/// Two instances on one PostgreSQL database: one watched by subscribers, the other
/// making changes; an admin key and an endpoint.
struct Pair {
    db: TestDb,
    watched: TestApp,
    other: TestApp,
    admin: String,
    endpoint: String,
}

impl Pair {
    async fn new() -> Pair {
        let db = TestDb::new(Backend::Postgres).await;
        let watched = TestApp::spawn(&db).await;
        let other = TestApp::spawn(&db).await;
        let admin = watched.admin_token().await;
        let (endpoint, _) = watched
            .create_endpoint(&admin, "https://example.com/hook")
            .await;
        Pair {
            db,
            watched,
            other,
            admin,
            endpoint,
        }
    }
}

/// Terminating the `LISTEN` backend tells every open subscriber at once that it may have
/// missed events; once the listener is back, a new subscription sees events again,
/// including those made by another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_listener_lags_every_subscriber_and_events_flow_again() {
    let Pair {
        db,
        watched,
        other,
        admin,
        endpoint,
    } = Pair::new().await;
    let mut sockets = Vec::new();
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut socket = subscribe(&watched, &admin, protocol, None).await;
        until_live(&mut socket, &other, &admin, &endpoint).await;
        sockets.push(socket);
    }

    let killer = db.connect(1).await;
    let terminated = killer
        .conn()
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        ))
        .await
        .expect("terminate")
        .expect("row")
        .try_get::<i64>("", "n")
        .expect("n");
    assert_eq!(terminated, 2, "one listener per instance");
    let cut = std::time::Instant::now();
    for socket in &mut sockets {
        let payload = until_error(socket, Duration::from_secs(3)).await;
        assert_eq!(
            payload["errors"][0]["extensions"]["code"], "SUBSCRIPTION_LAGGED",
            "{payload}"
        );
    }
    assert!(
        cut.elapsed() < Duration::from_secs(3),
        "told promptly: {:?}",
        cut.elapsed()
    );
    assert_eq!(watched.state.metrics.lagged_subscribers.get(), 2);

    let mut fresh = subscribe(&watched, &admin, "graphql-transport-ws", None).await;
    until_live(&mut fresh, &other, &admin, &endpoint).await;
    let submitted = submit(&other, &admin, &endpoint, json!({ "after": true }), None).await;
    let id = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_owned();
    let payload = next_payload(&mut fresh, Duration::from_secs(5))
        .await
        .expect("an event after the listener returned");
    assert_eq!(change(&payload)["deliveryId"], id.as_str(), "{payload}");
}

/// A change whose delivery cannot be read for a subscription that selects it (here: the
/// instance's pool is gone, while its listener still hears another instance's changes)
/// ends that subscription with `SUBSCRIPTION_LAGGED`, so the client knows to refetch,
/// rather than sending an error with nothing to say which change it was, and going on; a
/// subscription that does not select the delivery is told the change as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_whose_delivery_cannot_be_read_ends_the_subscription_as_lagged() {
    let Pair {
        db: _db,
        watched,
        other,
        admin,
        endpoint,
    } = Pair::new().await;
    let mut with_delivery = subscribe(&watched, &admin, "graphql-transport-ws", None).await;
    until_live(&mut with_delivery, &other, &admin, &endpoint).await;
    let mut without = connect(&watched, "graphql-transport-ws").await;
    send(&mut without, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {admin}") } })).await;
    assert_eq!(
        next(&mut without).await.expect("ack")["type"],
        "connection_ack"
    );
    send(
        &mut without,
        json!({ "id": "bare", "type": "subscribe", "payload": { "query":
        "subscription { deliveryStateChanged { deliveryId state } }" } }),
    )
    .await;
    until_live(&mut without, &other, &admin, &endpoint).await;
    // Drain what the second subscription's sentinels told the first.
    while next_payload(&mut with_delivery, Duration::from_millis(300))
        .await
        .is_some()
    {}

    watched
        .state
        .db
        .conn()
        .clone()
        .close()
        .await
        .expect("close the pool");
    let submitted = submit(&other, &admin, &endpoint, json!({ "unread": true }), None).await;
    let id = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_owned();

    let told = next_payload(&mut with_delivery, Duration::from_secs(10))
        .await
        .expect("the subscription is told");
    assert_eq!(
        told["errors"][0]["extensions"]["code"], "SUBSCRIPTION_LAGGED",
        "{told}"
    );
    let after = tokio::time::timeout(Duration::from_secs(5), next(&mut with_delivery))
        .await
        .expect("the subscription ends");
    assert_eq!(
        after.as_ref().map(|message| message["type"].clone()),
        Some(json!("complete")),
        "{after:?}"
    );
    let bare = next_payload(&mut without, Duration::from_secs(10))
        .await
        .expect("the change, to the subscription without the delivery");
    assert_eq!(change(&bare)["deliveryId"], id.as_str(), "{bare}");
}
