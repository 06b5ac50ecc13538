//! GraphQL over WebSocket: both protocols, authenticated by `connection_init`.

use courier::auth::Role;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::{Backend, TestApp, TestDb};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub async fn connect(app: &TestApp, protocol: &str) -> Socket {
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(protocol).expect("header"),
    );
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    assert_eq!(response.headers()["sec-websocket-protocol"], protocol);
    socket
}

pub async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .expect("send");
}

/// The next protocol message, skipping keep-alives; `None` when the server closed.
pub async fn next(socket: &mut Socket) -> Option<Value> {
    loop {
        let message = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
            .await
            .expect("the server answers in time")?;
        match message.ok()? {
            Message::Text(text) => {
                let value: Value = serde_json::from_str(&text).expect("JSON message");
                if value["type"] != "ka" && value["type"] != "ping" {
                    return Some(value);
                }
            }
            Message::Close(_) => return None,
            _ => {}
        }
    }
}

const QUERY: &str = "{ endpoints { edges { node { id } } } }";

#[tokio::test]
async fn graphql_transport_ws_runs_operations_for_an_authenticated_client() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, _) = app.create_endpoint(&admin, "https://example.com/ws").await;

    let mut socket = connect(&app, "graphql-transport-ws").await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {admin}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": QUERY } }),
    )
    .await;
    let result = next(&mut socket).await.expect("next");
    assert_eq!(result["type"], "next", "{result}");
    assert_eq!(
        result["payload"]["data"]["endpoints"]["edges"][0]["node"]["id"],
        id.as_str(),
        "{result}"
    );
    assert_eq!(
        next(&mut socket).await.expect("complete")["type"],
        "complete"
    );
}

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

#[tokio::test]
async fn websocket_without_a_valid_key_is_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    for (protocol, payload) in [
        ("graphql-transport-ws", json!({})),
        (
            "graphql-transport-ws",
            json!({ "Authorization": "Bearer courier_wrong" }),
        ),
        (
            "graphql-ws",
            json!({ "Authorization": "Bearer courier_wrong" }),
        ),
    ] {
        let mut socket = connect(&app, protocol).await;
        send(
            &mut socket,
            json!({ "type": "connection_init", "payload": payload }),
        )
        .await;
        match next(&mut socket).await {
            None => {}
            Some(message) => {
                assert_eq!(message["type"], "connection_error", "{protocol}: {message}")
            }
        }
    }

    let no_protocol =
        tokio_tungstenite::connect_async(format!("ws://{}/graphql/ws", app.addr)).await;
    assert!(
        no_protocol.is_err(),
        "a WebSocket without a GraphQL subprotocol is refused"
    );
}

#[tokio::test]
async fn the_upgrade_request_may_carry_the_key_instead() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .expect("request");
    let headers = request.headers_mut();
    headers.insert(
        "sec-websocket-protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {admin}")).expect("header"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    send(&mut socket, json!({ "type": "connection_init" })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
}
