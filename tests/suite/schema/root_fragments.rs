//! A subscription's root field selected through a fragment runs like a plain one, over both
//! protocols; a root that `@skip` or `@include` could leave empty is refused.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fixtures::{endpoint_on, quick_worker, submit};
use crate::support::websocket::{initialised, next, send, Socket};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A socket of `protocol`, authenticated, running `query` as the operation `s`.
async fn subscribed(
    app: &TestApp,
    token: &str,
    protocol: &str,
    query: &str,
    endpoint: &str,
) -> Socket {
    let mut socket = initialised(app, protocol, token).await;
    let start = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    let payload = json!({ "query": query, "variables": { "e": endpoint } });
    send(
        &mut socket,
        json!({ "id": "s", "type": start, "payload": payload }),
    )
    .await;
    socket
}

/// The next message within `wait`, if any.
async fn within(socket: &mut Socket, wait: Duration) -> Option<Value> {
    tokio::time::timeout(wait, next(socket))
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_field_in_a_fragment_streams_its_changes() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "hook").await;
    let field = "deliveryStateChanged(endpointId: $e) { deliveryId state }";
    let documents = [
        format!("subscription($e: ID) {{ ...F }} fragment F on Subscription {{ {field} }}"),
        format!("subscription($e: ID) {{ ... on Subscription {{ {field} }} }}"),
        format!("subscription($e: ID) {{ ... {{ ... {{ {field} }} }} }}"),
        // Selected twice, its selections split: one stream, each change whole, once.
        "subscription($e: ID) { deliveryStateChanged(endpointId: $e) { deliveryId } ...F } \
         fragment F on Subscription { deliveryStateChanged(endpointId: $e) { state } }"
            .to_owned(),
    ];
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        for document in &documents {
            let mut socket = subscribed(&app, &admin, protocol, document, &endpoint).await;
            // A subscribe has no acknowledgement: submit until a change arrives.
            let mut seen = None;
            for _ in 0..50 {
                submit(&app, &admin, &endpoint, json!({}), None).await;
                if let Some(message) = within(&mut socket, Duration::from_millis(300)).await {
                    seen = Some(message);
                    break;
                }
            }
            let message = seen.unwrap_or_else(|| panic!("{protocol} {document}: nothing"));
            assert!(
                matches!(message["type"].as_str(), Some("next" | "data")),
                "{protocol} {document}: {message}"
            );
            let change = &message["payload"]["data"]["deliveryStateChanged"];
            assert!(
                change["state"].is_string() && change["deliveryId"].is_string(),
                "{protocol} {document}: {message}"
            );
        }
    }
}

#[tokio::test]
async fn a_conditional_root_is_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let document = "subscription($e: ID) { deliveryStateChanged(endpointId: $e) @include(if: false) { state } }";
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut socket = subscribed(&app, &admin, protocol, document, "").await;
        let message = within(&mut socket, Duration::from_secs(5))
            .await
            .expect("an answer");
        assert_eq!(message["type"], "error", "{protocol}: {message}");
        assert!(
            message.to_string().contains("@include"),
            "{protocol}: {message}"
        );
    }
}
