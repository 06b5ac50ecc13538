//! A tenant's key reaches every endpoint of its tenant and nothing of another's: every
//! query, mutation, listing, replay and subscription is refused across tenants, on an
//! instance other than the one that set things up; its scope grows when its tenant gains an
//! endpoint; it manages its own endpoints, which a key limited to a list may not.

use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::{publish, quick_worker, submit, wait_for_state, PUBLISH};
use crate::support::tenants::{tenant_endpoint, tenant_with_endpoints};
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

/// The ids of the endpoints the key lists.
async fn endpoint_ids(app: &TestApp, token: &str) -> Vec<String> {
    let body = app
        .graphql(token, "{ endpoints { edges { node { id } } } }", json!({}))
        .await;
    body["data"]["endpoints"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("endpoints: {body}"))
        .iter()
        .map(|edge| edge["node"]["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn assert_forbidden(what: &str, body: &Value) {
    assert_eq!(gql_error_code(body), Some("FORBIDDEN"), "{what}: {body}");
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
        uuid::Uuid::parse_str(&their_delivery).expect("uuid"),
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

async fn a_tenant_key_grows_with_its_tenant_and_manages_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let setup = TestApp::spawn_with(&db, quick_worker).await;
    let other = TestApp::spawn_with(&db, quick_worker).await;
    let admin = setup.admin_token().await;
    let receiver = Receiver::accepting().await;
    let acme = tenant_with_endpoints(&setup, &admin, "Acme", &receiver, &["first"]).await;
    let token = &acme.token;
    // The key is in use on the other instance before its tenant gains an endpoint.
    assert_eq!(endpoint_ids(&other, token).await, acme.endpoints);

    // An endpoint the admin creates for the tenant later is the key's at once, everywhere.
    let later = tenant_endpoint(&setup, &admin, Some(&acme.id), &receiver, "later").await;
    let later = later["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{later}"))
        .to_owned();
    assert_eq!(
        endpoint_ids(&other, token).await,
        vec![acme.endpoints[0].clone(), later.clone()]
    );
    let sent = submit(&other, token, &later, json!({"to": "later"}), None).await;
    let delivery = sent["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_owned();
    wait_for_state(
        &other,
        token,
        &delivery,
        "DELIVERED",
        Duration::from_secs(15),
    )
    .await;

    // The key creates its own endpoint (of its tenant, unasked), and manages it.
    let created = tenant_endpoint(&other, token, None, &receiver, "own").await;
    let own = &created["data"]["createEndpoint"]["endpoint"];
    assert_eq!(own["tenant"]["id"], acme.id.as_str(), "{created}");
    let own = own["id"].as_str().unwrap_or_default().to_owned();
    let updated = other
        .graphql(
            token,
            "mutation($id: ID!, $url: String!) { updateEndpoint(id: $id, input: {url: $url, eventTypes: [\"order.shipped\"], maxInFlight: 4}) { endpoint { url eventTypes maxInFlight } secret } }",
            json!({ "id": own, "url": receiver.url("own-moved") }),
        )
        .await;
    let moved = &updated["data"]["updateEndpoint"];
    assert_eq!(
        moved["endpoint"]["eventTypes"],
        json!(["order.shipped"]),
        "{updated}"
    );
    assert_eq!(moved["endpoint"]["maxInFlight"], 4, "{updated}");
    assert!(
        moved["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_")),
        "{updated}"
    );
    let rotated = other
        .graphql(
            token,
            "mutation($id: ID!) { rotateEndpointSecret(id: $id, graceSeconds: 0) { secret } }",
            json!({ "id": own }),
        )
        .await;
    assert!(
        rotated["data"]["rotateEndpointSecret"]["secret"].is_string(),
        "{rotated}"
    );
    for disabled in [true, false] {
        let switched = other
            .graphql(
                token,
                "mutation($id: ID!, $disabled: Boolean!) { updateEndpoint(id: $id, input: {disabled: $disabled}) { endpoint { disabled } } }",
                json!({ "id": own, "disabled": disabled }),
            )
            .await;
        assert_eq!(
            switched["data"]["updateEndpoint"]["endpoint"]["disabled"], disabled,
            "{switched}"
        );
    }
    assert_eq!(endpoint_ids(&setup, token).await.len(), 3);

    // A key limited to a list of endpoints creates none and manages none.
    let listed = setup
        .graphql(
            &admin,
            "mutation($id: ID!) { createApiKey(input: {name: \"listed\", role: PARTNER, endpointIds: [$id]}) { token } }",
            json!({ "id": own }),
        )
        .await;
    let listed = listed["data"]["createApiKey"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let seen_by_listed = other
        .graphql(
            &listed,
            "query($id: ID!) { endpoint(id: $id) { id tenant { id } } }",
            json!({ "id": own }),
        )
        .await;
    assert_eq!(
        seen_by_listed["data"]["endpoint"]["id"],
        own.as_str(),
        "{seen_by_listed}"
    );
    assert!(
        seen_by_listed["data"]["endpoint"]["tenant"].is_null(),
        "a key limited to a list is not told the tenant: {seen_by_listed}"
    );
    assert_forbidden(
        "a listed key creating",
        &tenant_endpoint(&other, &listed, None, &receiver, "listed").await,
    );
    assert_forbidden(
        "a listed key updating",
        &other
            .graphql(
                &listed,
                "mutation($id: ID!) { updateEndpoint(id: $id, input: {name: \"renamed\"}) { secret } }",
                json!({ "id": own }),
            )
            .await,
    );

    // Bad input leaves nothing half-written.
    let both = setup
        .graphql(
            &admin,
            "mutation($id: ID!, $tenant: ID!) { createApiKey(input: {name: \"both\", role: PARTNER, endpointIds: [$id], tenantId: $tenant}) { token } }",
            json!({ "id": own, "tenant": acme.id }),
        )
        .await;
    assert_eq!(gql_error_code(&both), Some("BAD_USER_INPUT"), "{both}");
    let unknown = setup
        .graphql(
            &admin,
            "mutation($tenant: ID!) { createEndpoint(input: {name: \"x\", url: \"https://example.com/x\", tenantId: $tenant}) { secret } }",
            json!({ "tenant": uuid::Uuid::now_v7() }),
        )
        .await;
    assert_eq!(
        gql_error_code(&unknown),
        Some("BAD_USER_INPUT"),
        "{unknown}"
    );
    let nameless = setup
        .graphql(
            &admin,
            "mutation { createTenant(input: {name: \"  \"}) { id } }",
            json!({}),
        )
        .await;
    assert_eq!(
        gql_error_code(&nameless),
        Some("BAD_USER_INPUT"),
        "{nameless}"
    );
    let tenants = setup
        .graphql(&admin, "{ tenants { edges { node { name } } } }", json!({}))
        .await;
    assert_eq!(
        tenants["data"]["tenants"]["edges"],
        json!([{ "node": { "name": "Acme" } }]),
        "{tenants}"
    );
    let counted = setup
        .graphql(
            &admin,
            "{ apiKeys(first: 100) { edges { node { name } } } }",
            json!({}),
        )
        .await;
    let names: Vec<&str> = counted["data"]["apiKeys"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{counted}"))
        .iter()
        .filter_map(|edge| edge["node"]["name"].as_str())
        .collect();
    assert!(!names.contains(&"both"), "{names:?}");
}

on_both_backends!(
    every_operation_is_refused_across_tenants,
    a_tenant_key_grows_with_its_tenant_and_manages_it,
);
