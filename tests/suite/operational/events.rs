//! Each operational event end to end, signed and checked with the official verifier; a
//! disable rolled back emits nothing and one committed emits one; `publish` refuses the
//! reserved types.

use std::time::Duration;

use courier::service::switch::{self, DisabledReason};
use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::{count, endpoint_on, quick_worker, submit};
use crate::support::operational::{ops_endpoint, update_endpoint, ALL_TYPES};
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

/// The operational webhooks `receiver` got at `path`, in arrival order, each verified.
fn told(receiver: &Receiver, path: &str) -> Vec<Value> {
    receiver
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| {
            assert!(
                r.verified,
                "signed with the endpoint's secret: {:?}",
                r.body
            );
            r.body
        })
        .collect()
}

/// A manual disable and enable, a `Retry-After` pause, a failed delivery and a disable for
/// failing each reach the operations endpoint, once, with what it needs to act.
async fn each_event_reaches_the_operations_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.disable_after_failures = 2;
    })
    .await;
    let admin = app.admin_token().await;
    let ops = Receiver::accepting().await;
    ops_endpoint(&app, &admin, &ops, "ops", None, ALL_TYPES).await;
    // The first request anywhere is asked to wait a second; every other one fails.
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let flaky =
        Receiver::start(
            move |_| match calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Reply {
                    headers: vec![("retry-after", "1".to_owned())],
                    ..Reply::status(429)
                },
                _ => Reply::status(500),
            },
        )
        .await;
    let watched = endpoint_on(&app, &admin, &flaky, "watched").await;

    // A manual disable and enable, heard in that order (the events about one endpoint
    // share an ordering key).
    update_endpoint(&app, &admin, &watched, json!({ "disabled": true })).await;
    update_endpoint(&app, &admin, &watched, json!({ "disabled": false })).await;
    let arrived = ops.wait_for(2, Duration::from_secs(10)).await;
    let bodies: Vec<Value> = arrived.iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies[0]["type"], "courier.endpoint.disabled", "{bodies:?}");
    assert_eq!(bodies[0]["endpointId"], watched.as_str());
    assert_eq!(bodies[0]["reason"], "MANUAL");
    assert!(bodies[0]["at"].as_str().is_some_and(|at| at.ends_with('Z')));
    assert_eq!(bodies[1]["type"], "courier.endpoint.enabled");
    assert_eq!(bodies[1]["endpointId"], watched.as_str());
    let key = format!("courier.endpoint.{watched}");
    assert!(arrived
        .iter()
        .all(|r| r.ordering_key.as_deref() == Some(key.as_str())));

    // A 429 with Retry-After pauses it (told once), then the delivery fails (told), and
    // the second failure in a row disables it for failing (told).
    let first = submit(&app, &admin, &watched, json!({ "n": 1 }), None).await;
    let first_id = first["data"]["submit"]["delivery"]["id"].clone();
    submit(&app, &admin, &watched, json!({ "n": 2 }), None).await;
    ops.wait_for(6, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bodies = told(&ops, "ops");
    let types: Vec<&str> = bodies.iter().filter_map(|b| b["type"].as_str()).collect();
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "courier.endpoint.paused")
            .count(),
        1,
        "one pause, one event: {types:?}"
    );
    let paused = bodies
        .iter()
        .find(|b| b["type"] == "courier.endpoint.paused")
        .expect("paused");
    assert_eq!(paused["endpointId"], watched.as_str());
    assert!(paused["until"].as_str().is_some(), "{paused}");
    let failed: Vec<&Value> = bodies
        .iter()
        .filter(|b| b["type"] == "courier.delivery.failed")
        .collect();
    assert_eq!(failed.len(), 2, "{bodies:?}");
    assert!(failed.iter().any(|b| b["deliveryId"] == first_id));
    assert!(failed.iter().all(|b| b["endpointId"] == watched.as_str()));
    let disabled: Vec<&Value> = bodies
        .iter()
        .filter(|b| b["type"] == "courier.endpoint.disabled")
        .collect();
    assert_eq!(disabled.len(), 2, "{bodies:?}");
    assert_eq!(disabled[1]["reason"], "FAILING");
    assert_eq!(bodies.len(), 6, "nothing else: {types:?}");
    // The disable is told after the failure that caused it (recorded in one transaction).
    assert_eq!(
        types.last(),
        Some(&"courier.endpoint.disabled"),
        "the failures first, then the disable they caused: {types:?}"
    );
}

/// The event is written by the transaction that disables: rolled back, nothing; committed,
/// exactly one event and one delivery per listener.
async fn a_rolled_back_disable_emits_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let ops = Receiver::accepting().await;
    ops_endpoint(&app, &admin, &ops, "ops", None, ALL_TYPES).await;
    let (watched, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let watched: uuid::Uuid = watched.parse().expect("uuid");
    let pool = &app.state.db;
    let events = "SELECT COUNT(*) AS n FROM events WHERE event_type = 'courier.endpoint.disabled'";

    let txn = pool.begin_write().await.expect("begin");
    let announced = switch::disable(&txn, pool.backend(), watched, DisabledReason::Manual)
        .await
        .expect("disable")
        .expect("it was enabled");
    assert_eq!(announced.len(), 1, "one listener");
    txn.rollback().await.expect("rollback");
    assert_eq!(count(pool, events, vec![]).await, 0);
    assert_eq!(
        count(pool, "SELECT COUNT(*) AS n FROM webhook_deliveries", vec![]).await,
        0
    );

    let txn = pool.begin_write().await.expect("begin");
    switch::disable(&txn, pool.backend(), watched, DisabledReason::Manual)
        .await
        .expect("disable")
        .expect("it was enabled");
    txn.commit().await.expect("commit");
    assert_eq!(count(pool, events, vec![]).await, 1);
    assert_eq!(
        count(pool, "SELECT COUNT(*) AS n FROM webhook_deliveries", vec![]).await,
        1
    );
    // Disabling again changes nothing and tells nothing.
    let txn = pool.begin_write().await.expect("begin");
    let again = switch::disable(&txn, pool.backend(), watched, DisabledReason::Manual)
        .await
        .expect("disable");
    txn.commit().await.expect("commit");
    assert!(again.is_none());
    assert_eq!(count(pool, events, vec![]).await, 1);
}

/// No caller can forge an operational event: `publish` refuses `courier.*` types, and
/// anything a reader would take for one (another case, fullwidth or small-capital letters,
/// a Cyrillic `с` or Greek `ϲ`, a digit for a letter, a one-dot leader, a zero-width space
/// in front), and `submit` refuses them as labels,
/// writing nothing.
async fn publish_refuses_the_reserved_types(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let ops = Receiver::accepting().await;
    ops_endpoint(&app, &admin, &ops, "ops", None, ALL_TYPES).await;
    for event_type in [
        "courier.endpoint.disabled",
        "courier.anything",
        "Courier.endpoint.disabled",
        "\u{ff43}ourier.endpoint.disabled",
        "\u{441}ourier.delivery.failed",
        "courier\u{2024}endpoint.paused",
        "\u{200b}courier.endpoint.disabled",
        "\u{3f2}ourier.endpoint.disabled",
        "COUR1ER.endpoint.disabled",
        "\u{1d04}\u{1d0f}\u{1d1c}\u{280}\u{26a}\u{1d07}\u{280}.x",
    ] {
        let input = json!({ "eventType": event_type, "payload": { "type": event_type } });
        let body = app
            .graphql(
                &admin,
                crate::support::fixtures::PUBLISH,
                json!({ "input": input }),
            )
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for event_type in ["courier.endpoint.disabled", "COURIER.endpoint.disabled"] {
        let input = json!({ "endpointId": endpoint, "payload": {}, "eventType": event_type });
        let body = app
            .graphql(
                &admin,
                crate::support::fixtures::SUBMIT,
                json!({ "input": input }),
            )
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    assert_eq!(
        count(&app.state.db, "SELECT COUNT(*) AS n FROM events", vec![]).await,
        0
    );
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM submissions",
            vec![]
        )
        .await,
        0
    );

    // An endpoint may listen only for the reserved types Courier publishes: a typo, or a
    // look-alike, would never be heard. Creating or updating with one writes nothing.
    const CREATE: &str = "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }";
    const UPDATE: &str = "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { eventTypes } } }";
    let endpoints = "SELECT COUNT(*) AS n FROM endpoints";
    let before = count(&app.state.db, endpoints, vec![]).await;
    for event_type in ["courier.endpoint.disable", "Courier.delivery.failed"] {
        let input = json!({
            "name": "typo",
            "url": "https://example.com/typo",
            "eventTypes": ["order.paid", event_type],
        });
        let body = app.graphql(&admin, CREATE, json!({ "input": input })).await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
        let input = json!({ "eventTypes": [event_type] });
        let body = app
            .graphql(&admin, UPDATE, json!({ "id": endpoint, "input": input }))
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    assert_eq!(count(&app.state.db, endpoints, vec![]).await, before);
    let listed = "SELECT COUNT(*) AS n FROM endpoints WHERE event_types <> '[]'";
    assert_eq!(
        count(&app.state.db, listed, vec![]).await,
        1,
        "only the operations endpoint lists types"
    );
}

on_both_backends!(
    each_event_reaches_the_operations_endpoint,
    a_rolled_back_disable_emits_nothing,
    publish_refuses_the_reserved_types,
);
