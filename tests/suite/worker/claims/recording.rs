//! Recording: results are fenced by their claim's token, numbered once per lifetime, and
//! idempotent per claim, alone or in a batch.

use std::sync::Arc;

use courier::db::Db;
use courier::worker::claim::{claim_due, Claim};
use courier::worker::health::HealthPolicy;
use courier::worker::record::FinishedAttempt;
use courier::worker::schedule::NextStep;
use entity::webhook_delivery::DeliveryState;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::on_every_backend;
use crate::support::{Backend, TestDb};

use crate::support::fixtures::attempts;
use crate::support::fixtures::delivery;
use crate::support::fixtures::events_for;
use crate::support::fixtures::expire_leases;
use crate::support::fixtures::outcome;
use crate::support::fixtures::record_result;
use crate::support::fixtures::LONG_LEASE;
use crate::support::seeding::seed;

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
            2,
            "the retake counted the expired claim's request once and the live claim's record \
             once; the late record counts nothing"
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
    let recorded = courier::worker::record::record(&pool, &events, HealthPolicy::default(), &batch)
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

/// Two batches over the same deliveries written at once through independent connections
/// (as two processes may, or one recorder's two batches): each batch holds the older or
/// the newer claim on every delivery, in opposite orders. Both are written, every delivery
/// gets distinct lifetime numbers, and only the newer claims change state.
async fn concurrent_batches_on_the_same_deliveries_keep_fences_and_numbers(backend: Backend) {
    const DELIVERIES: usize = 6;
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed(&db, DELIVERIES).await;
    let (old_pool, new_pool) = (db.connect(1).await, db.connect(1).await);
    let claim_all = |pool: Db| async move {
        claim_due(&pool, &events_for(&pool), DELIVERIES as u32, LONG_LEASE)
            .await
            .expect("claim")
    };
    let mut older = claim_all(old_pool.clone()).await;
    expire_leases(&old_pool).await;
    let mut newer = claim_all(new_pool.clone()).await;
    assert_eq!((older.len(), newer.len()), (DELIVERIES, DELIVERIES));
    older.sort_by_key(|c| c.delivery_id);
    newer.sort_by_key(|c| std::cmp::Reverse(c.delivery_id));
    let now = courier::db::now();
    let finished = |claim: &Claim| FinishedAttempt {
        claim: claim.clone(),
        outcome: outcome(true),
        step: NextStep::Delivered,
        started_at: now,
        finished_at: now,
    };
    let (old_batch, new_batch): (Vec<_>, Vec<_>) = (
        older.iter().map(finished).collect(),
        newer.iter().map(finished).collect(),
    );
    let barrier = Arc::new(Barrier::new(2));
    let (b1, b2) = (barrier.clone(), barrier);
    let (late, current) = tokio::join!(
        async {
            b1.wait().await;
            courier::worker::record::record(
                &old_pool,
                &events_for(&old_pool),
                HealthPolicy::default(),
                &old_batch,
            )
            .await
        },
        async {
            b2.wait().await;
            courier::worker::record::record(
                &new_pool,
                &events_for(&new_pool),
                HealthPolicy::default(),
                &new_batch,
            )
            .await
        },
    );
    let (late, current) = (late.expect("older batch"), current.expect("newer batch"));
    assert!(
        late.iter().all(|r| r.new_state.is_none()),
        "older claims change nothing"
    );
    assert!(current
        .iter()
        .all(|r| r.new_state == Some(DeliveryState::Delivered)));
    for id in ids {
        let numbers: Vec<(i32, bool)> = attempts(&new_pool, id)
            .await
            .iter()
            .map(|a| (a.number, a.superseded))
            .collect();
        let mut sorted = numbers.iter().map(|(n, _)| *n).collect::<Vec<_>>();
        sorted.sort();
        assert_eq!(sorted, vec![1, 2], "distinct lifetime numbers for {id}");
        assert_eq!(
            numbers.iter().filter(|(_, superseded)| *superseded).count(),
            1,
            "exactly the older attempt is superseded"
        );
        assert_eq!(
            delivery(&new_pool, id).await.state,
            DeliveryState::Delivered
        );
    }
}

on_every_backend!(
    concurrent_batches_on_the_same_deliveries_keep_fences_and_numbers,
    a_batch_records_each_outcome_under_its_own_fence,
    recording_is_idempotent_per_claim,
    late_results_are_fenced_in_either_order,
    simultaneous_results_get_distinct_numbers,
);
