//! A GraphQL-over-WebSocket client for tests: connect with either protocol, send, and read
//! frames until a deadline or the close.

use crate::support::TestApp;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub async fn connect(app: &TestApp, protocol: &str) -> Socket {
    connect_to(&app.addr.to_string(), protocol).await
}

/// A socket speaking `protocol` to the Courier (or the proxy to one) at `addr`.
pub async fn connect_to(addr: &str, protocol: &str) -> Socket {
    let mut request = format!("ws://{addr}/graphql/ws")
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

/// A socket speaking `protocol`, initialised with `token` in `connection_init` and
/// acknowledged.
pub async fn initialised(app: &TestApp, protocol: &str, token: &str) -> Socket {
    initialised_at(&app.addr.to_string(), protocol, token).await
}

/// [`initialised`], to the Courier (or the proxy to one) at `addr`.
pub async fn initialised_at(addr: &str, protocol: &str, token: &str) -> Socket {
    let mut socket = connect_to(addr, protocol).await;
    let init = serde_json::json!({ "type": "connection_init",
                                   "payload": { "Authorization": format!("Bearer {token}") } });
    send(&mut socket, init).await;
    let ack = next(&mut socket).await;
    assert_eq!(
        ack.as_ref().map(|ack| ack["type"].clone()),
        Some("connection_ack".into()),
        "{protocol}: {ack:?}"
    );
    socket
}

pub async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .expect("send");
}

/// Starts operation `id` running `query` with a message of `kind` (`subscribe`, or the
/// legacy `start`), and waits until `app` counts `running` subscriptions.
pub async fn subscribed(
    app: &TestApp,
    socket: &mut Socket,
    kind: &str,
    id: &str,
    query: &str,
    running: i64,
) {
    send(
        socket,
        serde_json::json!({ "id": id, "type": kind, "payload": { "query": query } }),
    )
    .await;
    super::fixtures::eventually("subscribed", std::time::Duration::from_secs(5), || async {
        app.state.metrics.active_subscriptions.get() == running
    })
    .await;
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

/// What the server sends, keep-alives skipped.
#[derive(Debug)]
pub enum Frame {
    /// A protocol message.
    Message(Value),
    /// A close frame (`code`, `reason`), or `None` if the connection just ended.
    Closed(Option<(u16, String)>),
}

/// The next frame before `deadline`, or `None` if nothing came by then.
pub async fn frame_before(socket: &mut Socket, deadline: tokio::time::Instant) -> Option<Frame> {
    loop {
        let message = tokio::time::timeout_at(deadline, socket.next())
            .await
            .ok()?;
        match message {
            None | Some(Err(_)) => return Some(Frame::Closed(None)),
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).expect("JSON message");
                if value["type"] != "ka" && value["type"] != "ping" {
                    return Some(Frame::Message(value));
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Some(Frame::Closed(
                    frame.map(|frame| (u16::from(frame.code), frame.reason.to_string())),
                ))
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Reads until the server closes (within `wait`): the messages before, and the close frame.
pub async fn until_closed(
    socket: &mut Socket,
    wait: std::time::Duration,
) -> (Vec<Value>, Option<(u16, String)>) {
    let deadline = tokio::time::Instant::now() + wait;
    let mut messages = Vec::new();
    loop {
        match frame_before(socket, deadline).await {
            Some(Frame::Message(message)) => messages.push(message),
            Some(Frame::Closed(close)) => return (messages, close),
            None => panic!("the server did not close within {wait:?}; it sent {messages:?}"),
        }
    }
}
