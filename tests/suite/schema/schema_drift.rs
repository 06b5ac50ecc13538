//! `schema.graphql` is generated from the code; this fails when they drift apart. And
//! introspection tells no more than it: the schema has no description (async-graphql
//! answered its own words about `__Schema`, which a client building the schema from
//! introspection printed as the schema's description).

use serde_json::json;

use crate::support::{Backend, TestApp, TestDb};

#[test]
fn checked_in_schema_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql");
    let checked_in = std::fs::read_to_string(path).expect("schema.graphql exists");
    let generated = courier::schema::sdl();
    assert!(
        checked_in.trim_end() == generated.trim_end(),
        "schema.graphql is out of date: run `cargo run -- schema > schema.graphql`"
    );
}

#[tokio::test]
async fn introspection_gives_the_schema_no_description() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for query in [
        "{ __schema { description queryType { name } } }",
        "query IntrospectionQuery { ...S } fragment S on Query { __schema { description queryType { name } } }",
    ] {
        let body = app.graphql(&admin, query, json!({})).await;
        assert_eq!(
            body,
            json!({ "data": { "__schema": { "description": null, "queryType": { "name": "Query" } } } }),
            "{query}"
        );
    }
}
