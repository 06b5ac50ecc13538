//! The endpoint and key lifecycle: secret rotation with overlap, endpoint health (410,
//! failure runs, manual disabling), API keys over GraphQL and the CLI, secrets encrypted at
//! rest, and retention.

mod api_keys;
mod encryption;
mod health;
mod retention;
mod rotation;

use std::future::Future;
use std::time::Duration;

use courier::db::Db;
use sea_orm::{ConnectionTrait, QueryResult, Statement, Value as SqlValue};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::TestApp;

/// Endpoint fields the lifecycle tests read.
pub const ENDPOINT_FIELDS: &str =
    "id disabled disabledReason disabledAt consecutiveFailures previousSecretExpiresAt";

/// The delivery id of a `submit` response.
pub fn delivery_of(submitted: &Value) -> String {
    submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("not submitted: {submitted}"))
        .to_owned()
}

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

/// Runs one SQL statement and returns its rows.
pub async fn rows(db: &Db, sql: &str, values: Vec<SqlValue>) -> Vec<QueryResult> {
    db.conn()
        .query_all_raw(Statement::from_sql_and_values(db.backend(), sql, values))
        .await
        .expect("query")
}

/// A `COUNT(*) AS n` query's count.
pub async fn count(db: &Db, sql: &str, values: Vec<SqlValue>) -> i64 {
    rows(db, sql, values).await[0]
        .try_get::<i64>("", "n")
        .expect("a count")
}

/// Waits until `check` holds, or panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
