//! Response fields come in the order the operation asks for them, every time (GraphQL spec
//! 7.2.2): async-graphql 7 added them as their resolvers finished.

use futures_util::StreamExt as _;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::support::tenants::{create_tenant, tenant_key};
use crate::support::{Backend, TestApp, TestDb};

/// A field read through a loader (`tenant`) beside fields at hand: before, 1 answer in 5 or
/// so put `expiresAt` before `tenant`. Aliases, fragments and list items keep their places
/// too.
#[tokio::test]
async fn fields_come_in_the_order_they_were_asked_for() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = create_tenant(&app, &admin, "Acme").await;
    let key = tenant_key(&app, &admin, &tenant).await;
    app.create_endpoint(&admin, "https://example.com/a").await;
    app.create_endpoint(&admin, "https://example.com/b").await;
    let cases = [
        (
            key.as_str(),
            "{ currentKey { role tenant { name } expiresAt } }",
            r#"{"data":{"currentKey":{"role":"PARTNER","tenant":{"name":"Acme"},"expiresAt":null}}}"#,
        ),
        (
            admin.as_str(),
            "query { z: currentKey { role } ...F a: endpoints { edges { node { url disabled id: url } } } } \
             fragment F on Query { m: currentKey { tenant { name } role } }",
            r#"{"data":{"z":{"role":"ADMIN"},"m":{"tenant":null,"role":"ADMIN"},"a":{"edges":[{"node":{"url":"https://example.com/a","disabled":false,"id":"https://example.com/a"}},{"node":{"url":"https://example.com/b","disabled":false,"id":"https://example.com/b"}}]}}}"#,
        ),
    ];
    for (token, query, expected) in cases {
        for _ in 0..30 {
            let text = app
                .post_graphql(Some(token), &json!({ "query": query }))
                .await
                .text()
                .await
                .expect("a body");
            assert_eq!(text, expected, "{query}");
        }
    }
}

/// A subscription's events keep the selection's order too, fields read through loaders
/// (`attempts`, `submission`) included: async-graphql resolves an event's fields in order
/// (an event does not pass through the hook that orders a query's answer, so this guards
/// that it stays so).
#[tokio::test]
async fn subscription_events_come_in_the_order_they_were_asked_for() {
    use crate::support::fixtures::{quick_worker, submit};
    use crate::support::websocket::{initialised, subscribed};
    use crate::support::{Receiver, Reply};

    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let (endpoint, _) = app.create_endpoint(&admin, &receiver.url("/order")).await;
    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    let query = "subscription { deliveryStateChanged { delivery { attempts { number } submission { idempotencyKey } state id } } }";
    subscribed(&app, &mut socket, "subscribe", "1", query, 1).await;
    submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await;
    let mut events = 0;
    while events < 2 {
        let message = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
            .await
            .expect("an event in time")
            .expect("the socket is open")
            .expect("a message");
        let Message::Text(text) = message else {
            continue;
        };
        if !text.contains("\"next\"") {
            continue;
        }
        let event = text
            .split_once("\"delivery\":")
            .map_or("", |(_, event)| event);
        let at = |field: &str| event.find(&format!("\"{field}\":")).unwrap_or(usize::MAX);
        assert!(
            at("attempts") < at("submission")
                && at("submission") < at("state")
                && at("state") < at("id"),
            "in the order asked for: {text}"
        );
        events += 1;
    }
}
