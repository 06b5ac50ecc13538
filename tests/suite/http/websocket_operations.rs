//! How an operation on a GraphQL WebSocket ends, on both protocols: refused before it runs,
//! with one `error` message and no `complete`; completed by the client, with nothing more
//! sent for it, so its id can be reused at once; within the database's deadline, as over
//! HTTP; and how the socket ends when the process shuts down.

use std::time::Duration;

use serde_json::json;

use crate::support::websocket::{initialised, next, send, subscribed, until_closed, Socket};
use crate::support::{Backend, TestApp, TestDb};

const QUERY: &str = "{ endpoints { edges { node { id } } } }";

/// The next messages are [`QUERY`]'s answer, in a message of type `result` (`next`, or the
/// legacy `data`), and its `complete`.
async fn answers_the_query(socket: &mut Socket, result: &str) {
    let answer = next(socket).await.expect("an answer");
    assert_eq!(answer["type"], result, "{answer}");
    assert!(
        answer["payload"]["data"]["endpoints"].is_object(),
        "{answer}"
    );
    assert_eq!(next(socket).await.expect("complete")["type"], "complete");
}

/// Both protocols: an operation refused before it runs (it does not parse or validate,
/// its variables do not fit, a subscription selects two root fields) is answered with one
/// `error` message and no `complete`, and its id is free again; an operation that runs
/// answers with `next` (legacy: `data`) as ever.
#[tokio::test]
async fn an_operation_refused_before_it_runs_gets_an_error_message() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for (protocol, start, result) in [
        ("graphql-transport-ws", "subscribe", "next"),
        ("graphql-ws", "start", "data"),
    ] {
        let mut socket = initialised(&app, protocol, &admin).await;
        for refused in [
            json!({ "query": "subscription { nope }" }),
            json!({ "query": "subscription($e: ID) { deliveryStateChanged(endpointId: $e) { state } }",
                    "variables": { "e": { "not": "an id" } } }),
            json!({ "query": "{ endpoints(" }),
            // A subscription selects one root field.
            json!({ "query": "subscription { a: deliveryStateChanged { state } b: deliveryStateChanged { deliveryId } }" }),
        ] {
            send(
                &mut socket,
                json!({ "id": "r", "type": start, "payload": refused }),
            )
            .await;
            let answer = next(&mut socket).await.expect("an answer");
            assert_eq!(answer["type"], "error", "{protocol}, {refused}: {answer}");
            assert_eq!(answer["id"], "r");
            let errors = answer["payload"].as_array().expect("a list of errors");
            assert!(!errors.is_empty(), "{answer}");
            assert!(errors[0]["message"].is_string(), "{answer}");
        }
        // No `complete` followed the errors: the next message is this query's answer.
        send(
            &mut socket,
            json!({ "id": "r", "type": start, "payload": { "query": QUERY } }),
        )
        .await;
        answers_the_query(&mut socket, result).await;
    }
}

/// `graphql-transport-ws`: after the client's `complete`, nothing more comes for that
/// operation, not even a `complete` echoed back; a new operation reusing the id at once
/// gets its own answer and its own `complete`.
#[tokio::test]
async fn an_operation_the_client_completed_gets_nothing_more() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    let subscription = "subscription { deliveryStateChanged { deliveryId } }";
    subscribed(&app, &mut socket, "subscribe", "s", subscription, 1).await;
    send(&mut socket, json!({ "id": "s", "type": "complete" })).await;
    send(
        &mut socket,
        json!({ "id": "s", "type": "subscribe", "payload": { "query": QUERY } }),
    )
    .await;
    // No `complete` comes first.
    answers_the_query(&mut socket, "next").await;
    // And nothing after it: the next message answers a ping.
    send(&mut socket, json!({ "type": "ping" })).await;
    let pong = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        use futures_util::StreamExt as _;
        loop {
            match socket.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) => {
                    break serde_json::from_str::<serde_json::Value>(&text).expect("JSON");
                }
                Some(Ok(_)) => continue,
                other => panic!("the socket ended: {other:?}"),
            }
        }
    })
    .await
    .expect("an answer to the ping");
    assert_eq!(pong["type"], "pong", "{pong}");
    assert_eq!(app.state.metrics.active_subscriptions.get(), 0);
}

/// Both protocols: a process that shuts down closes its WebSockets with 1001 Going Away,
/// so a client tells a shutdown from a dropped connection and may reconnect elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_sockets_with_going_away() {
    for (protocol, start) in [
        ("graphql-transport-ws", "subscribe"),
        ("graphql-ws", "start"),
    ] {
        let db = TestDb::new(Backend::Sqlite).await;
        let app = TestApp::spawn(&db).await;
        let admin = app.admin_token().await;
        let mut socket = initialised(&app, protocol, &admin).await;
        let watching = "subscription { deliveryStateChanged { state } }";
        subscribed(&app, &mut socket, start, "s", watching, 1).await;
        let stopping = tokio::spawn(app.stop());
        let (_, close) = until_closed(&mut socket, Duration::from_secs(10)).await;
        assert_eq!(close.map(|(code, _)| code), Some(1001), "{protocol}");
        stopping.await.expect("stopped");
    }
}

/// Both protocols: a query and a mutation whose statements wait on a lock another
/// connection holds are answered `SERVICE_UNAVAILABLE` once the database's deadline
/// passes, as over HTTP, not whenever the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_ends_at_the_database_deadline() {
    let db = TestDb::new(Backend::Postgres).await;
    let timeouts = courier::db::Timeouts {
        work: Duration::from_secs(1),
        ..Default::default()
    };
    let pool = courier::db::Db::connect_with(&db.url, 5, timeouts)
        .await
        .expect("connect");
    let app = TestApp::spawn_on(pool, |_| {}).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let holder = db.connect(1).await;
    let txn = holder.begin_write().await.expect("begin");
    sea_orm::ConnectionTrait::execute_unprepared(
        &txn,
        "LOCK TABLE endpoints, submissions IN ACCESS EXCLUSIVE MODE",
    )
    .await
    .expect("lock");
    let submit = format!(
        "mutation {{ submit(input: {{ endpointId: \"{endpoint}\", payload: {{}} }}) {{ created }} }}"
    );
    for (protocol, kind) in [
        ("graphql-transport-ws", "subscribe"),
        ("graphql-ws", "start"),
    ] {
        let mut socket = initialised(&app, protocol, &admin).await;
        let started = std::time::Instant::now();
        for (id, query) in [("read", QUERY), ("write", submit.as_str())] {
            let payload = json!({ "query": query });
            send(
                &mut socket,
                json!({ "id": id, "type": kind, "payload": payload }),
            )
            .await;
        }
        let mut answered = 0;
        while answered < 2 {
            let message = tokio::time::timeout(Duration::from_secs(4), next(&mut socket))
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("{protocol}: no answer by {:?}", started.elapsed()));
            // Refused as a whole, as over HTTP: one `error` message, no `complete`.
            assert_eq!(message["type"], "error", "{protocol}: {message}");
            let code = &message["payload"][0]["extensions"]["code"];
            assert_eq!(code, "SERVICE_UNAVAILABLE", "{protocol}: {message}");
            answered += 1;
        }
    }
    txn.rollback().await.expect("let go");
}
