//! The endpoint and key lifecycle: secret rotation with overlap, endpoint health (410,
//! failure runs, manual disabling), API keys over GraphQL and the CLI, secrets encrypted at
//! rest, and retention.

mod encryption;
mod health;
mod rotation;

use serde_json::{json, Value};

use crate::support::TestApp;

/// Endpoint fields the lifecycle tests read.
pub const ENDPOINT_FIELDS: &str =
    "id disabled disabledReason disabledAt consecutiveFailures previousSecretExpiresAt";

/// One endpoint's lifecycle fields.
pub async fn endpoint(app: &TestApp, admin: &str, id: &str) -> Value {
    let query = format!("query($id: ID!) {{ endpoint(id: $id) {{ {ENDPOINT_FIELDS} }} }}");
    let body = app.graphql(admin, &query, json!({ "id": id })).await;
    body["data"]["endpoint"].clone()
}

/// Sets `disabled` on an endpoint through `updateEndpoint` and returns the endpoint.
pub async fn set_disabled(app: &TestApp, admin: &str, id: &str, disabled: bool) -> Value {
    let query = format!(
        "mutation($id: ID!, $disabled: Boolean) {{ updateEndpoint(id: $id, input: {{disabled: $disabled}}) {{ endpoint {{ {ENDPOINT_FIELDS} }} }} }}"
    );
    let body = app
        .graphql(admin, &query, json!({ "id": id, "disabled": disabled }))
        .await;
    body["data"]["updateEndpoint"]["endpoint"].clone()
}
