//! Helpers for operational events: an endpoint listening to `courier.*` types, and
//! `updateEndpoint` as an admin.

use serde_json::{json, Value};

use crate::support::{Receiver, TestApp};

/// Every operational event type.
pub const ALL_TYPES: &[&str] = &[
    "courier.endpoint.disabled",
    "courier.endpoint.enabled",
    "courier.endpoint.paused",
    "courier.delivery.failed",
];

/// Creates an endpoint at `receiver`'s `path` listing `types` (empty: every type), of
/// `tenant` when given, teaches the receiver its secret, and returns its id.
pub async fn ops_endpoint(
    app: &TestApp,
    admin: &str,
    receiver: &Receiver,
    path: &str,
    tenant: Option<&str>,
    types: &[&str],
) -> String {
    let mut settings = json!({ "eventTypes": types });
    if let Some(tenant) = tenant {
        settings["tenantId"] = json!(tenant);
    }
    super::endpoints::endpoint_with(app, admin, receiver, path, settings).await
}

/// `updateEndpoint(id, input)` as `admin`, asserting it succeeded.
pub async fn update_endpoint(app: &TestApp, admin: &str, id: &str, input: Value) -> Value {
    let body = app
        .graphql(
            admin,
            "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { id disabled } } }",
            json!({ "id": id, "input": input }),
        )
        .await;
    assert!(body["errors"].is_null(), "{body}");
    body
}
