//! Argument values that cannot be coerced (an `Int` past 32 bits, a `DateTime` that is
//! not RFC 3339), literal or through variables, at any depth of an input: refused before
//! anything runs, as request errors.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::fixtures::{endpoint_count, row_counts, SUBMIT};
use crate::support::{Backend, TestApp, TestDb};

/// POSTs `body` asking for `accept`, and returns the status and the body.
async fn post(app: &TestApp, token: &str, accept: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .request(Method::POST, "/graphql")
        .bearer_auth(token)
        .header("accept", accept)
        .json(&body)
        .send()
        .await
        .expect("answered");
    let status = response.status();
    (status, response.json().await.expect("a JSON body"))
}

const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";

/// [`post`]s `query` with `variables`, asking for `application/graphql-response+json`.
async fn run(app: &TestApp, token: &str, query: &str, variables: Value) -> (StatusCode, Value) {
    let body = json!({ "query": query, "variables": variables });
    post(app, token, GRAPHQL_RESPONSE, body).await
}

/// Checks that `body` is a request error (no `data`) whose one error says `message`.
fn refused_before_running(status: StatusCode, body: &Value, message: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.get("data").is_none(), "no data: {body}");
    let errors = body["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{body}");
    assert_eq!(errors[0]["extensions"]["code"], "BAD_USER_INPUT", "{body}");
    assert_eq!(errors[0]["message"], message, "{body}");
    assert!(errors[0].get("path").is_none(), "{body}");
}

#[tokio::test]
async fn a_date_time_that_is_not_rfc_3339_is_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let not_a_date = "filter.createdAfter: \"now\" is not a DateTime (an RFC 3339 date and \
                      time, such as \"2026-01-31T12:00:00Z\")";

    // Literal, inside an input object.
    let literal = r#"{ deliveries(filter: {createdAfter: "now"}) { edges { cursor } } }"#;
    let (status, body) = post(&app, &admin, GRAPHQL_RESPONSE, json!({ "query": literal })).await;
    refused_before_running(status, &body, not_a_date);
    // In `application/json` a request error is still one, with a 200.
    let (status, body) = post(
        &app,
        &admin,
        "application/json",
        json!({ "query": literal }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("data").is_none(), "{body}");

    // Through a variable of type DateTime, and one that is not even a string.
    let through = "query($at: DateTime) { deliveries(filter: {createdAfter: $at}) \
                   { edges { cursor } } }";
    let (status, body) = run(&app, &admin, through, json!({ "at": "now" })).await;
    refused_before_running(status, &body, not_a_date);
    let (status, body) = run(&app, &admin, through, json!({ "at": 5 })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // An offset other than UTC is a good RFC 3339 date and time.
    let (status, body) = run(
        &app,
        &admin,
        through,
        json!({ "at": "2026-01-31T12:00:00+02:00" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["deliveries"]["edges"], json!([]), "{body}");

    // A bad `since` in the second mutation keeps the first from running too.
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let before = row_counts(&app).await;
    let both = "mutation($id: ID!) { submit(input: {endpointId: $id, payload: {}}) { created } \
                replayDeliveries(filter: {since: \"yesterday\"}) { replayed } }";
    let (status, body) = run(&app, &admin, both, json!({ "id": endpoint })).await;
    refused_before_running(
        status,
        &body,
        "filter.since: \"yesterday\" is not a DateTime (an RFC 3339 date and time, such as \
         \"2026-01-31T12:00:00Z\")",
    );
    assert_eq!(row_counts(&app).await, before, "nothing was submitted");
    app.stop().await;
}

#[tokio::test]
async fn an_int_past_32_bits_is_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let endpoints = endpoint_count(&app).await;
    let too_big = "input.maxInFlight: 2147483648 is not an Int (a 32-bit integer)";

    let literal = r#"mutation { createEndpoint(input: {name: "a", url: "https://example.com/a",
                     maxInFlight: 2147483648}) { endpoint { id } } }"#;
    let (status, body) = post(&app, &admin, GRAPHQL_RESPONSE, json!({ "query": literal })).await;
    refused_before_running(status, &body, too_big);

    let through = "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) \
                   { endpoint { id } } }";
    let input =
        json!({ "name": "a", "url": "https://example.com/a", "maxInFlight": 2147483648_i64 });
    let (status, body) = run(&app, &admin, through, json!({ "input": input })).await;
    refused_before_running(status, &body, too_big);
    assert_eq!(
        endpoint_count(&app).await,
        endpoints,
        "no endpoint was created"
    );

    // A top-level argument, and the smallest Int that is still one, which the resolver
    // then refuses for its own range as a field error.
    let (status, body) = run(
        &app,
        &admin,
        "{ deliveries(first: -2147483649) { edges { cursor } } }",
        json!({}),
    )
    .await;
    refused_before_running(
        status,
        &body,
        "first: -2147483649 is not an Int (a 32-bit integer)",
    );
    let (status, body) = run(
        &app,
        &admin,
        "{ deliveries(first: -2147483648) { edges { cursor } } }",
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["errors"][0]["path"], json!(["deliveries"]), "{body}");

    // Valid values run as before.
    let input = json!({ "name": "a", "url": "https://example.com/a", "maxInFlight": 1000 });
    let (status, body) = run(&app, &admin, through, json!({ "input": input })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["data"]["createEndpoint"]["endpoint"]["id"].is_string(),
        "{body}"
    );
    let submitted = app
        .graphql(
            &admin,
            SUBMIT,
            json!({ "input": { "endpointId": body["data"]["createEndpoint"]["endpoint"]["id"],
                               "payload": { "n": 2147483648_i64 } } }),
        )
        .await;
    assert_eq!(
        submitted["data"]["submit"]["created"], true,
        "a payload's numbers are JSON, not Ints: {submitted}"
    );
    app.stop().await;
}

/// A variable used where its declared type is not allowed ("All Variable Usages Are
/// Allowed"), or whose value is not an input object where one goes, is refused before
/// anything runs; the usages GraphQL allows run.
#[tokio::test]
async fn a_variable_of_the_wrong_type_is_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let id = json!({ "id": "0190c3c5-7c5e-7cc0-8000-000000000000" });
    let refused = [
        (
            "query($id: String) { delivery(id: $id) { id } }",
            id.clone(),
            "id: variable $id of type String cannot be used where ID! is expected",
        ),
        (
            "query($id: ID) { delivery(id: $id) { id } }",
            id.clone(),
            "id: variable $id of type ID cannot be used where ID! is expected",
        ),
        (
            "query($id: Int!) { delivery(id: $id) { id } }",
            json!({ "id": 5 }),
            "id: variable $id of type Int! cannot be used where ID! is expected",
        ),
        (
            "query($f: DeliveryFilter) { deliveries(filter: $f) { edges { cursor } } }",
            json!({ "f": 5 }),
            "filter: expected an input object of type DeliveryFilter",
        ),
        (
            "query($s: [DeliveryState]) { deliveries(filter: {state: $s}) { edges { cursor } } }",
            json!({ "s": ["FAILED"] }),
            "filter.state: variable $s of type [DeliveryState] cannot be used where DeliveryState is expected",
        ),
        // A page size that is not an Int: refused once (the query budget reads it too).
        (
            "{ endpoints(first: \"x\") { edges { cursor } } }",
            json!({}),
            "Invalid value for argument \"first\", expected type \"Int\"",
        ),
        (
            "query($v: Int) { endpoints(first: $v) { edges { cursor } } }",
            json!({ "v": "x" }),
            "Invalid value for argument \"first\", expected type \"Int\"",
        ),
        // A directive's argument too, given or left out.
        (
            "query($v: String) { endpoints { edges @include(if: $v) { cursor } } }",
            json!({}),
            "if: variable $v of type String cannot be used where Boolean! is expected",
        ),
        (
            "query($v: Boolean) { ... @skip(if: $v) { endpoints { edges { cursor } } } }",
            json!({ "v": true }),
            "if: variable $v of type Boolean cannot be used where Boolean! is expected",
        ),
    ];
    for (query, variables, message) in refused {
        let (status, body) = run(&app, &admin, query, variables).await;
        refused_before_running(status, &body, message);
    }
    // In an operation the request does not run too, as validation covers every one.
    let other = json!({
        "query": "query Q($v: String) { endpoints { edges @include(if: $v) { cursor } } } query R { __typename }",
        "operationName": "R",
    });
    let (status, body) = post(&app, &admin, GRAPHQL_RESPONSE, other).await;
    refused_before_running(
        status,
        &body,
        "if: variable $v of type String cannot be used where Boolean! is expected",
    );
    let allowed = [
        ("query($id: ID!) { delivery(id: $id) { id } }", id.clone()),
        ("query($id: ID = \"0190c3c5-7c5e-7cc0-8000-000000000000\") { delivery(id: $id) { id } }", json!({})),
        ("query($s: DeliveryState!) { deliveries(filter: {state: $s}) { edges { cursor } } }", json!({ "s": "FAILED" })),
        ("query($f: DeliveryFilter) { deliveries(filter: $f) { edges { cursor } } }", json!({ "f": null })),
        ("query($v: Boolean = false) { endpoints { edges @include(if: $v) { cursor } } }", json!({})),
        ("query($v: Boolean!) { endpoints { edges @include(if: $v) { cursor } } }", json!({ "v": true })),
        // A list's variable left out, null, or one value standing for a list of one.
        ("mutation($ids: [ID!]) { createApiKey(input: {name: \"k\", role: PARTNER, endpointIds: $ids}) { token } }", json!({})),
        ("mutation($ids: [ID!]) { createApiKey(input: {name: \"k\", role: PARTNER, endpointIds: $ids}) { token } }", json!({ "ids": null })),
        ("mutation($ids: [ID!]) { createApiKey(input: {name: \"k\", role: PARTNER, endpointIds: $ids}) { token } }", json!({ "ids": [] })),
    ];
    for (query, variables) in allowed {
        let (status, body) = run(&app, &admin, query, variables).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        assert!(body["errors"].is_null(), "{query}: {body}");
    }
}

/// A document validated once keeps its verdict, and the values later requests give its
/// variables are still refused before anything runs, as the first request's would be.
#[tokio::test]
async fn a_document_that_passed_once_still_refuses_bad_variables() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let (status, body) = run(
        &app,
        &admin,
        SUBMIT,
        json!({ "input": { "endpointId": endpoint, "payload": { "n": 1 } } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    let before = row_counts(&app).await;
    let refused = [
        (
            json!({ "input": { "payload": { "n": 2 } } }),
            "Invalid value for argument \"input\", field \"endpointId\" of type \"ID!\" is required but not provided",
        ),
        (
            json!({ "input": { "endpointId": endpoint, "payload": { "n": 2 }, "idempotencyKey": 7 } }),
            "Invalid value for argument \"input.idempotencyKey\", expected type \"String\"",
        ),
        (
            json!({ "input": { "endpointId": endpoint, "payload": { "n": 2 }, "priority": 1 } }),
            "Invalid value for argument \"input\", unknown field \"priority\" of type \"SubmitInput\"",
        ),
    ];
    for (variables, message) in refused {
        // Its first request, under a text of its own, then the document that passed.
        let fresh = format!("{SUBMIT}\n# {message}");
        let (status, body) = run(&app, &admin, &fresh, variables.clone()).await;
        refused_before_running(status, &body, message);
        let (status, body) = run(&app, &admin, SUBMIT, variables).await;
        refused_before_running(status, &body, message);
    }
    assert_eq!(row_counts(&app).await, before, "nothing was submitted");
    app.stop().await;
}

/// Validation skips an argument that takes a variable the request leaves out, literals and
/// all: a misspelt filter field beside one ran as a replay of everything, an unknown input
/// field was dropped and the endpoint created. Such an argument is refused as it is when
/// the variable is given as `null`.
#[tokio::test]
async fn literals_beside_an_omitted_variable_are_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let refused = [
        (
            "mutation($e: ID) { replayDeliveries(filter: {endpointId: $e, eventTyp: \"paid\"}) { replayed } }",
            "Invalid value for argument \"filter\", unknown field \"eventTyp\" of type \"ReplayFilter\"",
        ),
        (
            "mutation($t: ID) { createEndpoint(input: {name: \"x\", url: \"https://example.com/x\", tenantId: $t, bogus: 1}) { endpoint { id } } }",
            "Invalid value for argument \"input\", unknown field \"bogus\" of type \"CreateEndpointInput\"",
        ),
    ];
    let endpoints = endpoint_count(&app).await;
    for (query, message) in refused {
        let (status, body) = run(&app, &admin, query, json!({})).await;
        refused_before_running(status, &body, message);
    }
    assert_eq!(
        endpoint_count(&app).await,
        endpoints,
        "no endpoint was created"
    );
    app.stop().await;
}
