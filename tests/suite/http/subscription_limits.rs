//! What one client's subscriptions may cost everyone else: a connection runs at most 1,000
//! at once (on both protocols), and a change's `delivery` is read once, however many
//! subscriptions select it.

use courier::config::ServeArgs;
use courier::schema::MAX_SUBSCRIPTIONS_PER_CONNECTION;
use serde_json::{json, Value};

use crate::support::fixtures::{eventually, submit, table_stat};
use crate::support::websocket::{initialised, next, send, Socket};
use crate::support::{Backend, TestApp, TestDb};

const WITH_DELIVERY: &str =
    "subscription { deliveryStateChanged { deliveryId state delivery { id state } } }";

/// Starts subscription `id` on `socket` in `protocol` (`subscribe` or the legacy `start`).
async fn start(socket: &mut Socket, protocol: &str, id: &str) {
    let kind = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    send(
        socket,
        json!({ "id": id, "type": kind, "payload": { "query": WITH_DELIVERY } }),
    )
    .await;
}

/// The next message that is not a keep-alive, or a panic if the server closed.
async fn message(socket: &mut Socket) -> Value {
    next(socket).await.expect("a message, not the close")
}

/// Subscriptions past the 1,000 running on a connection are refused with an `error` of
/// `BAD_USER_INPUT`, the ones sent last however fast they come (the others keep running);
/// once one completes, another may start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_runs_at_most_a_thousand_subscriptions() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for (protocol, stop) in [("graphql-transport-ws", "complete"), ("graphql-ws", "stop")] {
        let mut socket = initialised(&app, protocol, &admin).await;
        // All sent at once, two past the most: first one id started and completed three
        // times and started again (each run counted once, however the ids repeat), then
        // the rest.
        for _ in 0..3 {
            start(&mut socket, protocol, "reused").await;
            send(&mut socket, json!({ "id": "reused", "type": stop })).await;
        }
        start(&mut socket, protocol, "reused").await;
        for n in 1..MAX_SUBSCRIPTIONS_PER_CONNECTION {
            start(&mut socket, protocol, &n.to_string()).await;
        }
        start(&mut socket, protocol, "over").await;
        start(&mut socket, protocol, "over again").await;
        for over in ["over", "over again"] {
            let mut refused = message(&mut socket).await;
            // The legacy protocol answers each stop with a `complete`.
            while refused["type"] == "complete" && refused["id"] == "reused" {
                assert_eq!(protocol, "graphql-ws", "{refused}");
                refused = message(&mut socket).await;
            }
            assert_eq!(refused["type"], "error", "{protocol}: {refused}");
            assert_eq!(refused["id"], over, "{protocol}: {refused}");
            let errors = &refused["payload"];
            assert_eq!(
                errors[0]["extensions"]["code"], "BAD_USER_INPUT",
                "{protocol}: {refused}"
            );
            assert!(
                errors[0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("at most 1000 subscriptions")),
                "{protocol}: {refused}"
            );
        }
        let running = MAX_SUBSCRIPTIONS_PER_CONNECTION as i64;
        eventually(
            &format!("{protocol}: all running"),
            std::time::Duration::from_secs(10),
            || async { app.state.metrics.active_subscriptions.get() == running },
        )
        .await;

        send(&mut socket, json!({ "id": "reused", "type": stop })).await;
        eventually(
            &format!("{protocol}: one ended"),
            std::time::Duration::from_secs(5),
            || async { app.state.metrics.active_subscriptions.get() == running - 1 },
        )
        .await;
        start(&mut socket, protocol, "again").await;
        eventually(
            &format!("{protocol}: the freed slot taken"),
            std::time::Duration::from_secs(5),
            || async { app.state.metrics.active_subscriptions.get() == running },
        )
        .await;
        // It runs: the next change reaches it, among the others.
        submit(&app, &admin, &endpoint, json!({}), None).await;
        let (mut heard_again, mut heard) = (false, 0);
        while heard < MAX_SUBSCRIPTIONS_PER_CONNECTION {
            let change = message(&mut socket).await;
            // The legacy protocol's answer to the last stop.
            if change["type"] == "complete" {
                assert_eq!(change["id"], "reused", "{protocol}: {change}");
                continue;
            }
            assert!(change["payload"]["errors"].is_null(), "{change}");
            heard_again |= change["id"] == "again";
            heard += 1;
        }
        assert!(
            heard_again,
            "{protocol}: the new subscription heard the change"
        );
        drop(socket);
        eventually(
            &format!("{protocol}: the connection's subscriptions ended"),
            std::time::Duration::from_secs(5),
            || async { app.state.metrics.active_subscriptions.get() == 0 },
        )
        .await;
    }
}

/// A change heard by 100 subscriptions that select its `delivery` reads the delivery once
/// (PostgreSQL's own count of the reads, on the app's one connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changes_delivery_is_read_once_for_all_its_subscribers() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn_on(db.connect(1).await, |config: &mut ServeArgs| {
        config.worker_concurrency = 0;
    })
    .await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let reads = "COALESCE(idx_scan, 0) + COALESCE(seq_scan, 0)";
    // What a submission reads of the table by itself, heard by nobody.
    let before = table_stat(&app.state.db, "webhook_deliveries", reads).await;
    submit(&app, &admin, &endpoint, json!({}), None).await;
    let unheard = table_stat(&app.state.db, "webhook_deliveries", reads).await - before;

    let mut sockets = Vec::new();
    for _ in 0..2 {
        let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
        for n in 0..50 {
            start(&mut socket, "graphql-transport-ws", &n.to_string()).await;
        }
        sockets.push(socket);
    }
    eventually(
        "all 100 running",
        std::time::Duration::from_secs(10),
        || async { app.state.metrics.active_subscriptions.get() == 100 },
    )
    .await;
    let before = table_stat(&app.state.db, "webhook_deliveries", reads).await;
    let submitted = submit(&app, &admin, &endpoint, json!({}), None).await;
    let id = submitted["data"]["submit"]["delivery"]["id"].clone();
    for socket in &mut sockets {
        for _ in 0..50 {
            let change = message(socket).await;
            let heard = &change["payload"]["data"]["deliveryStateChanged"];
            assert_eq!(heard["delivery"]["id"], id, "{change}");
            assert_eq!(heard["delivery"]["state"], "PENDING", "{change}");
        }
    }
    let heard = table_stat(&app.state.db, "webhook_deliveries", reads).await - before;
    assert!(
        heard <= unheard + 1,
        "100 subscribers read the delivery {} times",
        heard - unheard
    );
}
