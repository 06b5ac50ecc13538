//! Where a field error leaves its `null` (GraphQL spec 6.4.4): at the failed field when it
//! is nullable, else at its nearest nullable parent, else the whole `data`; the fields
//! beside it keep their values.

use serde_json::{json, Value};

use crate::support::fixtures::{endpoint_on, publish, row_counts};
use crate::support::websocket::{initialised, next, subscribed};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// The one error of `body`, checked to carry `code` and `path`.
fn only_error<'a>(body: &'a Value, code: &str, path: Value) -> &'a Value {
    let errors = body["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{body}");
    assert_eq!(errors[0]["extensions"]["code"], code, "{body}");
    assert_eq!(errors[0]["path"], path, "{body}");
    &errors[0]
}

#[tokio::test]
async fn a_failed_nullable_field_is_null_beside_its_siblings() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    // Alone: `data` holds the field, null, rather than being null itself.
    let body = app
        .graphql(&admin, r#"{ delivery(id: "nope") { id } }"#, json!({}))
        .await;
    only_error(&body, "BAD_USER_INPUT", json!(["delivery"]));
    assert_eq!(body["data"], json!({ "delivery": null }), "{body}");

    // Beside another root field, under an alias.
    let body = app
        .graphql(
            &admin,
            r#"{ a: delivery(id: "nope") { id } b: __typename }"#,
            json!({}),
        )
        .await;
    only_error(&body, "BAD_USER_INPUT", json!(["a"]));
    assert_eq!(body["data"], json!({ "a": null, "b": "Query" }), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_failed_non_null_field_nulls_its_nearest_nullable_parent() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let published = app
        .graphql(
            &admin,
            r#"mutation { publish(input: {eventType: "order.paid", payload: {}}) { event { id } } }"#,
            json!({}),
        )
        .await;
    let event = published["data"]["publish"]["event"]["id"]
        .as_str()
        .expect("an event")
        .to_owned();

    // `Event.deliveries` is non-null, `Query.event` nullable: the event is null.
    let read =
        "query($id: ID!) { event(id: $id) { id deliveries(first: 101) { edges { cursor } } } \
                b: __typename }";
    let body = app.graphql(&admin, read, json!({ "id": event })).await;
    only_error(&body, "BAD_USER_INPUT", json!(["event", "deliveries"]));
    assert_eq!(
        body["data"],
        json!({ "event": null, "b": "Query" }),
        "{body}"
    );

    // Through a list: every tenant key's `tenant` (nullable) is null, keys stay listed.
    let tenant = app
        .graphql(
            &admin,
            r#"mutation { createTenant(input: {name: "Acme"}) { id } }"#,
            json!({}),
        )
        .await["data"]["createTenant"]["id"]
        .clone();
    let key = "mutation($tenant: ID!) { createApiKey(input: {name: \"acme\", role: PARTNER, \
               tenantId: $tenant}) { apiKey { id } } }";
    let created = app.graphql(&admin, key, json!({ "tenant": tenant })).await;
    assert!(created["errors"].is_null(), "{created}");
    let keys = "{ apiKeys(first: 10) { edges { node { name tenant { id endpoints(first: 101) \
                { edges { cursor } } } } } } }";
    let body = app.graphql(&admin, keys, json!({})).await;
    let edges = body["data"]["apiKeys"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("the keys are listed: {body}"));
    let acme = edges
        .iter()
        .position(|edge| edge["node"]["name"] == "acme")
        .unwrap_or_else(|| panic!("the tenant's key is listed: {body}"));
    assert_eq!(edges[acme]["node"]["tenant"], Value::Null, "{body}");
    only_error(
        &body,
        "BAD_USER_INPUT",
        json!(["apiKeys", "edges", acme, "node", "tenant", "endpoints"]),
    );

    // A non-null root field's failure nulls `data`: here `publish` through its event.
    let publish = "mutation { publish(input: {eventType: \"order.paid\", payload: {}}) \
                   { event { id deliveries(first: 101) { edges { cursor } } } } }";
    let body = app.graphql(&admin, publish, json!({})).await;
    only_error(
        &body,
        "BAD_USER_INPUT",
        json!(["publish", "event", "deliveries"]),
    );
    assert_eq!(body["data"], Value::Null, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_subscription_events_failed_field_is_null_in_that_event() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    endpoint_on(&app, &admin, &receiver, "/hook").await;
    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    let subscription = "subscription { deliveryStateChanged { state delivery { submission { \
                        event { id deliveries(first: 101) { edges { cursor } } } } } } }";
    subscribed(&app, &mut socket, "subscribe", "s", subscription, 1).await;

    let published = publish(&app, &admin, "order.paid", json!({}), None).await;
    assert!(published["errors"].is_null(), "{published}");
    let message = next(&mut socket).await.expect("an event");
    assert_eq!(message["type"], "next", "{message}");
    let payload = &message["payload"];
    only_error(
        payload,
        "BAD_USER_INPUT",
        json!([
            "deliveryStateChanged",
            "delivery",
            "submission",
            "event",
            "deliveries"
        ]),
    );
    // The event itself is kept: only the failed field's nearest nullable parent is null.
    let change = &payload["data"]["deliveryStateChanged"];
    assert!(change["state"].is_string(), "{payload}");
    assert_eq!(
        change["delivery"],
        json!({ "submission": { "event": null } }),
        "{payload}"
    );
    app.stop().await;
}

#[tokio::test]
async fn mutations_after_a_failed_one_are_not_run() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let before = row_counts(&app).await;

    // `a` fails and nulls `data`: `b`, whose answer could not be told, is not run.
    let both = "mutation($id: ID!) { a: submit(input: {endpointId: \"nope\", payload: {}}) \
                { created } b: submit(input: {endpointId: $id, payload: {}}) { created } }";
    let body = app.graphql(&admin, both, json!({ "id": endpoint })).await;
    only_error(&body, "BAD_USER_INPUT", json!(["a"]));
    assert_eq!(body["data"], Value::Null, "{body}");
    assert_eq!(row_counts(&app).await, before, "nothing was stored");

    // In the other order, the first is run and the second refused.
    let both = "mutation($id: ID!) { b: submit(input: {endpointId: $id, payload: {}}) \
                { created } a: submit(input: {endpointId: \"nope\", payload: {}}) { created } }";
    let body = app.graphql(&admin, both, json!({ "id": endpoint })).await;
    only_error(&body, "BAD_USER_INPUT", json!(["a"]));
    assert_eq!(body["data"], Value::Null, "{body}");
    assert_ne!(row_counts(&app).await, before, "the first was stored");
    app.stop().await;
}
