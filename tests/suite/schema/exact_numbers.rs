//! Payload numbers arrive exactly as sent: through variables and literals, HTTP and
//! WebSocket, storage on both backends, the webhook body, and the idempotency hash.

use std::time::Duration;

use futures_util::SinkExt as _;
use reqwest::Method;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::on_both_backends;
use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::fixtures::{row_counts, SUBMIT};
use crate::support::websocket::{connect, next, send};
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};

/// Numbers a double would round, and spellings of one value that must agree.
const SENT: &str = r#"{"big": 18446744073709551617, "huge": 123456789012345678901234567890, "dec": 0.1000000000000000055511151231257827, "e": 1E2, "neg": -0}"#;

/// [`SENT`] as a GraphQL literal.
const SENT_LITERAL: &str = "{big: 18446744073709551617, huge: 123456789012345678901234567890, dec: 0.1000000000000000055511151231257827, e: 1E2, neg: -0}";

/// What every reader gets back: each number's exact value in its one plain spelling.
const EXACT: &str = r#"{"big":18446744073709551617,"dec":0.1000000000000000055511151231257827,"e":100,"huge":123456789012345678901234567890,"neg":0}"#;

/// POSTs a raw JSON body to `/graphql` and returns the response text as sent.
async fn post_text(app: &TestApp, token: &str, body: String) -> String {
    app.request(Method::POST, "/graphql")
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("a body")
}

/// `submit` with `payload` spliced verbatim into the variables.
async fn submit_raw(
    app: &TestApp,
    token: &str,
    endpoint: &str,
    payload: &str,
    key: Option<&str>,
) -> String {
    let query = serde_json::to_string(SUBMIT).unwrap();
    let key = serde_json::to_string(&key).unwrap();
    let body = format!(
        r#"{{"query": {query}, "variables": {{"input": {{"endpointId": "{endpoint}", "idempotencyKey": {key}, "payload": {payload}}}}}}}"#
    );
    post_text(app, token, body).await
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

async fn numbers_reach_the_webhook_and_read_back_exactly(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "numbers").await;

    let by_variables = submit_raw(&app, &admin, &endpoint, SENT, None).await;
    let literal = format!(
        r#"mutation {{ submit(input: {{endpointId: "{endpoint}", payload: {SENT_LITERAL}}}) {{ submission {{ id payload }} }} }}"#
    );
    let by_literal = post_text(
        &app,
        &admin,
        serde_json::json!({ "query": literal }).to_string(),
    )
    .await;

    let mut ids = Vec::new();
    for answer in [&by_variables, &by_literal] {
        assert!(
            answer.contains(&format!(r#""payload":{EXACT}"#)),
            "submit answers with the exact payload: {answer}"
        );
        let id = parse(answer)["data"]["submit"]["submission"]["id"].clone();
        ids.push(id.as_str().unwrap_or_else(|| panic!("{answer}")).to_owned());
    }

    let received = receiver.wait_for(2, Duration::from_secs(20)).await;
    for webhook in &received {
        assert!(webhook.verified, "signed over the exact bytes");
        assert_eq!(webhook.raw_body, EXACT, "the webhook body, byte for byte");
    }

    for id in ids {
        let read = post_text(
            &app,
            &admin,
            serde_json::json!({
                "query": "query($id: ID!) { submission(id: $id) { payload } }",
                "variables": { "id": id },
            })
            .to_string(),
        )
        .await;
        assert_eq!(
            read,
            format!(r#"{{"data":{{"submission":{{"payload":{EXACT}}}}}}}"#),
            "submission {{ payload }} reads back exactly"
        );
    }
}

async fn idempotency_compares_exact_values(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;

    let first = parse(&submit_raw(&app, &admin, &endpoint, r#"{"n": 1E2}"#, Some("same")).await);
    assert_eq!(first["data"]["submit"]["created"], true, "{first}");
    for same in [r#"{"n": 100}"#, r#"{"n": 100.00}"#, r#"{"n": 10000e-2}"#] {
        let again = parse(&submit_raw(&app, &admin, &endpoint, same, Some("same")).await);
        assert_eq!(again["data"]["submit"]["created"], false, "{same}: {again}");
        assert_eq!(
            again["data"]["submit"]["submission"]["id"],
            first["data"]["submit"]["submission"]["id"],
            "{same}"
        );
    }

    let big = r#"{"n": 18446744073709551617}"#;
    let created = parse(&submit_raw(&app, &admin, &endpoint, big, Some("big")).await);
    assert_eq!(created["data"]["submit"]["created"], true, "{created}");
    let neighbour = r#"{"n": 18446744073709551616}"#;
    let conflict = parse(&submit_raw(&app, &admin, &endpoint, neighbour, Some("big")).await);
    assert_eq!(
        gql_error_code(&conflict),
        Some("IDEMPOTENCY_CONFLICT"),
        "integers one apart are different content: {conflict}"
    );
    assert_eq!(row_counts(&app).await, (2, 2));
}

async fn numbers_too_long_to_write_out_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;

    let exponents = format!("[{}]", vec!["1e999"; 400].join(","));
    for payload in ["1e999999999", r#"{"a": [-1e-999999999]}"#, &exponents] {
        let answer = parse(&submit_raw(&app, &admin, &endpoint, payload, None).await);
        assert_eq!(gql_error_code(&answer), Some("BAD_USER_INPUT"), "{answer}");
    }
    let literal = format!(
        r#"mutation {{ submit(input: {{endpointId: "{endpoint}", payload: {{n: 1e999999999}}}}) {{ created }} }}"#
    );
    let answer = parse(
        &post_text(
            &app,
            &admin,
            serde_json::json!({ "query": literal }).to_string(),
        )
        .await,
    );
    assert_eq!(gql_error_code(&answer), Some("BAD_USER_INPUT"), "{answer}");
    assert_eq!(row_counts(&app).await, (0, 0), "nothing was written");

    let zero = parse(&submit_raw(&app, &admin, &endpoint, "0e999999999", None).await);
    assert_eq!(
        zero["data"]["submit"]["submission"]["payload"], 0,
        "zero is short whatever its exponent: {zero}"
    );
}

on_both_backends!(
    numbers_reach_the_webhook_and_read_back_exactly,
    idempotency_compares_exact_values,
    numbers_too_long_to_write_out_are_refused,
);

/// async-graphql reads WebSocket messages through serde's buffering for internally tagged
/// enums, where large and fractional numbers take another shape: they still arrive exact.
#[tokio::test]
async fn websocket_variables_keep_exact_numbers() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let query = serde_json::to_string(SUBMIT).unwrap();

    for (protocol, start, reply) in [
        ("graphql-transport-ws", "subscribe", "next"),
        ("graphql-ws", "start", "data"),
    ] {
        let mut socket = connect(&app, protocol).await;
        send(&mut socket, serde_json::json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {admin}") } })).await;
        assert_eq!(
            next(&mut socket).await.expect("ack")["type"],
            "connection_ack"
        );
        let message = format!(
            r#"{{"id": "n", "type": "{start}", "payload": {{"query": {query}, "variables": {{"input": {{"endpointId": "{endpoint}", "payload": {SENT}}}}}}}}}"#
        );
        socket.send(Message::text(message)).await.expect("send");
        let result = next(&mut socket).await.expect("a result");
        assert_eq!(result["type"], reply, "{protocol}: {result}");
        let submitted = &result["payload"]["data"]["submit"];
        assert_eq!(submitted["created"], true, "{protocol}: {result}");
        assert_eq!(
            submitted["submission"]["payload"].to_string(),
            EXACT,
            "{protocol}"
        );
    }
}
