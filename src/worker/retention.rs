//! Retention: deliveries settled (`delivered` or `failed`) longer ago than
//! `COURIER_RETENTION_DAYS` are deleted with their attempts and their submissions, every
//! `COURIER_PRUNE_INTERVAL_SECS`, in small batches that skip locked rows, so pruning never
//! waits on (or holds up) claiming, recording, replaying or submitting. Pending and
//! processing deliveries are never touched. Ordering lines idle as long, with nothing open,
//! go too, and so do API keys expired as long (a portal link leaves a key behind).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::sql::fill;
use crate::db::Db;
use crate::error::error_chain;
use crate::service::deliveries::tally::Tally;
use crate::service::lines;
use crate::service::recent_health;
use entity::webhook_delivery::DeliveryState;

/// Deliveries deleted per transaction: small, so each one is brief.
pub const BATCH: i64 = 500;

/// PostgreSQL: one statement per batch, judged by the database's clock (`$1` is bound by
/// [`crate::db::Clock::before`], like every cut-off here). The oldest settled
/// deliveries are locked `SKIP LOCKED` (a row a replay or anything else holds is left for
/// the next run), then their attempts, themselves and their submissions go together.
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
)
SELECT endpoint_id, state FROM deliveries";

/// SQLite, step 1 (inside the write transaction, which excludes every other writer): the
/// oldest settled deliveries past the cut-off.
const DOOMED_SQLITE: &str = "\
SELECT id, submission_id, endpoint_id, state FROM webhook_deliveries
WHERE state IN ('delivered', 'failed') AND updated_at < {after($1)}
ORDER BY updated_at
LIMIT $2";

/// SQLite, step 2: the same rows, named as one JSON array of hex ids each.
const DELETE_SQLITE: [&str; 3] = [
    "DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT unhex(value) FROM json_each($1))",
    "DELETE FROM webhook_deliveries WHERE id IN (SELECT unhex(value) FROM json_each($1)) \
     AND state IN ('delivered', 'failed')",
    "DELETE FROM submissions WHERE id IN (SELECT unhex(value) FROM json_each($1)) \
     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.submission_id = submissions.id)",
];

/// Events older than the retention with no submission left (their deliveries all pruned,
/// or published to no endpoint), a batch at a time. `{skip_locked}`: on PostgreSQL an
/// event another transaction holds is left for the next run (SQLite's write transaction
/// already excludes every other writer).
const PRUNE_EVENTS: &str = "\
DELETE FROM events WHERE id IN (
    SELECT e.id FROM events e
    WHERE e.created_at < {after($1)}
      AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.event_id = e.id)
    LIMIT $2
    {skip_locked}
)";

/// API keys that expired (a portal link's) before the cut-off `$1`, a batch at a time:
/// refused since they expired, kept a while to be listed, then gone.
const PRUNE_EXPIRED_KEYS: &str = "\
DELETE FROM api_keys WHERE id IN (
    SELECT id FROM api_keys WHERE expires_at < {after($1)} LIMIT $2
)";

/// Deletes every delivery settled more than `days` ago (with its attempts and submission),
/// then the events left without submissions, the ordering lines idle as long and the API
/// keys expired as long, batch by batch, until none is left or `shutdown` fires, resting
/// after each full batch of deliveries as long as it took. Returns how many deliveries
/// went, or the first error once every kind was tried.
pub async fn prune(db: &Db, days: u32, shutdown: &CancellationToken) -> Result<u64, DbErr> {
    // Each kind is pruned whatever became of the others: one that keeps failing (events
    // whose statement overruns its deadline, say) must not leave the rest to grow.
    let deliveries = prune_deliveries(db, days, shutdown).await;
    let events = repeat_batches(shutdown, || async {
        db.within_deadline(prune_events(db, days, BATCH)).await
    })
    .await;
    let lines = repeat_batches(shutdown, || async {
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
    let keys = repeat_batches(shutdown, || async {
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
    events.and(lines).and(keys)?;
    Ok(pruned)
}

/// Runs `batch` (which deletes up to [`BATCH`] rows and says how many) until one deletes
/// fewer, or `shutdown` fires.
async fn repeat_batches<F, Fut>(shutdown: &CancellationToken, mut batch: F) -> Result<(), DbErr>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, DbErr>>,
{
    while !shutdown.is_cancelled() {
        if batch().await? < BATCH as u64 {
            break;
        }
    }
    Ok(())
}

/// The deliveries settled more than `days` ago, with their attempts and submissions, batch
/// by batch, resting after each full batch as long as it took. Returns how many went.
async fn prune_deliveries(db: &Db, days: u32, shutdown: &CancellationToken) -> Result<u64, DbErr> {
    let mut pruned = 0;
    while !shutdown.is_cancelled() {
        let started = std::time::Instant::now();
        let deleted = db.within_deadline(prune_batch(db, days, BATCH)).await?;
        pruned += deleted;
        if deleted < BATCH as u64 {
            break;
        }
        // Rest as long as the batch took: pruning takes at most half of one connection's
        // time, leaving the rest of the machine to claiming and recording, and still
        // removes history several times faster than a process delivers.
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(started.elapsed()) => {}
        }
    }
    Ok(pruned)
}

/// Deletes up to `limit` events older than `days` days that no submission refers to.
pub async fn prune_events(db: &Db, days: u32, limit: i64) -> Result<u64, DbErr> {
    let statement = prune_events_statement(db, days, limit);
    Ok(db.conn().execute_raw(statement).await?.rows_affected())
}

fn prune_events_statement(db: &Db, days: u32, limit: i64) -> Statement {
    let skip_locked = match db.backend() {
        DbBackend::Postgres => "FOR UPDATE SKIP LOCKED",
        _ => "",
    };
    let sql = fill(PRUNE_EVENTS, &[("skip_locked", skip_locked)]);
    let clock = db.clock();
    clock.statement(&sql, [clock.before(retention(days)), limit.into()])
}

/// What one run of [`prune_events`] does, on PostgreSQL: its plan with the work it did
/// (`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`), in a transaction rolled back after.
pub async fn explain_prune_events(
    db: &Db,
    days: u32,
    limit: i64,
) -> Result<serde_json::Value, DbErr> {
    use sea_orm::TransactionTrait as _;
    let statement = prune_events_statement(db, days, limit);
    let explained = Statement::from_sql_and_values(
        statement.db_backend,
        format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", statement.sql),
        statement.values.map(|values| values.0).unwrap_or_default(),
    );
    let txn = db.conn().begin().await?;
    let plan = txn.query_one_raw(explained).await?;
    txn.rollback().await?;
    plan.ok_or_else(|| DbErr::RecordNotFound("a plan".into()))?
        .try_get("", "QUERY PLAN")
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
                deliveries.push(row.try_get::<Uuid>("", "id")?.simple().to_string());
                submissions.push(
                    row.try_get::<Uuid>("", "submission_id")?
                        .simple()
                        .to_string(),
                );
            }
            let as_json =
                |ids: &[String]| serde_json::to_string(ids).map_err(|e| DbErr::Json(e.to_string()));
            let (deliveries, submissions) = (as_json(&deliveries)?, as_json(&submissions)?);
            for (sql, ids) in DELETE_SQLITE
                .iter()
                .zip([&deliveries, &deliveries, &submissions])
            {
                txn.execute_raw(Statement::from_sql_and_values(
                    backend,
                    *sql,
                    [ids.clone().into()],
                ))
                .await?;
            }
            untally(&txn, backend, &doomed).await?;
            txn.commit().await?;
            Ok(doomed.len() as u64)
        }
    }
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
        match prune(&db, days, &shutdown).await {
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
