//! Endpoints through the API: created from an input or with flow-control settings for a
//! counting receiver, read, and disabled or re-enabled; and keys their secrets are sealed with.

use serde_json::{json, Value};

use super::{Receiver, TestApp};

/// A `CreateEndpointInput` named `name` for `url`, with extra `settings` merged in.
pub fn endpoint_input(name: &str, url: &str, settings: Value) -> Value {
    let mut input = json!({ "name": name, "url": url });
    if let (Some(input), Some(settings)) = (input.as_object_mut(), settings.as_object()) {
        input.extend(settings.clone());
    }
    input
}

/// Creates an endpoint on `receiver` at `path` with extra `settings` (such as
/// `{"maxInFlight": 4}`), teaches the receiver its secret, and returns its id.
pub async fn endpoint_with(
    app: &TestApp,
    admin: &str,
    receiver: &Receiver,
    path: &str,
    settings: Value,
) -> String {
    let input = endpoint_input(path, &receiver.url(path), settings);
    let body = app
        .graphql(
            admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } secret } }",
            json!({ "input": input }),
        )
        .await;
    let created = &body["data"]["createEndpoint"];
    let id = created["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"));
    receiver.set_secret(path, created["secret"].as_str().expect("a secret"));
    id.to_owned()
}

/// Creates an endpoint from a whole `CreateEndpointInput` and returns its id.
pub async fn create_endpoint(app: &TestApp, admin: &str, input: Value) -> String {
    let body = app
        .graphql(
            admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }",
            json!({ "input": input }),
        )
        .await;
    body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("created: {body}"))
        .to_owned()
}

/// Creates an endpoint subscribed to `types` (`None`: the field omitted) and returns its id.
pub async fn endpoint_with_types(
    app: &TestApp,
    admin: &str,
    url: &str,
    types: Option<Vec<&str>>,
) -> String {
    let mut input = json!({ "name": "typed", "url": url });
    if let Some(types) = types {
        input["eventTypes"] = json!(types);
    }
    create_endpoint(app, admin, input).await
}

/// Endpoint fields the lifecycle and pause tests read.
pub const ENDPOINT_FIELDS: &str =
    "id disabled disabledReason disabledAt consecutiveFailures previousSecretExpiresAt pausedUntil";

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

/// A new `COURIER_ENCRYPTION_KEY` value: base64 of 32 random bytes.
pub fn new_encryption_key() -> String {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
