//! A tenant's key grows with its tenant: its scope takes in an endpoint its tenant gains,
//! and it manages its own endpoints, which a key limited to a list of endpoints may not.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{quick_worker, submit, wait_for_state};
use crate::support::tenants::{
    assert_forbidden, endpoint_ids, tenant_endpoint, tenant_with_endpoints,
};
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};

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

on_both_backends!(a_tenant_key_grows_with_its_tenant_and_manages_it);
