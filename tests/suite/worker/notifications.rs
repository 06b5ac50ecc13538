//! Start-up and state-change traffic on PostgreSQL: a process reports ready with its pool
//! open and `LISTEN` holding, and a transaction's changes travel in one notification that
//! every process's listener splits back into the changes, in order.

use std::sync::Arc;
use std::time::Duration;

use courier::auth::{self, Identity};
use courier::bus::{ChangeBus, ChangeMessage, StateChange, CHANGES_CHANNEL};
use courier::service::submissions::NewSubmission;
use courier::worker::claim::claim_due;
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use uuid::Uuid;

use crate::support::{Backend, TestApp, TestDb};

/// `count` pending deliveries submitted through the service of an API-only app.
async fn submitted(app: &TestApp, count: usize) -> Vec<Uuid> {
    let token = app.admin_token().await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let (endpoint, _) = app
        .create_endpoint(&token, "https://example.com/hook")
        .await;
    let endpoint_id = Uuid::parse_str(&endpoint).expect("uuid");
    // Room for every delivery in one claim (the default cap is 32 in flight).
    let raised = app
        .graphql(
            &token,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {maxInFlight: 100}) { endpoint { maxInFlight } } }",
            serde_json::json!({ "id": endpoint }),
        )
        .await;
    assert_eq!(
        raised["data"]["updateEndpoint"]["endpoint"]["maxInFlight"], 100,
        "{raised}"
    );
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let input = NewSubmission {
            endpoint_id,
            payload: serde_json::json!({ "n": n }),
            idempotency_key: None,
            event_type: None,
            ordering_key: None,
        };
        let outcome = app.state.submissions.submit(&caller, input).await;
        ids.push(outcome.expect("submit").delivery.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_many_deliveries_is_one_notification_split_for_every_subscriber() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let ids = submitted(&app, 40).await;
    assert!(app.state.bus.wait_live(Duration::from_secs(5)).await);
    let mut subscriber = app.state.bus.subscribe();
    let mut raw = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("a listener of its own");
    raw.listen(CHANGES_CHANNEL).await.expect("LISTEN");

    // Another process's worker claims them all in one transaction.
    let pool = db.connect(2).await;
    let events = ChangeBus::new(
        pool.backend(),
        Arc::new(courier::metrics::Metrics::default()),
    );
    let claims = claim_due(&pool, &events, 40, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claims.len(), 40);
    let claimed: Vec<Uuid> = claims.iter().map(|c| c.delivery_id).collect();

    let (mut notifications, mut changes) = (0, Vec::new());
    while changes.len() < claimed.len() {
        let notification = tokio::time::timeout(Duration::from_secs(5), raw.recv())
            .await
            .expect("the changes were published")
            .expect("a notification");
        notifications += 1;
        changes.extend(StateChange::from_wire(notification.payload()).expect("well formed"));
    }
    assert_eq!(notifications, 1, "one transaction, one notification");
    assert_eq!(
        changes.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        claimed,
        "every change, in the transaction's order"
    );
    assert!(changes.iter().all(|c| c.state == DeliveryState::Processing
        && c.previous_state == Some(DeliveryState::Pending)));

    // The app's own listener hands each change to its subscribers, one message per change.
    let mut seen = Vec::new();
    while seen.len() < claimed.len() {
        let message = tokio::time::timeout(Duration::from_secs(5), subscriber.recv())
            .await
            .expect("the subscriber hears every change")
            .expect("no lag");
        if let ChangeMessage::Change(change) = message {
            if change.state == DeliveryState::Processing {
                seen.push(change.delivery_id);
            }
        }
    }
    assert_eq!(seen, claimed);
    let mut all = ids.clone();
    all.sort();
    seen.sort();
    assert_eq!(seen, all, "the claim took every submitted delivery");
    app.stop().await;
    pool.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reports_ready_with_its_pool_open_and_listening() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool_size = 5;
    let app = TestApp::spawn_on(db.connect(pool_size).await, |_| {}).await;
    // The first answer comes once the process serves HTTP, i.e. once it is ready.
    let health = app
        .request(reqwest::Method::GET, "/healthz")
        .send()
        .await
        .expect("answered");
    assert!(health.status().is_success());
    assert!(
        app.state.bus.wait_live(Duration::from_millis(1)).await,
        "LISTEN holds before the first request is served"
    );
    let observer = db.connect(1).await;
    let row = observer
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        ))
        .await
        .expect("activity")
        .expect("a row");
    let open: i64 = row.try_get("", "n").expect("n");
    assert!(
        open > i64::from(pool_size),
        "{open} connections open at ready: the whole pool of {pool_size} and the listener"
    );
    observer.close().await.expect("close");
    app.stop().await;
}
