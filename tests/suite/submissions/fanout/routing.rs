//! Who an event reaches (types, enabled state, scope) and idempotency per API key.

use std::collections::HashSet;

use courier::auth::Role;
use serde_json::json;

use crate::on_both_backends;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

use super::*;
use crate::support::endpoints::endpoint_with_types;
use crate::support::fixtures::publish;

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

/// An event type is one type however its accents are encoded: a publish spelling `café`
/// with a combining accent reaches the endpoint subscribed to it with a composed `é`, and
/// the type reads back composed everywhere (the event, the subscription, a filter).
async fn a_type_is_matched_in_its_composed_form(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let composed = "caf\u{e9}.paid";
    let decomposed = "cafe\u{301}.paid";
    let subscribed = endpoint_with_types(
        &app,
        &admin,
        "https://example.com/cafe",
        Some(vec![decomposed]),
    )
    .await;
    let body = app
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { eventTypes } }",
            json!({ "id": subscribed }),
        )
        .await;
    assert_eq!(
        body["data"]["endpoint"]["eventTypes"],
        json!([composed]),
        "{body}"
    );

    let body = publish(&app, &admin, decomposed, json!({ "n": 1 }), None).await;
    let event = &body["data"]["publish"]["event"];
    assert_eq!(event["eventType"], composed, "{body}");
    let edges = event["deliveries"]["edges"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(edges.len(), 1, "{body}");
    assert_eq!(
        edges[0]["node"]["endpoint"]["id"],
        json!(subscribed),
        "{body}"
    );

    let body = app
        .graphql(
            &admin,
            "query($type: String!) { deliveries(filter: {eventType: $type}) { edges { node { id } } } }",
            json!({ "type": decomposed }),
        )
        .await;
    assert_eq!(
        body["data"]["deliveries"]["edges"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );
}

on_both_backends!(
    a_type_is_matched_in_its_composed_form,
    publish_routes_by_type_state_and_scope,
    publish_is_idempotent_per_api_key,
);
