//! `Endpoint.health`: the last hour's attempts of an endpoint, their success rate and
//! latency percentiles, summed from per-minute rows the recording writes; minutes that left
//! the hour neither count nor stay.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{count, endpoint_on, eventually, failing_at_once, rows, submit};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

const HEALTH: &str = "query($id: ID!) { endpoint(id: $id) { health { windowSeconds attempts succeeded successRate latencyP50Ms latencyP90Ms latencyP99Ms } } }";

async fn health_shows_the_last_hour(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    // Every fourth request fails; the second of every four takes 300 ms.
    let calls = AtomicUsize::new(0);
    let receiver = Receiver::start(move |_| {
        let call = calls.fetch_add(1, Ordering::SeqCst);
        Reply {
            delay: Duration::from_millis(if call % 4 == 1 { 300 } else { 0 }),
            ..Reply::status(if call % 4 == 3 { 500 } else { 200 })
        }
    })
    .await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "watched").await;
    let quiet = app.graphql(&admin, HEALTH, json!({ "id": endpoint })).await;
    let health = &quiet["data"]["endpoint"]["health"];
    assert_eq!(health["attempts"], 0, "{quiet}");
    assert_eq!(health["successRate"], json!(null));
    assert_eq!(health["latencyP50Ms"], json!(null));
    assert_eq!(health["windowSeconds"], 3600);

    for n in 0..8 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    let settled =
        "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state IN ('delivered', 'failed')";
    eventually("all eight settle", Duration::from_secs(20), || async {
        count(&app.state.db, settled, vec![]).await == 8
    })
    .await;
    // A minute from two hours ago: outside the window, not counted.
    let old = courier::db::now() - chrono::Duration::hours(2);
    let endpoint_id: uuid::Uuid = endpoint.parse().expect("uuid");
    let mut values = vec![endpoint_id.into(), old.into()];
    values.extend((0..12).map(|_| sea_orm::Value::from(50i64)));
    rows(
        &app.state.db,
        "INSERT INTO endpoint_health_minutes (endpoint_id, minute, shard, attempts, succeeded, \
         slowest_ms, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10) \
         VALUES ($1, $2, 0, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $3, $3)",
        values,
    )
    .await;
    let body = app.graphql(&admin, HEALTH, json!({ "id": endpoint })).await;
    let health = &body["data"]["endpoint"]["health"];
    assert_eq!(health["attempts"], 8, "{body}");
    assert_eq!(health["succeeded"], 6);
    assert_eq!(health["successRate"], 0.75);
    // Six of eight answered at once (within 10 ms, or 25 on a busy machine), two after 300 ms.
    let p50 = health["latencyP50Ms"].as_i64().expect("p50");
    assert!(p50 <= 50, "{body}");
    assert_eq!(
        health["latencyP99Ms"], 500,
        "the 300 ms answers' bucket: {body}"
    );

    courier::service::recent_health::prune(&app.state.db)
        .await
        .expect("prune");
    let left = count(
        &app.state.db,
        "SELECT COUNT(*) AS n FROM endpoint_health_minutes WHERE minute < $1",
        vec![(courier::db::now() - chrono::Duration::minutes(90)).into()],
    )
    .await;
    assert_eq!(left, 0, "the minute that left the window is pruned");
    let body = app.graphql(&admin, HEALTH, json!({ "id": endpoint })).await;
    assert_eq!(body["data"]["endpoint"]["health"]["attempts"], 8, "{body}");
}

on_both_backends!(health_shows_the_last_hour);
