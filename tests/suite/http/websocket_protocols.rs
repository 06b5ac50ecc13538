//! Which GraphQL WebSocket subprotocol an upgrade gets: the first the client lists that
//! Courier speaks, over every `Sec-WebSocket-Protocol` header, spelt exactly; none is a 400
//! saying what to send.

use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::support::websocket::next;
use crate::support::websocket::send;
use crate::support::{Backend, TestApp, TestDb};

const QUERY: &str = "{ endpoints { edges { node { id } } } }";

/// A client that offers both protocols gets the first one it lists, in the handshake's
/// answer and in what the session speaks.
#[tokio::test]
async fn the_first_protocol_the_client_offers_is_the_one_spoken() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for (offered, spoken) in [
        (&["graphql-ws, graphql-transport-ws"][..], "graphql-ws"),
        (
            &["graphql-transport-ws", "graphql-ws"],
            "graphql-transport-ws",
        ),
        (
            &["graphql-transport-ws, graphql-ws"],
            "graphql-transport-ws",
        ),
    ] {
        let mut request = format!("ws://{}/graphql/ws", app.addr)
            .into_client_request()
            .expect("request");
        for header in offered {
            request.headers_mut().append(
                "sec-websocket-protocol",
                HeaderValue::from_str(header).expect("header"),
            );
        }
        let (mut socket, response) = tokio_tungstenite::connect_async(request)
            .await
            .expect("upgrade");
        assert_eq!(response.headers()["sec-websocket-protocol"], spoken);
        send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {admin}") } })).await;
        assert_eq!(
            next(&mut socket).await.expect("ack")["type"],
            "connection_ack"
        );
        let start = if spoken == "graphql-ws" {
            "start"
        } else {
            "subscribe"
        };
        send(
            &mut socket,
            json!({ "id": "1", "type": start, "payload": { "query": QUERY } }),
        )
        .await;
        let answer = next(&mut socket).await.expect("an answer");
        let expected = if spoken == "graphql-ws" {
            "data"
        } else {
            "next"
        };
        assert_eq!(answer["type"], expected, "{offered:?}: {answer}");
    }
}

/// Protocols listed over several `Sec-WebSocket-Protocol` headers count in order, all of
/// them: the answer names the first Courier speaks (before, only the first header was read,
/// and an upgrade whose first header named none was refused). Written by hand: the test's
/// client library checks the answer against its first header only.
#[tokio::test]
async fn protocols_over_several_headers_all_count() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let mut stream = tokio::net::TcpStream::connect(app.addr)
        .await
        .expect("connect");
    let upgrade = "GET /graphql/ws HTTP/1.1\r\nhost: courier\r\nupgrade: websocket\r\n\
                   connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                   sec-websocket-version: 13\r\nsec-websocket-protocol: chat\r\n\
                   sec-websocket-protocol: graphql-ws\r\n\r\n";
    stream.write_all(upgrade.as_bytes()).await.expect("upgrade");
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            stream.read_exact(&mut byte),
        )
        .await
        .expect("an answer in time")
        .expect("the upgrade's answer");
        answer.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
    assert!(
        answer.contains("\r\nsec-websocket-protocol: graphql-ws\r\n"),
        "{answer}"
    );
}

/// An upgrade that offers no subprotocol Courier speaks is refused with 400 saying which to
/// send (before, a bare 400 with an empty body). A name spelt otherwise is not one: the
/// handshake could not echo it as sent (before, it was taken and the answer named none).
#[tokio::test]
async fn an_upgrade_without_a_known_protocol_is_told_which_to_send() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    for offered in [
        None,
        Some("mqtt"),
        Some("graphql-sse"),
        Some("GraphQL-WS"),
        Some("Graphql-Transport-Ws"),
    ] {
        let mut request = format!("ws://{}/graphql/ws", app.addr)
            .into_client_request()
            .expect("request");
        if let Some(offered) = offered {
            request.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_str(offered).expect("header"),
            );
        }
        let refused = tokio_tungstenite::connect_async(request)
            .await
            .expect_err("refused");
        let tokio_tungstenite::tungstenite::Error::Http(response) = refused else {
            panic!("{offered:?}: refused over HTTP: {refused}");
        };
        assert_eq!(response.status(), 400, "{offered:?}");
        let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default());
        assert!(
            body.contains("Sec-WebSocket-Protocol: graphql-transport-ws"),
            "{body}"
        );
    }
}

/// A method the WebSocket's address does not take is a 405 that names the ones it does
/// (RFC 9110); `HEAD` is answered as a `GET` that asks for no upgrade is.
#[tokio::test]
async fn other_methods_are_told_the_socket_takes_get() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let status = |method: reqwest::Method| {
        let request = app.request(method, "/graphql/ws");
        async move { request.send().await.expect("answered") }
    };
    let get = status(reqwest::Method::GET).await;
    let head = status(reqwest::Method::HEAD).await;
    assert_eq!(get.status(), 400);
    assert_eq!(head.status(), get.status(), "HEAD as GET");
    for method in [reqwest::Method::POST, reqwest::Method::PUT] {
        let refused = status(method.clone()).await;
        assert_eq!(refused.status(), 405, "{method}");
        let allow = refused
            .headers()
            .get("allow")
            .and_then(|allow| allow.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let allowed: Vec<&str> = allow.split(',').map(str::trim).collect();
        assert!(
            allowed.contains(&"GET") && allowed.contains(&"HEAD"),
            "{method}: Allow: {allow:?}"
        );
    }
}
