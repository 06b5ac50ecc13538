//! End to end: the worker signs, sends, retries, fences and records, against an in-process
//! receiver that checks every signature with the official Standard Webhooks library.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::endpoint_on;
use crate::support::fixtures::submit;
use crate::support::fixtures::wait_for_state;
use crate::support::fixtures::{quick_worker, settle};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

fn numbers_and_statuses(delivery: &Value) -> Vec<(i64, Option<i64>)> {
    delivery["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| {
            (
                a["number"].as_i64().unwrap_or_default(),
                a["statusCode"].as_i64(),
            )
        })
        .collect()
}

fn at(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .expect("a timestamp")
        .with_timezone(&Utc)
}

async fn a_submission_is_delivered_signed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "orders").await;
    let payload = json!({ "order": 42, "items": [{ "sku": "a", "qty": 2 }], "note": "é" });
    let submitted = submit(&app, &admin, &endpoint, payload.clone(), None).await;
    let id = delivery_id(&submitted);

    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    assert_eq!(numbers_and_statuses(&delivery), vec![(1, Some(200))]);
    assert_eq!(delivery["cycleAttempts"], 1);
    assert!(delivery["nextAttemptAt"].is_null());
    settle([app]).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "sent once");
    assert!(
        received[0].verified,
        "the official verifier accepts the signature"
    );
    assert_eq!(received[0].webhook_id, id, "webhook-id is the delivery id");
    assert_eq!(received[0].body, payload);
    assert_eq!(received[0].content_type, "application/json");
}

async fn failures_are_retried_until_the_endpoint_accepts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|n| Reply::status(if n <= 2 { 500 } else { 200 })).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "flaky").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "retry": true }), None).await);

    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    assert_eq!(
        numbers_and_statuses(&delivery),
        vec![(1, Some(500)), (2, Some(500)), (3, Some(200))]
    );
    assert_eq!(delivery["cycleAttempts"], 3);
    assert!(delivery["attempts"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .contains("500"));
    settle([app]).await;
    let received = receiver.received();
    assert_eq!(received.len(), 3, "no attempt after the delivery");
    assert!(
        received.iter().all(|r| r.verified && r.webhook_id == id),
        "same webhook-id on every retry, always signed"
    );
}

async fn a_delivery_fails_after_its_attempts_run_out(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(503)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "down").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);

    let delivery = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    assert_eq!(
        numbers_and_statuses(&delivery),
        vec![(1, Some(503)), (2, Some(503)), (3, Some(503))]
    );
    assert_eq!(delivery["cycleAttempts"], 3);
    assert!(
        delivery["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("503"),
        "{delivery}"
    );
    settle([app]).await;
    assert_eq!(
        receiver.received().len(),
        3,
        "no attempt after the cycle failed"
    );
}

async fn connection_errors_and_redirects_are_failed_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = app.admin_token().await;

    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let (refused, _) = app
        .create_endpoint(&admin, &format!("http://127.0.0.1:{closed_port}/nobody"))
        .await;
    let id = delivery_id(&submit(&app, &admin, &refused, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    let attempt = &delivery["attempts"][0];
    assert!(attempt["statusCode"].is_null());
    assert!(
        attempt["error"]
            .as_str()
            .unwrap_or_default()
            .contains("connect"),
        "{attempt}"
    );

    let receiver = Receiver::start(|_| Reply {
        body: Default::default(),
        status: 302,
        headers: vec![("location", "/elsewhere".to_owned())],
        delay: Duration::ZERO,
    })
    .await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "moved").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    assert_eq!(numbers_and_statuses(&delivery), vec![(1, Some(302))]);
    assert!(
        delivery["attempts"][0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("redirect"),
        "{delivery}"
    );
    assert!(
        receiver.received().iter().all(|r| r.path == "moved"),
        "the redirect was not followed"
    );
}

on_both_backends!(
    a_submission_is_delivered_signed,
    failures_are_retried_until_the_endpoint_accepts,
    a_delivery_fails_after_its_attempts_run_out,
    connection_errors_and_redirects_are_failed_attempts,
);

/// Attempts are spaced by the backoff (base x 2^(n-1), at most 20% shorter), and a
/// `Retry-After` on 429 stretches the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_follow_the_backoff_and_retry_after() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.retry_base_ms = Some(200);
    })
    .await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "backoff").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    let attempts = delivery["attempts"].as_array().expect("attempts");
    let gap = |n: usize| at(&attempts[n]["startedAt"]) - at(&attempts[n - 1]["finishedAt"]);
    assert!(
        gap(1) >= chrono::Duration::milliseconds(160),
        "first retry after ~200ms: {:?}",
        gap(1)
    );
    assert!(
        gap(2) >= chrono::Duration::milliseconds(320),
        "second retry after ~400ms: {:?}",
        gap(2)
    );

    let throttled = Receiver::start(|n| {
        if n == 1 {
            Reply {
                body: Default::default(),
                status: 429,
                headers: vec![("retry-after", "1".to_owned())],
                delay: Duration::ZERO,
            }
        } else {
            Reply::status(200)
        }
    })
    .await;
    let endpoint = endpoint_on(&app, &admin, &throttled, "throttled").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let attempts = delivery["attempts"].as_array().expect("attempts");
    let waited = at(&attempts[1]["startedAt"]) - at(&attempts[0]["finishedAt"]);
    assert!(
        waited >= chrono::Duration::milliseconds(990),
        "Retry-After: 1 was honoured: {waited:?}"
    );
}

/// Three instances with workers on one database: every submission delivered, none twice.
async fn three_instances_deliver_every_submission_exactly_once(backend: Backend) {
    const SUBMISSIONS: usize = 300;
    let db = TestDb::new(backend).await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(TestApp::spawn_with(&db, quick_worker).await);
    }
    let admin = apps[0].admin_token().await;
    let receiver = Arc::new(Receiver::accepting().await);
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "bulk").await;

    let submits = (0..SUBMISSIONS).map(|n| {
        let (app, admin, endpoint) = (&apps[n % 3], admin.clone(), endpoint.clone());
        async move { submit(app, &admin, &endpoint, json!({ "n": n }), None).await }
    });
    let submitted = futures_util::future::join_all(submits).await;
    let refused: Vec<&Value> = submitted
        .iter()
        .filter(|s| s["data"]["submit"]["created"] != true)
        .collect();
    assert!(refused.is_empty(), "{refused:?}");

    receiver
        .wait_for(SUBMISSIONS, Duration::from_secs(60))
        .await;
    let counter = TestApp::spawn(&db).await;
    settle(apps).await;
    let received = receiver.received();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for request in &received {
        *per_id.entry(request.webhook_id.as_str()).or_default() += 1;
        assert!(request.verified);
    }
    assert_eq!(per_id.len(), SUBMISSIONS, "every delivery arrived");
    assert!(per_id.values().all(|&n| n == 1), "none was sent twice");

    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    let delivered = entity::webhook_delivery::Entity::find()
        .filter(entity::webhook_delivery::Column::State.eq("delivered"))
        .count(counter.state.db.conn())
        .await
        .expect("count");
    assert_eq!(delivered, SUBMISSIONS as u64);
}

/// With private destinations refused, a worker never connects to loopback, by name or by address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_destinations_are_never_contacted_when_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    // Endpoints saved while the flag was on...
    let permissive = TestApp::spawn(&db).await;
    let admin = permissive.admin_token().await;
    let receiver = Receiver::accepting().await;
    let by_address = endpoint_on(&permissive, &admin, &receiver, "address").await;
    let port = receiver
        .url("x")
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .unwrap_or_default()
        .to_owned();
    let (by_name, _) = permissive
        .create_endpoint(&admin, &format!("http://localhost:{port}/name"))
        .await;
    // ...are delivered by a worker running with it off.
    let strict = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.allow_private_destinations = false;
    })
    .await;
    for endpoint in [by_address, by_name] {
        let id = delivery_id(&submit(&strict, &admin, &endpoint, json!({}), None).await);
        let delivery =
            wait_for_state(&strict, &admin, &id, "FAILED", Duration::from_secs(10)).await;
        let error = delivery["attempts"][0]["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains("destination refused"), "{error}");
    }
    assert!(
        receiver.received().is_empty(),
        "no request reached the private address"
    );
}

crate::on_postgres!(three_instances_deliver_every_submission_exactly_once,);
