//! A tenant's key reaches every endpoint of its tenant and nothing of another's: every
//! query, mutation, listing, replay and subscription is refused across tenants, on an
//! instance other than the one that set things up.

use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::{publish, quick_worker, submit, wait_for_state, PUBLISH};
use crate::support::tenants::{assert_forbidden, endpoint_ids, tenant_with_endpoints};
use crate::support::websocket::{connect, next, send};
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

/// Every delivery the key lists, as `(delivery id, endpoint id)`.
async fn listed(app: &TestApp, token: &str) -> Vec<(String, String)> {
    let body = app
        .graphql(
            token,
            "{ deliveries(first: 100) { edges { node { id endpoint { id } } } } }",
            json!({}),
        )
        .await;
    body["data"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("deliveries: {body}"))
        .iter()
        .map(|edge| {
            (
                edge["node"]["id"].as_str().unwrap_or_default().to_owned(),
                edge["node"]["endpoint"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

async fn every_operation_is_refused_across_tenants(backend: Backend) {
    let db = TestDb::new(backend).await;
    let setup = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let other = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = setup.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let acme = tenant_with_endpoints(&setup, &admin, "Acme", &receiver, &["acme"]).await;
    let globex = tenant_with_endpoints(&setup, &admin, "Globex", &receiver, &["globex"]).await;
    let (acme_endpoint, globex_endpoint) = (&acme.endpoints[0], &globex.endpoints[0]);

    // Each tenant's key submits to its own endpoint, on the other instance; both fail.
    let mine = submit(&other, &acme.token, acme_endpoint, json!({"n": 1}), None).await;
    let theirs = submit(
        &other,
        &globex.token,
        globex_endpoint,
        json!({"n": 2}),
        None,
    )
    .await;
    let my_delivery = mine["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{mine}"))
        .to_owned();
    let their_delivery = theirs["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{theirs}"))
        .to_owned();
    let their_submission = theirs["data"]["submit"]["submission"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    wait_for_state(
        &other,
        &admin,
        &my_delivery,
        "FAILED",
        Duration::from_secs(15),
    )
    .await;
    wait_for_state(
        &other,
        &admin,
        &their_delivery,
        "FAILED",
        Duration::from_secs(15),
    )
    .await;
    let their_event = publish(&other, &globex.token, "order.paid", json!({"n": 3}), None).await;
    let their_event = their_event["data"]["publish"]["event"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{their_event}"))
        .to_owned();
    // An admin's event of a type no endpoint takes reached nobody: no tenant reads it.
    let nobodys = publish(&other, &admin, "nobody.listens", json!({"n": 4}), None).await;
    let nobodys_event = nobodys["data"]["publish"]["event"]["id"].as_str();
    let nobodys_event = nobodys_event.unwrap_or_else(|| panic!("{nobodys}"));

    let token = &acme.token;
    // What it sees: its own, only.
    assert_eq!(
        endpoint_ids(&other, token).await,
        vec![acme_endpoint.clone()]
    );
    let seen = listed(&other, token).await;
    assert!(!seen.is_empty(), "its own deliveries are listed");
    assert!(
        seen.iter().all(|(_, endpoint)| endpoint == acme_endpoint),
        "nothing of the other tenant is listed: {seen:?}"
    );
    let own = other
        .graphql(
            token,
            "query($id: ID!) { tenant(id: $id) { name endpoints { edges { node { id } } } } }",
            json!({ "id": acme.id }),
        )
        .await;
    assert_eq!(own["data"]["tenant"]["name"], "Acme", "{own}");
    assert_eq!(
        own["data"]["tenant"]["endpoints"]["edges"][0]["node"]["id"],
        acme_endpoint.as_str(),
        "{own}"
    );

    // Reading anything of the other tenant.
    let reads: Vec<(&str, &str, Value)> = vec![
        (
            "endpoint",
            "query($id: ID!) { endpoint(id: $id) { id } }",
            json!({ "id": globex_endpoint }),
        ),
        (
            "tenant",
            "query($id: ID!) { tenant(id: $id) { id } }",
            json!({ "id": globex.id }),
        ),
        (
            "tenants",
            "{ tenants { edges { node { id } } } }",
            json!({}),
        ),
        (
            "delivery",
            "query($id: ID!) { delivery(id: $id) { id } }",
            json!({ "id": their_delivery }),
        ),
        (
            "submission",
            "query($id: ID!) { submission(id: $id) { id } }",
            json!({ "id": their_submission }),
        ),
        (
            "event",
            "query($id: ID!) { event(id: $id) { id } }",
            json!({ "id": their_event }),
        ),
        (
            "an admin's event that reached nobody",
            "query($id: ID!) { event(id: $id) { id } }",
            json!({ "id": nobodys_event }),
        ),
        (
            "deliveries of its endpoint",
            "query($id: ID!) { deliveries(filter: {endpointId: $id}) { edges { node { id } } } }",
            json!({ "id": globex_endpoint }),
        ),
        (
            "deliveries of the tenant",
            "query($id: ID!) { deliveries(filter: {tenantId: $id}) { edges { node { id } } } }",
            json!({ "id": globex.id }),
        ),
        (
            "apiKeys",
            "{ apiKeys { edges { node { id } } } }",
            json!({}),
        ),
    ];
    for (what, query, variables) in reads {
        assert_forbidden(what, &other.graphql(token, query, variables).await);
    }

    // A cursor naming the other tenant's delivery is answered as one naming nothing.
    let cursor = courier::service::pagination::encode_cursor(
        courier::service::pagination::Listed::Deliveries,
        uuid::Uuid::parse_str(&their_delivery).expect("uuid").into(),
    );
    let paged = other
        .graphql(
            token,
            "query($after: String) { deliveries(filter: {createdAfter: \"2000-01-01T00:00:00Z\"}, after: $after) { edges { node { id } } } }",
            json!({ "after": cursor }),
        )
        .await;
    assert_eq!(gql_error_code(&paged), Some("BAD_USER_INPUT"), "{paged}");
    assert!(
        paged["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no longer exists")),
        "{paged}"
    );

    // Changing anything of the other tenant.
    let writes: Vec<(&str, &str, Value)> = vec![
        (
            "submit",
            "mutation($id: ID!) { submit(input: {endpointId: $id, payload: {}}) { created } }",
            json!({ "id": globex_endpoint }),
        ),
        ("replayDelivery", "mutation($id: ID!) { replayDelivery(id: $id) { id } }", json!({ "id": their_delivery })),
        (
            "replayDeliveries of its endpoint",
            "mutation($id: ID!) { replayDeliveries(filter: {endpointId: $id}) { replayed } }",
            json!({ "id": globex_endpoint }),
        ),
        ("resendDelivery", "mutation($id: ID!) { resendDelivery(id: $id) { id } }", json!({ "id": their_delivery })),
        ("sendTestEvent", "mutation($id: ID!) { sendTestEvent(endpointId: $id) { id } }", json!({ "id": globex_endpoint })),
        (
            "updateEndpoint",
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {url: \"https://example.com/stolen\"}) { secret } }",
            json!({ "id": globex_endpoint }),
        ),
        (
            "disable",
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { secret } }",
            json!({ "id": globex_endpoint }),
        ),
        ("rotateEndpointSecret", "mutation($id: ID!) { rotateEndpointSecret(id: $id) { secret } }", json!({ "id": globex_endpoint })),
        (
            "createEndpoint in it",
            "mutation($tenant: ID!) { createEndpoint(input: {name: \"x\", url: \"https://example.com/x\", tenantId: $tenant}) { secret } }",
            json!({ "tenant": globex.id }),
        ),
        ("createTenant", "mutation { createTenant(input: {name: \"Mine\"}) { id } }", json!({})),
        (
            "createPortalLink for it",
            "mutation($tenant: ID!) { createPortalLink(tenantId: $tenant) { url } }",
            json!({ "tenant": globex.id }),
        ),
        (
            "createPortalLink for its own",
            "mutation($tenant: ID!) { createPortalLink(tenantId: $tenant) { url } }",
            json!({ "tenant": acme.id }),
        ),
        (
            "createApiKey",
            "mutation($tenant: ID!) { createApiKey(input: {name: \"k\", role: PARTNER, tenantId: $tenant}) { token } }",
            json!({ "tenant": globex.id }),
        ),
    ];
    for (what, query, variables) in writes {
        assert_forbidden(what, &other.graphql(token, query, variables).await);
    }

    // An id that exists nowhere gets the very answer a foreign one gets, so a key cannot
    // tell what exists outside its scope.
    let nowhere = uuid::Uuid::now_v7().to_string();
    let by_id = [
        "query($id: ID!) { delivery(id: $id) { id } }",
        "query($id: ID!) { submission(id: $id) { id } }",
        "query($id: ID!) { event(id: $id) { id } }",
        "mutation($id: ID!) { replayDelivery(id: $id) { id } }",
        "mutation($id: ID!) { resendDelivery(id: $id) { id } }",
    ];
    for query in by_id {
        let foreign_id = if query.contains("submission") {
            &their_submission
        } else if query.contains("event") {
            &their_event
        } else {
            &their_delivery
        };
        let foreign = other
            .graphql(token, query, json!({ "id": foreign_id }))
            .await;
        let unknown = other.graphql(token, query, json!({ "id": nowhere })).await;
        assert_forbidden(query, &unknown);
        assert_eq!(
            unknown["errors"][0]["message"], foreign["errors"][0]["message"],
            "{query}: {unknown} vs {foreign}"
        );
    }

    // A subscription to the other tenant's endpoint is refused.
    let mut socket = connect(&other, "graphql-transport-ws").await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "s", "type": "subscribe", "payload": { "query": "subscription($id: ID) { deliveryStateChanged(endpointId: $id) { deliveryId } }", "variables": { "id": globex_endpoint } } }),
    )
    .await;
    let refused = next(&mut socket).await.expect("an answer");
    assert_eq!(refused["id"], "s", "{refused}");
    assert_eq!(
        gql_error_code(&refused["payload"]),
        Some("FORBIDDEN"),
        "{refused}"
    );
    assert!(refused["payload"]["data"].is_null(), "{refused}");

    // Bulk replay with no filter replays its own failures only; publish reaches its own.
    let replayed = other
        .graphql(
            token,
            "mutation { replayDeliveries(filter: {}) { replayed } }",
            json!({}),
        )
        .await;
    assert_eq!(
        replayed["data"]["replayDeliveries"]["replayed"], 1,
        "{replayed}"
    );
    let published = other
        .graphql(
            token,
            PUBLISH,
            json!({ "input": { "eventType": "order.paid", "payload": { "n": 4 } } }),
        )
        .await;
    let reached: Vec<&Value> = published["data"]["publish"]["event"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{published}"))
        .iter()
        .map(|edge| &edge["node"]["endpoint"]["id"])
        .collect();
    assert_eq!(reached, vec![&json!(acme_endpoint)], "{published}");

    // Nothing of the other tenant moved.
    let theirs = setup
        .graphql(
            &admin,
            "query($d: ID!, $e: ID!) { delivery(id: $d) { state } endpoint(id: $e) { url disabled } }",
            json!({ "d": their_delivery, "e": globex_endpoint }),
        )
        .await;
    assert_eq!(theirs["data"]["delivery"]["state"], "FAILED", "{theirs}");
    assert_eq!(
        theirs["data"]["endpoint"]["url"],
        receiver.url("globex"),
        "{theirs}"
    );
    assert_eq!(theirs["data"]["endpoint"]["disabled"], false, "{theirs}");

    // An admin's event reaching both tenants: each sees its delivery, not the publisher's key.
    let shared = publish(
        &setup,
        &admin,
        "order.paid",
        json!({"n": 5}),
        Some("admin-batch-7"),
    )
    .await;
    assert_eq!(
        shared["data"]["publish"]["event"]["idempotencyKey"], "admin-batch-7",
        "{shared}"
    );
    let seen = other
        .graphql(
            token,
            "{ deliveries(first: 100) { edges { node { submission { event { idempotencyKey payload } } } } } }",
            json!({}),
        )
        .await;
    let events: Vec<&Value> = seen["data"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{seen}"))
        .iter()
        .map(|edge| &edge["node"]["submission"]["event"])
        .filter(|event| event["payload"]["n"] == 5)
        .collect();
    assert_eq!(events.len(), 1, "{seen}");
    assert!(events[0]["idempotencyKey"].is_null(), "{seen}");
}

on_both_backends!(every_operation_is_refused_across_tenants);
