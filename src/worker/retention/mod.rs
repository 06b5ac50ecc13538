//! Retention: deliveries settled (`delivered` or `failed`) longer ago than
//! `COURIER_RETENTION_DAYS` are deleted with their attempts and their submissions, every
//! `COURIER_PRUNE_INTERVAL_SECS`, in small batches that skip locked rows, so pruning never
//! waits on (or holds up) claiming, recording, replaying or submitting. Pending and
//! processing deliveries are never touched. Ordering lines idle as long, with nothing open,
//! go too, and so do API keys expired as long (a portal link leaves a key behind), and
//! events no submission refers to any more ([`events`]).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::sql::sqlite_ids;
use crate::db::Db;
use crate::error::error_chain;
use crate::service::deliveries::tally::Tally;
use crate::service::lines;
use crate::service::recent_health;
use entity::webhook_delivery::DeliveryState;

pub mod events;

pub use self::events::{EventSweep, SweepStep};

/// Deliveries deleted per transaction: small, so each one is brief.
pub const BATCH: i64 = 500;

/// PostgreSQL: one statement per batch, judged by the database's clock (`$1` is bound by
/// [`crate::db::Clock::before`], like every cut-off here). The oldest settled
/// deliveries are locked `SKIP LOCKED` (a row a replay or anything else holds is left for
/// the next run), then their attempts, themselves and their submissions go together; the
/// submissions' events are returned, to go too once no submission refers to them.
const PRUNE_POSTGRES: &str = "\
WITH doomed AS (
    SELECT id, submission_id FROM webhook_deliveries
    WHERE state IN ('delivered', 'failed') AND updated_at < {after($1)}
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT id FROM doomed)
), deliveries AS (
    DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM doomed)
    RETURNING submission_id, endpoint_id, state
), submissions AS (
    DELETE FROM submissions WHERE id IN (SELECT submission_id FROM deliveries)
    RETURNING id, event_id
)
SELECT d.endpoint_id, d.state, s.event_id
FROM deliveries d LEFT JOIN submissions s ON s.id = d.submission_id";

/// SQLite, step 1 (inside the write transaction, which excludes every other writer): the
/// oldest settled deliveries past the cut-off, with their submissions' events.
const DOOMED_SQLITE: &str = "\
SELECT d.id, d.submission_id, d.endpoint_id, d.state, s.event_id
FROM webhook_deliveries d LEFT JOIN submissions s ON s.id = d.submission_id
WHERE d.state IN ('delivered', 'failed') AND d.updated_at < {after($1)}
ORDER BY d.updated_at
LIMIT $2";

/// SQLite, step 2: the same rows, named as one list of ids each ([`sqlite_ids`]).
const DELETE_SQLITE: [&str; 3] = [
    "DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT unhex(value) FROM json_each($1))",
    "DELETE FROM webhook_deliveries WHERE id IN (SELECT unhex(value) FROM json_each($1)) \
     AND state IN ('delivered', 'failed')",
    "DELETE FROM submissions WHERE id IN (SELECT unhex(value) FROM json_each($1)) \
     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.submission_id = submissions.id)",
];

/// API keys that expired (a portal link's) before the cut-off `$1`, a batch at a time:
/// refused since they expired, kept a while to be listed, then gone.
const PRUNE_EXPIRED_KEYS: &str = "\
DELETE FROM api_keys WHERE id IN (
    SELECT id FROM api_keys WHERE expires_at < {after($1)} LIMIT $2
)";

/// Events a step of the event sweep examines: more than a batch of deletions, as reading
/// an event kept costs only an index entry and a lookup.
pub const SWEEP_STEP: i64 = 5_000;

/// Deletes every delivery settled more than `days` ago (with its attempts, submission and,
/// with its last submission, event), then sweeps on from where `events` stopped for events
/// that expired without a submission, then the ordering lines idle as long and the API keys
/// expired as long, batch by batch, until none is left or `shutdown` fires, resting after
/// each full batch of deliveries or step of the sweep as long as it took. Returns how many
/// deliveries went, or the first error once every kind was tried.
pub async fn prune(
    db: &Db,
    days: u32,
    events: &EventSweep,
    shutdown: &CancellationToken,
) -> Result<u64, DbErr> {
    // Each kind is pruned whatever became of the others: one that keeps failing (a step
    // that overruns its deadline, say) must not leave the rest to grow.
    let deliveries = paced(shutdown, BATCH as u64, || async {
        db.within_deadline(prune_batch(db, days, BATCH)).await
    })
    .await;
    let swept = paced(shutdown, SWEEP_STEP as u64, || async {
        let step = db
            .within_deadline(events.step(db, days, SWEEP_STEP))
            .await?;
        Ok(step.examined)
    })
    .await;
    let lines = paced(shutdown, BATCH as u64, || async {
        let clock = db.clock();
        db.within_deadline(lines::prune_idle(
            db.conn(),
            db.backend(),
            clock.before(retention(days)),
            BATCH,
        ))
        .await
    })
    .await;
    let keys = paced(shutdown, BATCH as u64, || async {
        let clock = db.clock();
        let statement = clock.statement(
            PRUNE_EXPIRED_KEYS,
            [clock.before(retention(days)), BATCH.into()],
        );
        Ok(db
            .within_deadline(db.conn().execute_raw(statement))
            .await?
            .rows_affected())
    })
    .await;
    let pruned = deliveries?;
    swept.and(lines).and(keys)?;
    Ok(pruned)
}

/// Runs `batch` (which works through up to `full` rows and says how many) until one does
/// fewer, or `shutdown` fires, resting after each full one as long as it took: retention
/// takes at most half of one connection's time, leaving the rest of the machine to
/// claiming and recording, and still removes history several times faster than a process
/// delivers. Returns how many rows were worked through.
async fn paced<F, Fut>(shutdown: &CancellationToken, full: u64, mut batch: F) -> Result<u64, DbErr>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, DbErr>>,
{
    let mut total = 0;
    while !shutdown.is_cancelled() {
        let started = std::time::Instant::now();
        let done = batch().await?;
        total += done;
        if done < full {
            break;
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(started.elapsed()) => {}
        }
    }
    Ok(total)
}

/// Deletes up to `limit` of the oldest deliveries settled more than `days` ago, in one
/// transaction. Returns how many went.
pub async fn prune_batch(db: &Db, days: u32, limit: i64) -> Result<u64, DbErr> {
    match db.backend() {
        DbBackend::Postgres => {
            let pruned = db
                .transaction(|txn| async move {
                    let clock = db.clock();
                    let rows = txn
                        .query_all_raw(clock.statement(
                            PRUNE_POSTGRES,
                            [clock.before(retention(days)), limit.into()],
                        ))
                        .await?;
                    // The events first: their locks may be waited for (another process
                    // pruning their other deliveries), and no settled-count row a
                    // recording needs is held meanwhile.
                    events::with_last_submission(&*txn, db.backend(), &events_of(&rows)?).await?;
                    untally(&*txn, db.backend(), &rows).await?;
                    Ok(rows.len() as u64)
                })
                .await?;
            Ok(pruned)
        }
        backend => {
            let txn = db.begin_write().await?;
            let clock = db.clock();
            let doomed = txn
                .query_all_raw(
                    clock.statement(DOOMED_SQLITE, [clock.before(retention(days)), limit.into()]),
                )
                .await?;
            let mut deliveries = Vec::with_capacity(doomed.len());
            let mut submissions = Vec::with_capacity(doomed.len());
            for row in &doomed {
                deliveries.push(row.try_get::<Uuid>("", "id")?);
                submissions.push(row.try_get::<Uuid>("", "submission_id")?);
            }
            let (deliveries, submissions) = (sqlite_ids(&deliveries), sqlite_ids(&submissions));
            for (sql, ids) in DELETE_SQLITE
                .iter()
                .zip([&deliveries, &deliveries, &submissions])
            {
                txn.execute_raw(Statement::from_sql_and_values(backend, *sql, [ids.clone()]))
                    .await?;
            }
            untally(&txn, backend, &doomed).await?;
            events::with_last_submission(&txn, backend, &events_of(&doomed)?).await?;
            txn.commit().await?;
            Ok(doomed.len() as u64)
        }
    }
}

/// The events of the pruned `rows`' submissions (each row's `event_id`, NULL for a submit).
fn events_of(rows: &[sea_orm::QueryResult]) -> Result<Vec<Uuid>, DbErr> {
    let mut events = Vec::new();
    for row in rows {
        if let Some(event) = row.try_get::<Option<Uuid>>("", "event_id")? {
            events.push(event);
        }
    }
    Ok(events)
}

/// Takes the pruned `rows` (each with its `endpoint_id` and `state`) out of the delivered
/// counts, in the transaction that deleted them.
async fn untally(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    rows: &[sea_orm::QueryResult],
) -> Result<(), DbErr> {
    let mut tally = Tally::new();
    for row in rows {
        let state: DeliveryState = row.try_get("", "state")?;
        tally.moved(row.try_get("", "endpoint_id")?, Some(state), None);
    }
    tally.write(txn, backend).await
}

/// Prunes every `interval` until `shutdown` (history not at all when `days` is 0; the
/// minutes of `Endpoint.health` that left its hour, and previous secrets past their grace
/// period, always).
pub async fn run(db: Db, days: u32, interval: Duration, shutdown: CancellationToken) {
    let events = EventSweep::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(err) = db.within_deadline(recent_health::prune(&db)).await {
            tracing::warn!(error = %error_chain(&err), "pruning endpoint health minutes failed; retrying later");
        }
        if let Err(err) = db
            .within_deadline(super::retired_secrets::forget(&db))
            .await
        {
            tracing::warn!(error = %error_chain(&err), "forgetting expired previous secrets failed; retrying later");
        }
        if days == 0 {
            continue;
        }
        match prune(&db, days, &events, &shutdown).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, retention_days = days, "old deliveries pruned"),
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "pruning old deliveries failed; retrying later")
            }
        }
    }
}

/// How long settled history is kept: `days` days.
fn retention(days: u32) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(days) * 86_400)
}
