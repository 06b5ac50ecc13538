//! Tenants as tests set them up and check them through the API: a tenant, a partner key of
//! it, its endpoints at a receiver, what a key lists and what it is refused.

use serde_json::{json, Value};

use crate::support::{gql_error_code, Receiver, TestApp};

/// One tenant as a test sets it up: its id, a partner key of it, and its endpoints.
pub struct Tenant {
    pub id: String,
    pub token: String,
    pub endpoints: Vec<String>,
}

/// Creates a tenant through the API.
pub async fn create_tenant(app: &TestApp, admin: &str, name: &str) -> String {
    let body = app
        .graphql(
            admin,
            "mutation($name: String!) { createTenant(input: {name: $name}) { id name createdAt } }",
            json!({ "name": name }),
        )
        .await;
    assert_eq!(body["data"]["createTenant"]["name"], name, "{body}");
    body["data"]["createTenant"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("created: {body}"))
        .to_owned()
}

/// Creates a partner key of `tenant` through the API and returns its token.
pub async fn tenant_key(app: &TestApp, admin: &str, tenant: &str) -> String {
    let body = app
        .graphql(
            admin,
            "mutation($tenant: ID!) { createApiKey(input: {name: \"tenant key\", role: PARTNER, tenantId: $tenant}) { token apiKey { tenant { id } endpoints { id } expiresAt } } }",
            json!({ "tenant": tenant }),
        )
        .await;
    let created = &body["data"]["createApiKey"];
    assert_eq!(created["apiKey"]["tenant"]["id"], tenant, "{body}");
    assert_eq!(created["apiKey"]["endpoints"], json!([]), "{body}");
    assert!(created["apiKey"]["expiresAt"].is_null(), "{body}");
    created["token"]
        .as_str()
        .unwrap_or_else(|| panic!("token: {body}"))
        .to_owned()
}

/// Creates an endpoint at `receiver`'s `path` subscribed to `order.paid` as `token`, for
/// `tenant` when given, and returns its id (the receiver learns its secret).
pub async fn tenant_endpoint(
    app: &TestApp,
    token: &str,
    tenant: Option<&str>,
    receiver: &Receiver,
    path: &str,
) -> Value {
    let mut input =
        json!({ "name": path, "url": receiver.url(path), "eventTypes": ["order.paid"] });
    if let Some(tenant) = tenant {
        input["tenantId"] = json!(tenant);
    }
    let body = app
        .graphql(
            token,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id tenant { id name } } secret } }",
            json!({ "input": input }),
        )
        .await;
    if let Some(secret) = body["data"]["createEndpoint"]["secret"].as_str() {
        receiver.set_secret(path, secret);
    }
    body
}

/// Sets up a tenant named `name` with a key and one endpoint per path.
pub async fn tenant_with_endpoints(
    app: &TestApp,
    admin: &str,
    name: &str,
    receiver: &Receiver,
    paths: &[&str],
) -> Tenant {
    let id = create_tenant(app, admin, name).await;
    let token = tenant_key(app, admin, &id).await;
    let mut endpoints = Vec::new();
    for path in paths {
        let body = tenant_endpoint(app, admin, Some(&id), receiver, path).await;
        let endpoint = &body["data"]["createEndpoint"]["endpoint"];
        assert_eq!(endpoint["tenant"]["id"], id.as_str(), "{body}");
        assert_eq!(endpoint["tenant"]["name"], name, "{body}");
        endpoints.push(
            endpoint["id"]
                .as_str()
                .unwrap_or_else(|| panic!("created: {body}"))
                .to_owned(),
        );
    }
    Tenant {
        id,
        token,
        endpoints,
    }
}

/// The ids of the endpoints the key lists.
pub async fn endpoint_ids(app: &TestApp, token: &str) -> Vec<String> {
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

/// Asserts `body` is a `FORBIDDEN` refusal of `what`.
pub fn assert_forbidden(what: &str, body: &Value) {
    assert_eq!(gql_error_code(body), Some("FORBIDDEN"), "{what}: {body}");
}
