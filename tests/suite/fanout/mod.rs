//! Event types and `publish`: routing by type, enabled state and partner scope; idempotency
//! per API key settled by the unique constraint across processes; atomic fan-out; and no
//! due delivery left on an endpoint disabled while an event was being published.
//! Shared fixtures here; routing and idempotency in `routing`, races across processes in
//! `races`, retention in `retention`.

mod races;
mod retention;
mod routing;

use std::collections::HashSet;

use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};

use crate::support::TestApp;

pub const PUBLISH: &str = "mutation($input: PublishInput!) { publish(input: $input) { created event { id eventType idempotencyKey payload deliveries(first: 100) { edges { node { id state endpoint { id } submission { eventType event { id } } } } } } } }";

pub async fn publish(
    app: &TestApp,
    token: &str,
    event_type: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "eventType": event_type, "payload": payload, "idempotencyKey": key });
    app.graphql(token, PUBLISH, json!({ "input": input })).await
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
    let body = app
        .graphql(
            admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id eventTypes } } }",
            json!({ "input": input }),
        )
        .await;
    body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("created: {body}"))
        .to_owned()
}

pub async fn set_endpoint(app: &TestApp, admin: &str, id: &str, input: Value) -> Value {
    app.graphql(
        admin,
        "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { id disabled eventTypes } } }",
        json!({ "id": id, "input": input }),
    )
    .await
}

/// The endpoints an answer's event reached, as a set of ids.
pub fn reached(body: &Value) -> HashSet<String> {
    body["data"]["publish"]["event"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("deliveries: {body}"))
        .iter()
        .map(|edge| {
            edge["node"]["endpoint"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

pub async fn scalar(app: &TestApp, sql: &str) -> i64 {
    let row = app
        .state
        .db
        .conn()
        .query_one_raw(Statement::from_string(
            app.state.db.backend(),
            sql.to_owned(),
        ))
        .await
        .expect("query")
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a count")
}
