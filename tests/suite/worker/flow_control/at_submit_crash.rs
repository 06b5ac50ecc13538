//! A claim at submit survives its process: the real binary, killed while the request of a
//! delivery it claimed at submit is on its way, loses nothing.

use std::time::Duration;

use serde_json::json;

use crate::support::fixtures::{delivery, delivery_id, eventually, SUBMIT};
use crate::support::process::{admin_token, Served};
use crate::support::receiver::slow_first_attempt;
use crate::support::{Backend, Receiver, TestDb};

/// The real binary, killed while the request of a delivery it claimed at submit is on its
/// way: nothing is lost. Another process takes the delivery again when the lease runs out
/// and delivers it, with the same webhook id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_after_claiming_at_submit_loses_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(slow_first_attempt(Duration::from_secs(60))).await;
    let settings = [
        ("COURIER_LEASE_SECS", "2"),
        ("COURIER_REQUEST_TIMEOUT_MS", "30000"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
    ];
    // As above: the first process's loop runs only when woken, and is idle again before
    // the submission.
    let mut quiet = settings;
    quiet[2] = ("COURIER_POLL_INTERVAL_MS", "10000");
    let first = Served::start(&db.url, &quiet);
    let token = admin_token(&db).await;
    let endpoint = first.create_endpoint(&token, &receiver, "crash", &[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = first
        .graphql(
            &token,
            SUBMIT,
            json!({ "input": { "endpointId": endpoint, "payload": { "n": 1 } } }),
        )
        .await;
    assert!(body["errors"].is_null(), "{body}");
    let id: uuid::Uuid = delivery_id(&body).parse().expect("a delivery id");
    eventually(
        "the request is on its way",
        Duration::from_secs(10),
        || async { receiver.in_flight("crash") == 1 },
    )
    .await;
    let metrics = reqwest::get(format!("http://{}/metrics", first.addr))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("courier_delivery_claims_at_submit_total 1"),
        "claimed at submit: {metrics}"
    );
    drop(first);
    let second = Served::start(&db.url, &settings);
    let pool = courier::db::Db::connect(&db.url, 2).await.expect("a pool");
    eventually("delivered", Duration::from_secs(20), || async {
        delivery(&pool, id).await.state == entity::webhook_delivery::DeliveryState::Delivered
    })
    .await;
    let received = receiver.received();
    assert_eq!(received.len(), 2, "sent again after the crash");
    assert_eq!(received[0].webhook_id, received[1].webhook_id);
    assert!(received.iter().all(|r| r.verified));
    drop(second);
}
