//! GraphQL over WebSocket: both protocols, authenticated by `connection_init`.

use sea_orm::ConnectionTrait as _;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::support::websocket::connect;
use crate::support::websocket::initialised;
use crate::support::websocket::next;
use crate::support::websocket::send;
use crate::support::websocket::subscribed;
use crate::support::websocket::until_closed;
use crate::support::{Backend, TestApp, TestDb};

const QUERY: &str = "{ endpoints { edges { node { id } } } }";

#[tokio::test]
async fn graphql_transport_ws_runs_operations_for_an_authenticated_client() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, _) = app.create_endpoint(&admin, "https://example.com/ws").await;

    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
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

/// A missing, wrong or revoked key closes the socket with `4403 Forbidden`, as
/// `graphql-transport-ws` specifies; the legacy protocol says why in a `connection_error` first.
#[tokio::test]
async fn websocket_without_a_valid_key_is_closed_with_4403() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let revoked = app.admin_token().await;
    app.state
        .db
        .conn()
        .execute_unprepared("UPDATE api_keys SET revoked_at = created_at")
        .await
        .expect("revoke");
    let revoked = format!("Bearer {revoked}");
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        for payload in [
            json!({}),
            json!({ "Authorization": "Bearer courier_wrong" }),
            json!({ "Authorization": revoked }),
        ] {
            let mut socket = connect(&app, protocol).await;
            send(
                &mut socket,
                json!({ "type": "connection_init", "payload": payload }),
            )
            .await;
            let (messages, close) =
                until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
            let (code, reason) =
                close.unwrap_or_else(|| panic!("{protocol} {payload}: no close frame"));
            assert_eq!(code, 4403, "{protocol} {payload}: {reason}");
            if protocol == "graphql-ws" {
                assert_eq!(messages.len(), 1, "{messages:?}");
                assert_eq!(messages[0]["type"], "connection_error", "{messages:?}");
                assert_eq!(
                    messages[0]["payload"]["message"], "a valid API key is required",
                    "{messages:?}"
                );
            } else {
                assert_eq!(reason, "Forbidden");
                assert!(messages.is_empty(), "{messages:?}");
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
    let (mut socket, _) = tokio_tungstenite::connect_async(request.clone())
        .await
        .expect("upgrade");
    send(&mut socket, json!({ "type": "connection_init" })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    // A payload that names a key the wrong way is a wrong key: the header does not stand
    // in for it.
    for payload in [
        json!({ "Authorization": 123 }),
        json!({ "authorization": "Bearer courier_wrong", "Authorization": format!("Bearer {admin}") }),
    ] {
        let (mut socket, _) = tokio_tungstenite::connect_async(request.clone())
            .await
            .expect("upgrade");
        send(
            &mut socket,
            json!({ "type": "connection_init", "payload": payload }),
        )
        .await;
        let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
        let (code, reason) = close.unwrap_or_else(|| panic!("{payload}: no close frame"));
        assert_eq!(code, 4403, "{payload}: {reason}");
    }
}

/// A `connection_init` naming `Authorization` twice, the same way, is closed with 4400 on
/// both protocols, whichever key comes first: before, the last one signed the session in
/// (a gateway checking the first would have approved another key). So is any message
/// naming a member twice in one object.
#[tokio::test]
async fn a_message_naming_a_member_twice_is_closed_on_both_protocols() {
    use futures_util::SinkExt as _;
    use tokio_tungstenite::tungstenite::Message;

    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let other = app.admin_token().await;
    let twice = format!(
        r#"{{"type":"connection_init","payload":{{"Authorization":"Bearer {admin}","Authorization":"Bearer {other}"}}}}"#
    );
    let in_variables = format!(
        r#"{{"id":"1","type":"subscribe","payload":{{"query":"{QUERY}","variables":{{"a":1,"a":2}}}}}}"#
    );
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        // As a text frame, and as a binary one, which the session reads as it reads text.
        for frame in [
            Message::text(twice.clone()),
            Message::binary(twice.clone().into_bytes()),
        ] {
            let mut socket = connect(&app, protocol).await;
            socket.send(frame).await.expect("sent");
            let (messages, close) =
                until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
            let (code, reason) = close.unwrap_or_else(|| panic!("{protocol}: no close frame"));
            assert_eq!(code, 4400, "{protocol}: {reason}");
            assert!(
                messages
                    .iter()
                    .all(|message| message["type"] != "connection_ack"),
                "{protocol}: {messages:?}"
            );
        }

        let mut socket = initialised(&app, protocol, &admin).await;
        let in_variables = if protocol == "graphql-ws" {
            in_variables.replace("subscribe", "start")
        } else {
            in_variables.clone()
        };
        socket
            .send(Message::text(in_variables))
            .await
            .expect("sent");
        let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
        let (code, reason) = close.unwrap_or_else(|| panic!("{protocol}: no close frame"));
        assert_eq!(code, 4400, "{protocol}: {reason}");
    }
}

/// `graphql-transport-ws` rules broken by a client get the protocol's close codes: a
/// message that is not one (not JSON, no or an unknown type, a `subscribe` without an id
/// or a query) 4400, a `subscribe` before `connection_init` 4401, and a `subscribe` reusing the id of a
/// running subscription 4409. The process answers the next client as ever.
#[tokio::test]
async fn protocol_violations_close_with_the_protocols_codes() {
    use tokio_tungstenite::tungstenite::Message;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let wait = std::time::Duration::from_secs(5);

    for garbage in [
        "{not json".to_owned(),
        json!({ "type": "launch" }).to_string(),
        json!({ "payload": {} }).to_string(),
        json!({ "type": "subscribe", "payload": { "query": QUERY } }).to_string(),
        json!({ "id": "e", "type": "subscribe", "payload": {} }).to_string(),
        json!({ "id": "n", "type": "subscribe", "payload": { "query": 5 } }).to_string(),
    ] {
        let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
        futures_util::SinkExt::send(&mut socket, Message::text(garbage.clone()))
            .await
            .expect("send");
        let (_, close) = until_closed(&mut socket, wait).await;
        assert_eq!(close.map(|c| c.0), Some(4400), "{garbage}");
    }
    // Garbage before connection_init is just as invalid.
    let mut socket = connect(&app, "graphql-transport-ws").await;
    futures_util::SinkExt::send(&mut socket, Message::text("[]"))
        .await
        .expect("send");
    assert_eq!(
        until_closed(&mut socket, wait).await.1.map(|c| c.0),
        Some(4400)
    );

    let subscription = |id: &str| {
        json!({ "id": id, "type": "subscribe",
                "payload": { "query": "subscription { deliveryStateChanged { deliveryId } }" } })
    };
    let mut socket = connect(&app, "graphql-transport-ws").await;
    send(&mut socket, subscription("1")).await;
    let (_, close) = until_closed(&mut socket, wait).await;
    assert_eq!(
        close.map(|c| c.0),
        Some(4401),
        "subscribe before connection_init"
    );

    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    send(&mut socket, subscription("1")).await;
    send(&mut socket, subscription("1")).await;
    let (_, close) = until_closed(&mut socket, wait).await;
    assert_eq!(
        close.map(|c| c.0),
        Some(4409),
        "a running subscription's id again"
    );

    // A finished operation's id is free again, and the process serves the next client.
    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    for _ in 0..2 {
        send(
            &mut socket,
            json!({ "id": "q", "type": "subscribe", "payload": { "query": QUERY } }),
        )
        .await;
        assert_eq!(next(&mut socket).await.expect("next")["type"], "next");
        assert_eq!(
            next(&mut socket).await.expect("complete")["type"],
            "complete"
        );
    }
}

/// Close frames whose reason echoes what the client sent still fit a control frame's 125
/// bytes, so the client reads the close code rather than failing the connection.
#[tokio::test]
async fn close_frames_fit_a_control_frame_whatever_the_client_sent() {
    use tokio_tungstenite::tungstenite::Message;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let wait = std::time::Duration::from_secs(5);
    let long_id = "i".repeat(200);
    let subscription = json!({ "id": long_id, "type": "subscribe",
            "payload": { "query": "subscription { deliveryStateChanged { deliveryId } }" } });
    let cases = [
        (
            "graphql-transport-ws",
            vec![subscription.to_string(), subscription.to_string()],
            4409,
        ),
        (
            "graphql-transport-ws",
            vec![json!({ "id": "v", "type": "subscribe",
                          "payload": { "query": QUERY, "variables": "v".repeat(300) } })
            .to_string()],
            4400,
        ),
        (
            "graphql-ws",
            vec![json!({ "type": "z".repeat(300) }).to_string()],
            4400,
        ),
    ];
    for (protocol, messages, code) in cases {
        let mut socket = initialised(&app, protocol, &admin).await;
        for message in messages {
            futures_util::SinkExt::send(&mut socket, Message::text(message))
                .await
                .expect("send");
        }
        let (_, close) = until_closed(&mut socket, wait).await;
        let (got, reason) = close.expect("a close frame the client can read");
        assert_eq!(got, code, "{protocol}: {reason}");
        assert!(reason.len() <= 123, "{protocol}: {reason}");
    }
}

/// A message larger than a request body may be (`COURIER_MAX_BODY_BYTES`) closes the socket
/// with 1009 on both protocols, and the process serves the next client.
#[tokio::test]
async fn a_message_over_the_body_limit_closes_with_1009() {
    use tokio_tungstenite::tungstenite::Message;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| config.max_body_bytes = 64 * 1024).await;
    let admin = app.admin_token().await;
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut socket = initialised(&app, protocol, &admin).await;
        let huge = json!({ "id": "h", "type": "subscribe", "payload": { "query": QUERY,
                           "variables": { "pad": "x".repeat(70 * 1024) } } });
        // The server may close before the whole message is written.
        let _ = futures_util::SinkExt::send(&mut socket, Message::text(huge.to_string())).await;
        let (_, close) = until_closed(&mut socket, std::time::Duration::from_secs(5)).await;
        assert_eq!(close.map(|c| c.0), Some(1009), "{protocol}");
    }
    initialised(&app, "graphql-transport-ws", &admin).await;
}

/// A client that leaves ends its subscriptions at once, on both protocols, whether it sends
/// a close frame (and reads nothing more) or just shuts its side of the connection (as when
/// its process exits): the server does not keep the socket, and count the subscription,
/// until an event needs sending.
#[tokio::test]
async fn a_client_that_leaves_ends_its_subscriptions_at_once() {
    use futures_util::SinkExt as _;
    use tokio::io::AsyncWriteExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let subscription = "subscription { deliveryStateChanged { deliveryId state } }";
    let protocols = [
        ("graphql-transport-ws", "subscribe"),
        ("graphql-ws", "start"),
    ];
    for ((protocol, kind), close_frame) in protocols
        .into_iter()
        .flat_map(|protocol| [(protocol, true), (protocol, false)])
    {
        let mut socket = initialised(&app, protocol, &admin).await;
        subscribed(&app, &mut socket, kind, "s", subscription, 1).await;
        if close_frame {
            socket.send(Message::Close(None)).await.expect("close");
        } else {
            match socket.get_mut() {
                tokio_tungstenite::MaybeTlsStream::Plain(tcp) => {
                    tcp.shutdown().await.expect("shut")
                }
                _ => panic!("a plain connection"),
            }
        }
        crate::support::fixtures::eventually(
            &format!("{protocol}, close frame {close_frame}: the subscription ended"),
            std::time::Duration::from_secs(2),
            || async { app.state.metrics.active_subscriptions.get() == 0 },
        )
        .await;
    }
}
