//! Publishes across processes: one event per key, atomic fan-out, and no due row left on a
//! disabled endpoint.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use courier::auth::Role;
use serde_json::json;
use tokio::sync::Barrier;

use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::{Backend, Receiver, TestApp, TestDb};

use super::*;
use crate::support::endpoints::endpoint_with_types;
use crate::support::fixtures::publish;
use crate::support::fixtures::settle;

/// Sixteen publishes of one key over two processes: one event, one delivery per endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishes_with_one_key_over_two_processes_make_one_event() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = apps[0].admin_token().await;
    for n in 0..3 {
        endpoint_with_types(
            &apps[0],
            &admin,
            &format!("https://example.com/{n}"),
            Some(vec!["race"]),
        )
        .await;
    }
    let apps = Arc::new(apps);
    let barrier = Arc::new(Barrier::new(16));
    let racers: Vec<_> = (0..16)
        .map(|n| {
            let apps = apps.clone();
            let barrier = barrier.clone();
            let admin = admin.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                publish(
                    &apps[n % 2],
                    &admin,
                    "race",
                    json!({ "same": true }),
                    Some("once"),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    let mut ids = HashSet::new();
    for racer in racers {
        let body = racer.await.expect("joined");
        assert!(body["errors"].is_null(), "{body}");
        created += usize::from(body["data"]["publish"]["created"] == true);
        ids.insert(
            body["data"]["publish"]["event"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(created, 1, "exactly one publish created the event");
    assert_eq!(ids.len(), 1, "every racer got the same event");
    assert_eq!(scalar(&apps[0], "SELECT COUNT(*) FROM events").await, 1);
    assert_eq!(
        scalar(&apps[0], "SELECT COUNT(*) FROM submissions").await,
        3
    );
    assert_eq!(
        scalar(&apps[0], "SELECT COUNT(*) FROM webhook_deliveries").await,
        3
    );
}

/// A fan-out to 300 endpoints is one transaction: when `publish` answers, every row is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_300_endpoints_writes_every_row_at_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let caller = courier::auth::Identity {
        key_id: uuid::Uuid::now_v7(),
        role: Role::Admin,
        scope: Vec::new(),
        tenant: None,
        expires_at: None,
    };
    for n in 0..300 {
        let input = courier::service::endpoints::NewEndpoint {
            name: format!("e{n}"),
            url: format!("https://example.com/{n}"),
            event_types: Some(vec!["bulk".into()]),
            max_in_flight: None,
            rate_limit: None,
            tenant_id: None,
        };
        app.state
            .endpoints
            .create(&caller, input)
            .await
            .expect("created");
    }
    let body = publish(&app, &admin, "bulk", json!({ "n": 300 }), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    let event_id = body["data"]["publish"]["event"]["id"].as_str().expect("id");
    let sql = format!(
        "SELECT COUNT(*) FROM webhook_deliveries d JOIN submissions s ON s.id = d.submission_id \
         WHERE s.event_id = '{event_id}' AND d.state = 'pending'"
    );
    assert_eq!(scalar(&app, &sql).await, 300);
}

/// Publishes racing a disable (and a change of event types) on another process leave no
/// due delivery on a disabled endpoint; re-enabling delivers each one exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_racing_a_disable_leave_no_due_row() {
    const ROUNDS: usize = 20;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let publisher = TestApp::spawn(&db).await;
    let operator = TestApp::spawn(&db).await;
    let admin = publisher.admin_token().await;
    let target = endpoint_on(&publisher, &admin, &receiver, "target").await;
    let retyped = endpoint_on(&publisher, &admin, &receiver, "retyped").await;
    set_endpoint(
        &operator,
        &admin,
        &retyped,
        json!({ "eventTypes": ["race"] }),
    )
    .await;

    for round in 0..ROUNDS {
        let disable = round % 2 == 0;
        let (published, changed) = tokio::join!(
            publish(&publisher, &admin, "race", json!({ "round": round }), None),
            async {
                set_endpoint(&operator, &admin, &target, json!({ "disabled": disable })).await;
                let types = if disable {
                    json!(["other"])
                } else {
                    json!(["race"])
                };
                set_endpoint(&operator, &admin, &retyped, json!({ "eventTypes": types })).await
            },
        );
        assert_eq!(published["data"]["publish"]["created"], true, "{published}");
        assert!(changed["errors"].is_null(), "{changed}");
        if disable {
            let due = scalar(
                &publisher,
                &format!(
                    "SELECT COUNT(*) FROM webhook_deliveries WHERE endpoint_id = '{target}' \
                     AND state = 'pending' AND next_attempt_at IS NOT NULL"
                ),
            )
            .await;
            assert_eq!(
                due, 0,
                "round {round}: a due delivery on a disabled endpoint"
            );
        }
    }
    set_endpoint(&operator, &admin, &target, json!({ "disabled": true })).await;
    let total = scalar(&publisher, "SELECT COUNT(*) FROM webhook_deliveries").await;

    // Re-enable, run a worker: every delivery made is delivered, each exactly once.
    set_endpoint(&operator, &admin, &target, json!({ "disabled": false })).await;
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    receiver
        .wait_for(total as usize, Duration::from_secs(30))
        .await;
    settle([worker]).await;
    let received = receiver.received();
    let unique: HashSet<&str> = received.iter().map(|r| r.webhook_id.as_str()).collect();
    assert_eq!(unique.len(), total as usize, "every delivery arrived");
    assert_eq!(received.len(), total as usize, "none arrived twice");
}
