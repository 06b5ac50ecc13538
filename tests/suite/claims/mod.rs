//! Races 1 and 2 against the database directly: claims partition the work, skip locked rows,
//! retake expired leases exactly once, late results never overwrite a newer claim, and
//! parking holds at every edge. Shared fixtures live here; each file holds one concern.

mod claiming;
mod parked;
mod recording;

use courier::auth::{self, Identity};
use courier::db::Db;
use sea_orm::{EntityTrait, QueryOrder};
use uuid::Uuid;

use crate::support::fixtures::{events_for, outcome, record_result, LONG_LEASE};
use crate::support::{TestApp, TestDb};

/// An API-only app with `count` pending deliveries to one endpoint; returns their ids.
pub async fn seed(db: &TestDb, count: usize) -> (TestApp, Vec<Uuid>) {
    seed_spread(db, 1, count).await
}

/// An API-only app with `per_endpoint` pending deliveries to each of `endpoints` endpoints,
/// submitted round robin; returns their ids in submission order.
pub async fn seed_spread(
    db: &TestDb,
    endpoints: usize,
    per_endpoint: usize,
) -> (TestApp, Vec<Uuid>) {
    let app = TestApp::spawn(db).await;
    let token = app.admin_token().await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let mut targets = Vec::with_capacity(endpoints);
    for _ in 0..endpoints {
        let (endpoint, _) = app
            .create_endpoint(&token, "https://example.com/hook")
            .await;
        targets.push(Uuid::parse_str(&endpoint).expect("uuid"));
    }
    let mut ids = Vec::new();
    for n in 0..endpoints * per_endpoint {
        let input = courier::service::submissions::NewSubmission {
            endpoint_id: targets[n % endpoints],
            payload: serde_json::json!({ "n": n }),
            idempotency_key: None,
            event_type: None,
        };
        ids.push(
            app.state
                .submissions
                .submit(&caller, input)
                .await
                .expect("submit")
                .delivery
                .id,
        );
    }
    (app, ids)
}

/// Moves every lease an hour into the past, as if it had run out long ago (a `processing`
/// row's due time is its lease expiry, so both move): tests never wait on the wall clock
/// for a lease.
pub async fn expire_leases(pool: &Db) {
    use entity::webhook_delivery::{Column, Entity};
    use sea_orm::{ActiveModelTrait, ColumnTrait, IntoActiveModel, QueryFilter, Set};
    let held = Entity::find()
        .filter(Column::ClaimExpiresAt.is_not_null())
        .all(pool.conn())
        .await
        .expect("leased deliveries");
    assert!(!held.is_empty(), "a lease to expire");
    for row in held {
        let hour = chrono::Duration::hours(1);
        let expires = row.claim_expires_at.expect("a lease");
        let due = row.next_attempt_at.map(|due| due - hour);
        let mut row = row.into_active_model();
        row.claim_expires_at = Set(Some(expires - hour));
        row.next_attempt_at = Set(due);
        row.update(pool.conn()).await.expect("expire the lease");
    }
    // A lease that ran out is due at its expiry, which the endpoint's turn already waits
    // for; moved into the past by hand, the backstop sweep finds it.
    courier::worker::turns::sweep(pool, courier::worker::claim::DEFAULT_MAX_IN_FLIGHT)
        .await
        .expect("sweep");
}

pub async fn delivery(pool: &Db, id: Uuid) -> entity::webhook_delivery::Model {
    entity::webhook_delivery::Entity::find_by_id(id)
        .one(pool.conn())
        .await
        .expect("query")
        .expect("exists")
}

pub async fn attempts(pool: &Db, id: Uuid) -> Vec<entity::delivery_attempt::Model> {
    use sea_orm::{ColumnTrait, QueryFilter};
    entity::delivery_attempt::Entity::find()
        .filter(entity::delivery_attempt::Column::DeliveryId.eq(id))
        .order_by_asc(entity::delivery_attempt::Column::Number)
        .all(pool.conn())
        .await
        .expect("attempts")
}
