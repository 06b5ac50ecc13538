//! Claiming: every due row goes to exactly one worker, expired leases are retaken once, and
//! locked rows are skipped rather than waited on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use courier::worker::claim::{claim_due, Claim};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::support::{Backend, TestDb};

use crate::support::fixtures::delivery;
use crate::support::fixtures::events_for;
use crate::support::fixtures::expire_leases;
use crate::support::fixtures::LONG_LEASE;
use crate::support::seeding::seed;
use crate::support::seeding::seed_spread;

/// Six sessions with their own pools claim at once, round after round, over the backlogs
/// of six endpoints: every row goes to exactly one session. (Claims of one endpoint take
/// turns on its flow row, so each round spreads the sessions over the endpoints.)
async fn concurrent_claims_partition_the_work(backend: Backend) {
    const SESSIONS: usize = 6;
    const LIMIT: u32 = 15;
    let db = TestDb::new(backend).await;
    let (_app, ids) = seed_spread(&db, 6, 10).await;
    let mut pools = Vec::new();
    for _ in 0..SESSIONS {
        pools.push(db.connect(1).await);
    }
    let mut seen = HashSet::new();
    let mut busy_rounds = 0;
    loop {
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
        let claimed: usize = claims.iter().map(Vec::len).sum();
        if claimed == 0 {
            break;
        }
        busy_rounds += 1;
        assert!(busy_rounds <= 20, "claims keep finding work");
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

on_every_backend!(
    concurrent_claims_partition_the_work,
    an_expired_lease_is_reclaimed_exactly_once,
);

crate::on_postgres!(locked_rows_are_skipped_not_waited_on,);
