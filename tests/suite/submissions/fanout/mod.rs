//! Event types and `publish`: routing by type, enabled state and partner scope; idempotency
//! per API key settled by the unique constraint across processes; atomic fan-out; and no
//! due delivery left on an endpoint disabled while an event was being published.
//! Shared fixtures here; routing and idempotency in `routing`, races across processes in
//! `races`, retention in `retention`.

mod races;
mod routing;
mod storage;

use std::collections::HashSet;

use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};

use crate::support::TestApp;

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
