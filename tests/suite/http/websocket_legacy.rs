//! The legacy `graphql-ws` protocol (subscriptions-transport-ws): operations with the key
//! in `connection_init`, its own ending, and a client's mistakes closed with the codes
//! `graphql-transport-ws` gives them.

use courier::auth::Role;
use serde_json::json;

use crate::support::websocket::{connect, initialised, next, send, until_closed};
use crate::support::{Backend, TestApp, TestDb};

const QUERY: &str = "{ endpoints { edges { node { id } } } }";

#[tokio::test]
async fn legacy_graphql_ws_runs_operations_with_a_lowercase_key() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let partner = {
        let admin = app.admin_token().await;
        let (id, _) = app.create_endpoint(&admin, "https://example.com/ws").await;
        app.token(Role::Partner, &[uuid::Uuid::parse_str(&id).expect("uuid")])
            .await
    };

    let mut socket = connect(&app, "graphql-ws").await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "authorization": format!("Bearer {partner}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "7", "type": "start", "payload": { "query": QUERY } }),
    )
    .await;
    let result = next(&mut socket).await.expect("data");
    assert_eq!(result["type"], "data", "{result}");
    assert_eq!(result["id"], "7");
    assert_eq!(
        result["payload"]["data"]["endpoints"]["edges"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "{result}"
    );
    assert_eq!(
        next(&mut socket).await.expect("complete")["type"],
        "complete"
    );
}

/// The legacy `connection_terminate` ends the session with a normal close frame, not a
/// dropped connection.
#[tokio::test]
async fn legacy_connection_terminate_closes_normally() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut socket = initialised(&app, "graphql-ws", &admin).await;
    send(&mut socket, json!({ "type": "connection_terminate" })).await;
    let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
    assert_eq!(close.map(|(code, _)| code), Some(1000));
}

/// A legacy `start` before `connection_init` is the client's mistake, closed with `4401
/// Unauthorized` as on `graphql-transport-ws`, not with an internal error's 1011.
#[tokio::test]
async fn legacy_start_before_init_closes_with_4401() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let mut socket = connect(&app, "graphql-ws").await;
    send(
        &mut socket,
        json!({ "id": "1", "type": "start", "payload": { "query": QUERY } }),
    )
    .await;
    let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
    assert_eq!(close.map(|(code, _)| code), Some(4401));
}

/// A legacy message that is not one of the protocol's (not JSON, an unknown type, a
/// `start` without its payload) closes with `4400`, as on `graphql-transport-ws`: before,
/// 1002, which is for frames that break RFC 6455, with the JSON parser's words as reason.
#[tokio::test]
async fn legacy_garbage_closes_with_4400() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for garbage in [
        "not json".to_owned(),
        json!({ "type": "wat" }).to_string(),
        json!({ "id": "1", "type": "start" }).to_string(),
    ] {
        let mut socket = initialised(&app, "graphql-ws", &admin).await;
        futures_util::SinkExt::send(
            &mut socket,
            tokio_tungstenite::tungstenite::Message::text(garbage.clone()),
        )
        .await
        .expect("send");
        let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
        let (code, reason) = close.expect("a close frame");
        assert_eq!(code, 4400, "{garbage}: {reason}");
        assert!(reason.starts_with("Invalid message received"), "{reason}");
    }
}
