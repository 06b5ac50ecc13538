//! An object whose every selection `@skip` or `@include` leaves out is `{}`, not `null`:
//! async-graphql answered such a selection with `null`, non-null types included, so a
//! mutation that had run looked as if it returned nothing and an endpoint that exists
//! read as missing.

use serde_json::json;

use crate::support::fixtures::{count, quick_worker, submit};
use crate::support::websocket::{initialised, next, subscribed};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

#[tokio::test]
async fn an_object_with_every_selection_left_out_is_an_empty_object() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let missing = uuid::Uuid::new_v4().to_string();
    let cases = [
        (
            "mutation($full: Boolean!) { createTenant(input: {name: \"Acme\"}) \
             { ... @include(if: $full) { id name } } }",
            json!({ "full": false }),
            json!({ "createTenant": {} }),
        ),
        (
            "query($id: ID!) { endpoint(id: $id) { id @skip(if: true) } }",
            json!({ "id": endpoint }),
            json!({ "endpoint": {} }),
        ),
        (
            "query($id: ID!) { endpoint(id: $id) { id @skip(if: true) } }",
            json!({ "id": missing }),
            json!({ "endpoint": null }),
        ),
        (
            "{ endpoints(first: 1) { edges { cursor @skip(if: true) } \
             pageInfo { hasNextPage @skip(if: true) } } }",
            json!({}),
            json!({ "endpoints": { "edges": [{}], "pageInfo": {} } }),
        ),
        (
            "query($f: Boolean!) { endpoints(first: 1) { edges { node { ...F url } } } \
             e: endpoint(id: \"{endpoint}\") { ...F } } \
             fragment F on Endpoint { id @include(if: $f) }",
            json!({ "f": false }),
            json!({ "endpoints": { "edges": [{ "node": { "url": "https://example.com/a" } }] }, "e": {} }),
        ),
        // A variable left out takes its default, in what the executor leaves out too.
        (
            "mutation($v: Boolean = true) { createTenant(input: {name: \"Defaulted\"}) \
             { name @include(if: $v) } }",
            json!({}),
            json!({ "createTenant": { "name": "Defaulted" } }),
        ),
        (
            "query($id: ID!, $v: Boolean! = false) { endpoint(id: $id) { id @include(if: $v) } }",
            json!({ "id": endpoint }),
            json!({ "endpoint": {} }),
        ),
    ];
    for (query, variables, expected) in cases {
        let query = query.replace("{endpoint}", &endpoint);
        let body = app.graphql(&admin, &query, variables).await;
        assert_eq!(body, json!({ "data": expected }), "{query}");
    }
    // A payload's own members are the client's, whatever their names; so is an alias.
    submit(
        &app,
        &admin,
        &endpoint,
        json!({ "_courierEmptySelection": 1, "n": 2 }),
        None,
    )
    .await;
    let body = app
        .graphql(
            &admin,
            "{ deliveries(first: 1) { edges { node { submission { payload } \
             endpoint { id @skip(if: true) } _courierEmptySelection: id } } } }",
            json!({}),
        )
        .await;
    let node = &body["data"]["deliveries"]["edges"][0]["node"];
    assert_eq!(
        node["submission"]["payload"],
        json!({ "_courierEmptySelection": 1, "n": 2 }),
        "{body}"
    );
    assert_eq!(node["endpoint"], json!({}), "{body}");
    assert!(node["_courierEmptySelection"].is_string(), "{body}");

    let tenants = count(&app.state.db, "SELECT count(*) AS n FROM tenants", vec![]).await;
    assert_eq!(tenants, 2, "the tenants were created");
    app.stop().await;
}

/// The same in a subscription's events, on both protocols.
#[tokio::test]
async fn an_event_with_every_selection_of_an_object_left_out_holds_an_empty_object() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let (endpoint, _) = app.create_endpoint(&admin, &receiver.url("/e")).await;
    let query = "subscription { deliveryStateChanged { state delivery { id @skip(if: true) } } }";
    let mut sockets = Vec::new();
    for (protocol, subscribe) in [
        ("graphql-transport-ws", "subscribe"),
        ("graphql-ws", "start"),
    ] {
        let mut socket = initialised(&app, protocol, &admin).await;
        let running = sockets.len() as i64 + 1;
        subscribed(&app, &mut socket, subscribe, "1", query, running).await;
        sockets.push(socket);
    }
    submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await;
    for mut socket in sockets {
        let event = loop {
            let message = next(&mut socket).await.expect("the socket is open");
            if matches!(message["type"].as_str(), Some("next" | "data")) {
                break message;
            }
        };
        let change = &event["payload"]["data"]["deliveryStateChanged"];
        assert_eq!(change["delivery"], json!({}), "{event}");
        assert!(change["state"].is_string(), "{event}");
    }
}
