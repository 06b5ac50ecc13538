//! What a document writes literally, and what its variables give, held to the spec's
//! validation where async-graphql is lenient: an input object naming a field twice, a
//! quoted enum value and a required variable given `null` are refused before anything
//! runs; and an operation whose every root field is skipped answers `{}`.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fixtures::{endpoint_count, row_counts};
use crate::support::{Backend, TestApp, TestDb};

/// Checks that `body` is a request error (no `data`) whose one error says `message`.
fn refused(status: StatusCode, body: &Value, message: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.get("data").is_none(), "no data: {body}");
    let errors = body["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{body}");
    assert_eq!(errors[0]["message"], message, "{body}");
    assert!(errors[0]["extensions"]["code"].is_string(), "{body}");
}

/// `{endpointId: A, endpointId: B}` ran against B, the last one, and a payload's repeated
/// key kept the last value. Now each is refused, with where the repeat is, and nothing runs,
/// however often the same text is sent (it is never kept as a parsed document).
#[tokio::test]
async fn an_input_object_naming_a_field_twice_is_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (first, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let (second, _) = app.create_endpoint(&admin, "https://example.com/b").await;
    let (rows, endpoints) = (row_counts(&app).await, endpoint_count(&app).await);

    let twice = format!(
        "mutation {{ submit(input: {{endpointId: \"{first}\", endpointId: \"{second}\", payload: {{}}}}) {{ created }} }}"
    );
    let in_payload = format!(
        "mutation {{ submit(input: {{endpointId: \"{first}\", payload: {{amount: 1, amount: 1000}}}}) {{ created }} }}"
    );
    let created = "mutation { createEndpoint(input: {name: \"first\", name: \"second\", \
                   url: \"https://example.com/c\"}) { endpoint { id } } }";
    for (query, field) in [
        (twice.as_str(), "endpointId"),
        (in_payload.as_str(), "amount"),
        (created, "name"),
    ] {
        for _ in 0..2 {
            let (status, body) = app.graphql_response(&admin, query, json!({})).await;
            refused(
                status,
                &body,
                &format!("There can be only one input field named \"{field}\"."),
            );
            assert_eq!(body["errors"][0]["locations"][0]["line"], 1, "{body}");
        }
    }
    assert_eq!(row_counts(&app).await, rows, "nothing was submitted");
    assert_eq!(endpoint_count(&app).await, endpoints, "nothing was created");

    // Each field once in each literal, the same names in sibling literals: runs.
    let once = format!(
        "mutation {{ submit(input: {{endpointId: \"{first}\", payload: {{a: {{a: 1}}, b: [{{a: 1}}, {{a: 2}}]}}}}) {{ created }} }}"
    );
    let (status, body) = app.graphql_response(&admin, &once, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    app.stop().await;
}

/// An enum value is written as a name: `state: "FAILED"` filtered as `FAILED` before. As a
/// variable's JSON value, a string is how an enum value is written, and stands.
#[tokio::test]
async fn a_quoted_enum_value_is_refused_and_a_variables_string_stands() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    let quoted = r#"{ deliveries(filter: {state: "FAILED"}) { edges { cursor } } }"#;
    let (status, body) = app.graphql_response(&admin, quoted, json!({})).await;
    refused(
        status,
        &body,
        "filter.state: \"FAILED\" is a string; a value of enum DeliveryState is written without quotes",
    );
    let named = "{ deliveries(filter: {state: FAILED}) { edges { cursor } } }";
    let (status, body) = app.graphql_response(&admin, named, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let through = "query($state: DeliveryState) { deliveries(filter: {state: $state}) \
                   { edges { cursor } } }";
    let (status, body) = app
        .graphql_response(&admin, through, json!({ "state": "FAILED" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["deliveries"]["edges"], json!([]), "{body}");
    app.stop().await;
}

/// A required variable given `null` is refused, with nothing written, however the rest of
/// the request reads: `publish` stored and delivered a `null` payload, and a required state
/// filter was dropped, when the operation also declared an optional variable the request
/// left out (the executor's argument check passed over the whole argument).
#[tokio::test]
async fn a_required_variable_given_null_is_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let rows = row_counts(&app).await;

    let publish = "mutation($p: JSON!, $k: String) { publish(input: {eventType: \"order.paid\", \
                   payload: $p, idempotencyKey: $k}) { created } }";
    let submit = "mutation($e: ID!, $p: JSON!, $k: String) { submit(input: {endpointId: $e, \
                  payload: $p, idempotencyKey: $k}) { created } }";
    let listing = "query($s: DeliveryState!, $f: Int) { deliveries(filter: {state: $s}, \
                   first: $f) { edges { cursor } } }";
    for (query, variables, message) in [
        (
            publish,
            json!({ "p": null }),
            "variable $p of type JSON! is required and was given null",
        ),
        (
            publish,
            json!({ "p": null, "k": null }),
            "variable $p of type JSON! is required and was given null",
        ),
        (
            submit,
            json!({ "e": endpoint, "p": null }),
            "variable $p of type JSON! is required and was given null",
        ),
        (
            listing,
            json!({ "s": null }),
            "variable $s of type DeliveryState! is required and was given null",
        ),
    ] {
        let (status, body) = app.graphql_response(&admin, query, variables).await;
        refused(status, &body, message);
    }
    assert_eq!(row_counts(&app).await, rows, "nothing was written");

    let (status, body) = app
        .graphql_response(&admin, publish, json!({ "p": {"n": 1} }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    app.stop().await;
}

/// `data` of an operation whose every root field is skipped is an empty object, not `null`
/// (a null `data` without errors is no valid response); a skipped mutation does not run.
#[tokio::test]
async fn an_operation_whose_root_fields_are_all_skipped_answers_an_empty_object() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let endpoints = endpoint_count(&app).await;
    for query in [
        "{ __typename @skip(if: true) }",
        "query($no: Boolean!) { endpoints @include(if: $no) { edges { cursor } } }",
        "mutation { createEndpoint(input: {name: \"n\", url: \"https://example.com/n\"}) \
         @skip(if: true) { endpoint { id } } }",
    ] {
        let (status, body) = app
            .graphql_response(&admin, query, json!({ "no": false }))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body, json!({ "data": {} }), "{query}");
    }
    assert_eq!(endpoint_count(&app).await, endpoints, "nothing was created");
    app.stop().await;
}
