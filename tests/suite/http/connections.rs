//! Connection hygiene, over raw TCP as a careless or hostile client would behave: a header
//! sent halfway is cut off after the header timeout, a kept-alive connection is closed
//! once idle, a WebSocket that never sends `connection_init` is closed with 4408, the
//! connection cap answers one connection too many with 503 (WebSockets count), a body
//! sent a byte at a time is cut off at the body timeout (or at once without a key), and a
//! WebSocket whose peer is gone without closing is dropped after two unanswered pings.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::websocket::{
    connect, frame_before, initialised_at, send, subscribed, until_closed, Frame,
};
use crate::support::{Backend, PartitionProxy, TestApp, TestDb};

/// Generous bounds: these only prove the server acts, never how fast.
const WITHIN: Duration = Duration::from_secs(10);

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: courier\r\n\r\n";

/// Reads until the server closes the connection (or `WITHIN` passes, which fails); returns
/// what it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(WITHIN, stream.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the server kept the connection open; it sent {:?}",
        String::from_utf8_lossy(&answer)
    );
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends a health check on `stream` and reads its answer (the connection stays open).
async fn health_on(stream: &mut TcpStream) -> String {
    stream.write_all(HEALTH).await.expect("send");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(WITHIN, stream.read(&mut answer))
        .await
        .expect("an answer in time")
        .expect("read");
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test]
async fn half_a_header_is_cut_off_and_a_whole_one_is_served() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.header_timeout_ms = 300;
        config.idle_timeout_ms = 60_000;
    })
    .await;
    let mut half = TcpStream::connect(app.addr).await.expect("connect");
    half.write_all(b"POST /graphql HTTP/1.1\r\nhost: courier\r\ncontent-ty")
        .await
        .expect("send half a header");
    let answer = read_to_close(&mut half).await;
    assert!(
        answer.is_empty(),
        "nothing is answered to half a header: {answer:?}"
    );

    // The same timeout leaves a whole request, sent slowly within it, alone.
    let mut slow = TcpStream::connect(app.addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    slow.write_all(b"host: courier\r\n\r\n")
        .await
        .expect("send");
    let mut answer = vec![0u8; 4096];
    let n = slow.read(&mut answer).await.expect("read");
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer[..n])
    );
}

#[tokio::test]
async fn the_header_is_timed_from_its_first_byte_and_a_stalled_body_ends_its_request() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.header_timeout_ms = 300;
        config.idle_timeout_ms = 60_000;
    })
    .await;
    // Quiet for longer than the header timeout, then a whole request: served.
    let mut late = TcpStream::connect(app.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let answer = health_on(&mut late).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");

    // A whole header announcing a body that never comes: the request ends, answered
    // `408`, and the connection closes, instead of holding its place.
    let admin = app.admin_token().await;
    let mut stalled = TcpStream::connect(app.addr).await.expect("connect");
    stalled
        .write_all(posting(&admin, 1_048_576).as_bytes())
        .await
        .expect("send");
    stalled.write_all(b"{\"query\":").await.expect("send");
    let answer = read_to_close(&mut stalled).await;
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "a stalled body is answered 408: {answer:?}"
    );
    assert!(
        answer.contains("\"BAD_USER_INPUT\""),
        "as a GraphQL error: {answer:?}"
    );
}

/// The header of a GraphQL POST as `token` (none if empty) announcing `length` bytes.
fn posting(token: &str, length: usize) -> String {
    let authorization = if token.is_empty() {
        String::new()
    } else {
        format!("authorization: Bearer {token}\r\n")
    };
    format!(
        "POST /graphql HTTP/1.1\r\nhost: courier\r\ncontent-type: application/json\r\n\
         {authorization}content-length: {length}\r\n\r\n"
    )
}

/// A body sent a byte at a time, each soon enough not to stall: with a key, the request
/// ends once the body timeout passes, answered `408`; without one, it is answered `401`
/// before any of the body is read. Either way the connection closes rather than being held
/// for as long as the body would take (a megabyte at a byte a second: twelve days).
#[tokio::test]
async fn a_body_sent_a_byte_at_a_time_is_cut_off() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.header_timeout_ms = 1_000;
        config.body_timeout_ms = 600;
        config.idle_timeout_ms = 60_000;
    })
    .await;
    let admin = app.admin_token().await;
    for (token, status) in [(admin.as_str(), "408"), ("", "401")] {
        let drip = TcpStream::connect(app.addr).await.expect("connect");
        let (mut reader, mut writer) = drip.into_split();
        writer
            .write_all(posting(token, 1_048_576).as_bytes())
            .await
            .expect("send");
        let dripping = tokio::spawn(async move {
            while writer.write_all(b" ").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(WITHIN, reader.read_to_end(&mut answer)).await;
        dripping.abort();
        assert!(read.is_ok(), "{status}: the connection was held");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{status}: {answer:?}"
        );
    }
}

/// A large body sent whole, as many clients send it before reading, with a key that is no
/// longer valid gets its `401` (its body refused unread is read and thrown away first, so
/// that a connection closed with bytes unread, which the system resets, cannot cost a
/// client on a slower network its answer).
#[tokio::test]
async fn a_large_body_with_a_bad_key_gets_its_answer() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let body = format!(
        "{{\"query\":\"{{ endpoints {{ edges {{ cursor }} }} }}\",\"pad\":\"{}\"}}",
        "x".repeat(900_000)
    );
    for _ in 0..3 {
        let mut stream = TcpStream::connect(app.addr).await.expect("connect");
        let head = posting("not-a-key", body.len());
        // As many clients do: the whole request is sent before the answer is read.
        let sent = tokio::time::timeout(WITHIN, async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await
        })
        .await
        .expect("sent in time");
        assert!(
            sent.is_ok(),
            "the connection was reset while sending: {sent:?}"
        );
        // The status line is all this needs (the connection may stay open for more).
        let mut answer = Vec::new();
        let read = tokio::time::timeout(WITHIN, async {
            let mut chunk = [0u8; 4096];
            while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) => return Ok(()),
                    Ok(n) => answer.extend_from_slice(&chunk[..n]),
                    Err(err) => return Err(err),
                }
            }
            Ok(())
        })
        .await
        .expect("answered in time");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            read.is_ok(),
            "the connection was reset: {read:?} after {answer:?}"
        );
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    }
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.idle_timeout_ms = 400;
    })
    .await;
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    // Kept alive while it is used: two requests on one connection, under the idle timeout.
    for _ in 0..2 {
        let answer = health_on(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Then left idle: closed, with nothing more said.
    let rest = read_to_close(&mut stream).await;
    assert!(rest.is_empty(), "{rest:?}");

    // A connection that never sends a byte is idle from the start.
    let mut silent = TcpStream::connect(app.addr).await.expect("connect");
    assert!(read_to_close(&mut silent).await.is_empty());
}

#[tokio::test]
async fn a_websocket_without_connection_init_is_closed_with_4408() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.ws_init_timeout_ms = 300;
    })
    .await;
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut socket = connect(&app, protocol).await;
        let (messages, close) = until_closed(&mut socket, WITHIN).await;
        let (code, reason) = close.unwrap_or_else(|| panic!("{protocol}: no close frame"));
        assert_eq!(code, 4408, "{protocol}: {reason}");
        assert_eq!(reason, "Connection initialisation timeout");
        assert!(messages.is_empty(), "{protocol}: {messages:?}");
    }
}

#[tokio::test]
async fn one_connection_over_the_cap_is_refused_with_503() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.max_connections = 2;
    })
    .await;
    let admin = app.admin_token().await;
    // One kept-alive HTTP connection and one WebSocket hold the two places.
    let mut held = TcpStream::connect(app.addr).await.expect("connect");
    assert!(health_on(&mut held).await.starts_with("HTTP/1.1 200"));
    let mut socket = connect(&app, "graphql-transport-ws").await;
    send(
        &mut socket,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {admin}") } }),
    )
    .await;
    let ack = crate::support::websocket::next(&mut socket).await;
    assert_eq!(
        ack.as_ref().map(|ack| ack["type"].clone()),
        Some(json!("connection_ack"))
    );

    assert_eq!(app.state.metrics.connections_open.get(), 2);

    // An HTTP client reads the refusal as a whole response.
    let refused = crate::support::http_client()
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("a complete answer");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    // Dated and typed as every other answer.
    let date = refused.headers()["date"].to_str().expect("a text Date");
    assert!(
        chrono::DateTime::parse_from_rfc2822(date).is_ok(),
        "an HTTP date: {date}"
    );
    assert_eq!(
        refused.headers()["content-type"],
        "application/json; charset=utf-8"
    );
    // Readable by a dashboard of another origin, as the API's answers are by default.
    assert_eq!(refused.headers()["access-control-allow-origin"], "*");
    let body: serde_json::Value = refused.json().await.expect("a JSON body");
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "SERVICE_UNAVAILABLE"
    );

    // The held ones still work; once the WebSocket goes, a new connection is served.
    assert!(health_on(&mut held).await.starts_with("HTTP/1.1 200"));
    drop(socket);
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let mut next = TcpStream::connect(app.addr).await.expect("connect");
        next.write_all(HEALTH).await.expect("send");
        let answer = read_first(&mut next).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a place should free up once the WebSocket closes: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while app.state.metrics.connections_open.get() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the open-connections gauge comes back to 0"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counted = app.state.metrics.connections_refused.get();
    assert!(counted >= 1, "refusals are counted: {counted}");
}

/// The first answer on `stream`, or what it sent before closing.
async fn read_first(stream: &mut TcpStream) -> String {
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(WITHIN, stream.read(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A WebSocket whose peer stops answering without closing (a lost network, a sleeping
/// laptop: the connection stays open, no byte moves) is dropped once two pings go
/// unanswered, its subscriptions ended; one whose peer answers stays open however quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_whose_peer_is_gone_is_dropped_after_unanswered_pings() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.ws_ping_ms = 500;
    })
    .await;
    let admin = app.admin_token().await;
    let proxy = PartitionProxy::start(&format!("http://{}", app.addr)).await;
    let through_proxy = proxy
        .url_for(&format!("http://{}", app.addr))
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let query = "subscription { deliveryStateChanged { deliveryId } }";

    let mut answering = initialised_at(&app.addr.to_string(), "graphql-transport-ws", &admin).await;
    subscribed(&app, &mut answering, "subscribe", "1", query, 1).await;
    let mut gone = initialised_at(&through_proxy, "graphql-ws", &admin).await;
    subscribed(&app, &mut gone, "start", "1", query, 2).await;
    assert_eq!(app.state.metrics.connections_open.get(), 2);
    // This client answers pings as it reads (as every client library does): it reads
    // until told to stop, and says whether anything came (a close, above all).
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let far = tokio::time::Instant::now() + Duration::from_secs(600);
        tokio::select! {
            frame = frame_before(&mut answering, far) => frame,
            _ = stopped => None,
        }
    });

    proxy.partition();
    crate::support::fixtures::eventually("the gone peer dropped", WITHIN, || async {
        app.state.metrics.active_subscriptions.get() == 1
            && app.state.metrics.connections_open.get() == 1
    })
    .await;

    // The peer that answers was pinged all along and is still served: six ping
    // intervals more, and no close.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Counted before the reader stops: the socket goes with it.
    assert_eq!(app.state.metrics.active_subscriptions.get(), 1);
    let _ = stop.send(());
    match reader.await.expect("the reader") {
        None => {}
        Some(Frame::Closed(close)) => panic!("the answering peer was closed: {close:?}"),
        Some(Frame::Message(message)) => panic!("unexpected {message}"),
    }
}

/// A client waiting for its `connection_init` to be accepted while the key check waits on
/// the database (here a lock another connection holds, longer than two ping intervals) is
/// not taken for gone: it answers pings, and is accepted once the check ends, on both
/// protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_on_a_slow_key_check_is_not_taken_for_gone() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.ws_ping_ms = 100;
        config.auth_cache_ms = 0;
    })
    .await;
    let admin = app.admin_token().await;
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let holder = db.connect(1).await;
        let txn = holder.begin_write().await.expect("begin");
        sea_orm::ConnectionTrait::execute_unprepared(
            &txn,
            "LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE",
        )
        .await
        .expect("lock the keys");
        let letting_go = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            txn.rollback().await.expect("let go");
        });
        // `initialised_at` reads (answering pings) until the acknowledgement, and fails on
        // anything else.
        let mut socket = initialised_at(&app.addr.to_string(), protocol, &admin).await;
        letting_go.await.expect("the lock let go");
        send(
            &mut socket,
            json!({ "id": "q", "type": if protocol == "graphql-ws" { "start" } else { "subscribe" },
                    "payload": { "query": "{ endpoints { edges { cursor } } }" } }),
        )
        .await;
        let answer = crate::support::websocket::next(&mut socket)
            .await
            .expect("an answer");
        assert!(
            answer["payload"]["data"]["endpoints"].is_object(),
            "{protocol}: {answer}"
        );
    }
}
