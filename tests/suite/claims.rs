//! Races 1 and 2 against the database directly: claims partition the work, skip locked rows,
//! retake expired leases exactly once, and late results never overwrite a newer claim.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use courier::auth::{self, Identity};
use courier::db::Db;
use courier::worker::claim::{claim_due, Claim};
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, EntityTrait, QueryOrder, Statement, TransactionTrait};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::on_every_backend;
use crate::support::{Backend, TestApp, TestDb};

const LONG_LEASE: Duration = Duration::from_secs(60);

/// An API-only app with `count` pending deliveries; returns their ids.
async fn seed(db: &TestDb, count: usize) -> (TestApp, Vec<Uuid>) {
    let app = TestApp::spawn(db).await;
    let token = app.admin_token().await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let (endpoint, _) = app
        .create_endpoint(&token, "https://example.com/hook")
        .await;
    let endpoint = Uuid::parse_str(&endpoint).expect("uuid");
    let mut ids = Vec::new();
    for n in 0..count {
        let input = courier::service::submissions::NewSubmission {
            endpoint_id: endpoint,
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
async fn expire_leases(pool: &Db) {
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
}

/// A publisher for changes made through `pool` (nobody subscribes in these tests).
fn events_for(pool: &Db) -> courier::events::Events {
    courier::events::Events::new(
        pool.backend(),
        Arc::new(courier::metrics::Metrics::default()),
    )
}

fn outcome(succeeded: bool) -> AttemptOutcome {
    AttemptOutcome {
        status: Some(if succeeded { 200 } else { 500 }),
        error: (!succeeded).then(|| "HTTP 500".to_owned()),
        retry_after: None,
        duration: Duration::from_millis(3),
        kind: if succeeded {
            OutcomeKind::Success
        } else {
            OutcomeKind::HttpStatus
        },
    }
}

async fn record_result(
    pool: &Db,
    claim: &Claim,
    succeeded: bool,
) -> courier::worker::record::Recorded {
    let outcome = outcome(succeeded);
    let step = if succeeded {
        NextStep::Delivered
    } else {
        NextStep::RetryAfter(Duration::from_secs(1))
    };
    let now = courier::db::now();
    record(
        pool,
        &events_for(pool),
        &FinishedAttempt {
            claim: claim.clone(),
            outcome,
            step,
            started_at: now,
            finished_at: now,
        },
    )
    .await
    .expect("record")
}

async fn delivery(pool: &Db, id: Uuid) -> entity::webhook_delivery::Model {
    entity::webhook_delivery::Entity::find_by_id(id)
        .one(pool.conn())
        .await
        .expect("query")
        .expect("exists")
}

async fn attempts(pool: &Db, id: Uuid) -> Vec<entity::delivery_attempt::Model> {
    use sea_orm::{ColumnTrait, QueryFilter};
    entity::delivery_attempt::Entity::find()
        .filter(entity::delivery_attempt::Column::DeliveryId.eq(id))
        .order_by_asc(entity::delivery_attempt::Column::Number)
        .all(pool.conn())
        .await
        .expect("attempts")
}

/// Six sessions with their own pools claim at once: every row goes to exactly one.
async fn concurrent_claims_partition_the_work(backend: Backend) {
    const SESSIONS: usize = 6;
    const LIMIT: u32 = 15;
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 60).await;
    let mut pools = Vec::new();
    for _ in 0..SESSIONS {
        pools.push(db.connect(1).await);
    }
    let barrier = Arc::new(Barrier::new(SESSIONS));
    let claims = futures_util::future::join_all(pools.iter().map(|pool| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            claim_due(pool, &events_for(pool), LIMIT, LONG_LEASE)
                .await
                .expect("claim")
        }
    }))
    .await;
    let mut seen = HashSet::new();
    for batch in &claims {
        assert!(
            batch.len() <= LIMIT as usize,
            "a claim takes at most its limit"
        );
        for claim in batch {
            assert!(
                seen.insert(claim.delivery_id),
                "{} was claimed twice",
                claim.delivery_id
            );
            assert_eq!(claim.previous_state, DeliveryState::Pending);
        }
    }
    assert_eq!(
        seen.len(),
        ids.len(),
        "together the sessions claimed every due row"
    );
    assert!(
        claim_due(&pools[0], &events_for(&pools[0]), 10, LONG_LEASE)
            .await
            .expect("claim")
            .is_empty(),
        "nothing is due twice"
    );
    let stored = delivery(&pools[0], ids[0]).await;
    assert_eq!(stored.state, DeliveryState::Processing);
    assert!(stored.claim_token.is_some() && stored.claim_expires_at.is_some());
}

/// A lease that ran out is retaken by exactly one of two racing workers, with a new token.
async fn an_expired_lease_is_reclaimed_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 1).await;
    let (first, second, third) = (
        db.connect(1).await,
        db.connect(1).await,
        db.connect(1).await,
    );
    let original = claim_due(&first, &events_for(&first), 1, LONG_LEASE)
        .await
        .expect("claim")
        .pop()
        .expect("claimed");
    assert!(
        claim_due(&second, &events_for(&second), 1, LONG_LEASE)
            .await
            .expect("claim")
            .is_empty(),
        "a live lease is not retaken"
    );
    expire_leases(&first).await;

    let barrier = Arc::new(Barrier::new(2));
    let racers = [&second, &third].map(|pool| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            claim_due(pool, &events_for(pool), 1, LONG_LEASE)
                .await
                .expect("claim")
        }
    });
    let results = futures_util::future::join_all(racers).await;
    let winners: Vec<&Claim> = results.iter().flatten().collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one racer retakes the lease: {results:?}"
    );
    assert_eq!(winners[0].delivery_id, ids[0]);
    assert_eq!(winners[0].previous_state, DeliveryState::Processing);
    assert_ne!(
        winners[0].claim_token, original.claim_token,
        "a new claim has a new token"
    );
}

/// Two independent connections holding two claims on one delivery: the first claim's lease
/// ran out and the second retook it.
struct Rivals {
    old_pool: Db,
    new_pool: Db,
    old: Claim,
    new: Claim,
}

/// Claims the only due delivery, expires its lease, and retakes it through another connection.
async fn rivals(db: &TestDb) -> Rivals {
    let (old_pool, new_pool) = (db.connect(1).await, db.connect(1).await);
    let old = claim_due(&old_pool, &events_for(&old_pool), 1, LONG_LEASE)
        .await
        .expect("claim")
        .pop()
        .expect("claimed");
    expire_leases(&old_pool).await;
    let new = claim_due(&new_pool, &events_for(&new_pool), 1, LONG_LEASE)
        .await
        .expect("claim")
        .pop()
        .expect("reclaimed");
    Rivals {
        old_pool,
        new_pool,
        old,
        new,
    }
}

/// Two claims on one row (the first expired, the second live); the late result never wins.
async fn late_results_are_fenced_in_either_order(backend: Backend) {
    for late_first in [true, false] {
        let db = TestDb::new(backend).await;
        let (_app, ids) = seed(&db, 1).await;
        let Rivals {
            old_pool,
            new_pool,
            old,
            new,
        } = rivals(&db).await;

        if late_first {
            let late = record_result(&old_pool, &old, true).await;
            assert_eq!(late.new_state, None, "the superseded claim changes nothing");
            let stored = delivery(&new_pool, ids[0]).await;
            assert_eq!(
                (stored.state, stored.claim_token),
                (DeliveryState::Processing, Some(new.claim_token))
            );
            let current = record_result(&new_pool, &new, false).await;
            assert_eq!(current.new_state, Some(DeliveryState::Pending));
        } else {
            let current = record_result(&new_pool, &new, true).await;
            assert_eq!(current.new_state, Some(DeliveryState::Delivered));
            let late = record_result(&old_pool, &old, false).await;
            assert_eq!(
                late.new_state, None,
                "a late failure cannot undo the delivery"
            );
            assert_eq!(
                delivery(&old_pool, ids[0]).await.state,
                DeliveryState::Delivered
            );
        }

        let recorded = attempts(&new_pool, ids[0]).await;
        assert_eq!(recorded.len(), 2, "both attempts are recorded");
        assert_eq!(
            recorded.iter().map(|a| a.number).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let by_token = |token: Uuid| {
            recorded
                .iter()
                .find(|a| a.claim_token == token)
                .expect("attempt")
        };
        assert!(
            by_token(old.claim_token).superseded,
            "the late attempt is marked superseded"
        );
        assert!(!by_token(new.claim_token).superseded);
        assert_eq!(
            delivery(&new_pool, ids[0]).await.cycle_attempts,
            1,
            "only the live claim counted"
        );
    }
}

/// Both claims recording at the same instant still get distinct lifetime numbers.
async fn simultaneous_results_get_distinct_numbers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 1).await;
    let Rivals {
        old_pool,
        new_pool,
        old,
        new,
    } = rivals(&db).await;
    let barrier = Arc::new(Barrier::new(2));
    let (b1, b2) = (barrier.clone(), barrier);
    let (late, current) = tokio::join!(
        async {
            b1.wait().await;
            record_result(&old_pool, &old, true).await
        },
        async {
            b2.wait().await;
            record_result(&new_pool, &new, true).await
        },
    );
    assert_eq!(late.new_state, None);
    assert_eq!(current.new_state, Some(DeliveryState::Delivered));
    let mut numbers = vec![late.number, current.number];
    numbers.sort();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(attempts(&new_pool, ids[0]).await.len(), 2);
}

/// Recording the same claim's result twice (a retry after a lost acknowledgement) adds nothing.
async fn recording_is_idempotent_per_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 1).await;
    let pool = db.connect(1).await;
    let claim = claim_due(&pool, &events_for(&pool), 1, LONG_LEASE)
        .await
        .expect("claim")
        .pop()
        .expect("claimed");
    let first = record_result(&pool, &claim, true).await;
    let again = record_result(&pool, &claim, true).await;
    assert_eq!(first, again);
    assert_eq!(first.new_state, Some(DeliveryState::Delivered));
    assert_eq!(attempts(&pool, ids[0]).await.len(), 1);
}

/// One batch records many outcomes, each fenced by its own token: two claims on one delivery
/// (the older superseded) and a third delivery, in one call.
async fn a_batch_records_each_outcome_under_its_own_fence(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 2).await;
    let pool = db.connect(1).await;
    let events = events_for(&pool);
    let mut first = claim_due(&pool, &events, 2, LONG_LEASE)
        .await
        .expect("claim");
    first.sort_by_key(|c| c.delivery_id);
    expire_leases(&pool).await;
    let mut second = claim_due(&pool, &events, 1, LONG_LEASE)
        .await
        .expect("reclaim");
    let newer = second.pop().expect("one reclaimed");
    let older = first
        .iter()
        .find(|c| c.delivery_id == newer.delivery_id)
        .expect("same delivery")
        .clone();
    let other = first
        .iter()
        .find(|c| c.delivery_id != newer.delivery_id)
        .expect("the other")
        .clone();
    let now = courier::db::now();
    let finished = |claim: &Claim, ok: bool| FinishedAttempt {
        claim: claim.clone(),
        outcome: outcome(ok),
        step: if ok {
            NextStep::Delivered
        } else {
            NextStep::Failed
        },
        started_at: now,
        finished_at: now,
    };
    let batch = [
        finished(&older, true),
        finished(&other, false),
        finished(&newer, true),
    ];
    let recorded = courier::worker::record::record_batch(&pool, &events, &batch)
        .await
        .expect("record");
    assert_eq!(
        recorded[0].new_state, None,
        "the older claim was superseded"
    );
    assert_eq!(
        recorded[1].new_state,
        Some(DeliveryState::Failed),
        "an expired claim that nobody retook still holds"
    );
    assert_eq!(recorded[2].new_state, Some(DeliveryState::Delivered));
    assert_eq!(
        delivery(&pool, newer.delivery_id).await.state,
        DeliveryState::Delivered
    );
    let numbers: Vec<(i32, bool)> = attempts(&pool, newer.delivery_id)
        .await
        .iter()
        .map(|a| (a.number, a.superseded))
        .collect();
    assert_eq!(numbers, vec![(1, true), (2, false)]);
    assert_eq!(
        delivery(&pool, other.delivery_id).await.state,
        DeliveryState::Failed
    );
    assert_eq!(ids.len(), 2);
}

/// Parking holds at the edges: a claim given back after its endpoint was disabled is
/// parked, not due; an expired lease of a disabled endpoint is parked by the next claim
/// instead of staying due for every claim to scan past.
async fn released_and_expired_claims_of_a_disabled_endpoint_are_parked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 2).await;
    let pool = &app.state.db;
    let events = events_for(pool);
    let claims = claim_due(pool, &events, 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 2);
    let admin = app.admin_token().await;
    let endpoint = delivery(pool, ids[0]).await.endpoint_id.to_string();
    let body = app
        .graphql(
            &admin,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { disabled } } }",
            serde_json::json!({ "id": endpoint }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{body}"
    );

    courier::worker::claim::release(pool, &events, &claims[..1])
        .await
        .expect("release");
    let released = delivery(pool, claims[0].delivery_id).await;
    assert_eq!(
        (
            released.state,
            released.next_attempt_at,
            released.claim_token
        ),
        (DeliveryState::Pending, None, None),
        "a released claim of a disabled endpoint is parked"
    );

    // The other worker died: its lease ran out an hour ago.
    let past = courier::db::now() - chrono::Duration::hours(1);
    pool.conn()
        .execute_raw(Statement::from_sql_and_values(
            pool.backend(),
            "UPDATE webhook_deliveries SET next_attempt_at = $1, claim_expires_at = $1 WHERE id = $2",
            [past.into(), claims[1].delivery_id.into()],
        ))
        .await
        .expect("expire the lease");
    assert!(claim_due(pool, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());
    let expired = delivery(pool, claims[1].delivery_id).await;
    assert_eq!(
        (expired.state, expired.next_attempt_at, expired.claim_token),
        (DeliveryState::Pending, None, None),
        "an expired lease of a disabled endpoint is parked"
    );
    assert_eq!(app.state.deliveries.due_count().await.expect("due"), 0);
}

on_every_backend!(
    released_and_expired_claims_of_a_disabled_endpoint_are_parked,
    disabling_an_endpoint_parks_its_deliveries,
    a_batch_records_each_outcome_under_its_own_fence,
    recording_is_idempotent_per_claim,
    concurrent_claims_partition_the_work,
    an_expired_lease_is_reclaimed_exactly_once,
    late_results_are_fenced_in_either_order,
    simultaneous_results_get_distinct_numbers,
);

/// A row another session has locked is skipped at once, not waited on.
async fn locked_rows_are_skipped_not_waited_on(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, 2).await;
    let holder = db.connect(1).await;
    let txn = holder.conn().begin().await.expect("begin");
    txn.execute_raw(Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        "SELECT id FROM webhook_deliveries WHERE id = $1 FOR UPDATE",
        [ids[0].into()],
    ))
    .await
    .expect("lock one row");

    let claimer = db.connect(1).await;
    let claimed = tokio::time::timeout(
        Duration::from_secs(2),
        claim_due(&claimer, &events_for(&claimer), 10, LONG_LEASE),
    )
    .await
    .expect("the claim returns promptly while the lock is held")
    .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        vec![ids[1]],
        "only the unlocked row"
    );

    txn.commit().await.expect("release");
    let claimed = claim_due(&claimer, &events_for(&claimer), 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        vec![ids[0]],
        "claimable once released"
    );
}

/// Deliveries of a disabled endpoint are never claimed, even when only the flag changed:
/// the claim parks them instead (out of the due index, so no claim scans past them again),
/// and re-enabling the endpoint through the API makes them due.
async fn deliveries_of_disabled_endpoints_are_not_claimed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 3).await;
    let events = events_for(&app.state.db);
    let conn = app.state.db.conn();
    conn.execute_unprepared("UPDATE endpoints SET disabled = true")
        .await
        .expect("disable");
    assert!(claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());
    for id in &ids {
        let parked = delivery(&app.state.db, *id).await;
        assert_eq!(
            (parked.state, parked.next_attempt_at),
            (DeliveryState::Pending, None)
        );
    }
    let endpoint = delivery(&app.state.db, ids[0]).await.endpoint_id;
    let admin = app.admin_token().await;
    let body = app
        .graphql(
            &admin,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: false}) { endpoint { disabled } } }",
            serde_json::json!({ "id": endpoint.to_string() }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["disabled"], false,
        "{body}"
    );
    assert_eq!(
        claim_due(&app.state.db, &events, 10, LONG_LEASE)
            .await
            .expect("claim")
            .len(),
        3
    );
}

/// Disabling an endpoint through the API parks its pending deliveries (no due time, out
/// of the claim index); re-enabling makes them due again.
async fn disabling_an_endpoint_parks_its_deliveries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 3).await;
    let admin = app.admin_token().await;
    let endpoint = delivery(&app.state.db, ids[0])
        .await
        .endpoint_id
        .to_string();
    let toggle = "mutation($id: ID!, $off: Boolean!) { updateEndpoint(id: $id, input: {disabled: $off}) { endpoint { disabled } } }";
    let read = "query($id: ID!) { delivery(id: $id) { state nextAttemptAt } }";

    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": true }),
    )
    .await;
    for id in &ids {
        let parked = delivery(&app.state.db, *id).await;
        assert_eq!(
            (parked.state, parked.next_attempt_at),
            (DeliveryState::Pending, None)
        );
    }
    let body = app
        .graphql(
            &admin,
            read,
            serde_json::json!({ "id": ids[0].to_string() }),
        )
        .await;
    assert!(
        body["data"]["delivery"]["nextAttemptAt"].is_null(),
        "{body}"
    );
    assert_eq!(
        app.state.deliveries.due_count().await.expect("due"),
        0,
        "parked rows are not due"
    );
    let events = events_for(&app.state.db);
    assert!(claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());

    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": false }),
    )
    .await;
    let body = app
        .graphql(
            &admin,
            read,
            serde_json::json!({ "id": ids[0].to_string() }),
        )
        .await;
    assert!(
        body["data"]["delivery"]["nextAttemptAt"].is_string(),
        "{body}"
    );
    let claims = claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 3);

    // A retry scheduled while the endpoint is disabled is parked too.
    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": true }),
    )
    .await;
    let retried = record_result(&app.state.db, &claims[0], false).await;
    assert_eq!(retried.new_state, Some(DeliveryState::Pending));
    assert_eq!(
        delivery(&app.state.db, claims[0].delivery_id)
            .await
            .next_attempt_at,
        None
    );
}

crate::on_postgres!(
    locked_rows_are_skipped_not_waited_on,
    deliveries_of_disabled_endpoints_are_not_claimed,
);
