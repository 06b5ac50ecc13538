//! Claiming due deliveries (race 1): each due row goes to exactly one worker, whatever
//! the number of processes, and only with a fresh claim token and lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult, Statement};
use uuid::Uuid;

use crate::db::{self, Db};
use crate::events::{Events, StateChange};

/// The due rows, in due order: `pending` and due, or `processing` with an expired lease
/// (a `processing` row's `next_attempt_at` is its lease expiry), of enabled endpoints.
/// `$1` is now, `$2` the most to take. One definition, used by both backends below.
macro_rules! select_due {
    () => {
        "SELECT d.id, d.state AS previous_state
    FROM webhook_deliveries d
    JOIN endpoints e ON e.id = d.endpoint_id
    WHERE d.state IN ('pending', 'processing')
      AND d.next_attempt_at <= $1
      AND NOT e.disabled
    ORDER BY d.next_attempt_at
    LIMIT $2"
    };
}

/// PostgreSQL: one statement. The `MATERIALIZED` CTE picks due rows in due order and
/// locks them, skipping rows another transaction holds (never waiting on them); the
/// UPDATE re-checks that each row is still due (the guard) and gives it a fresh token and
/// lease. A row is claimed only if this UPDATE returned it. A `processing` row's
/// `next_attempt_at` is its lease expiry, so abandoned work is due again by the same test.
const CLAIM_POSTGRES: &str = concat!(
    "WITH due AS MATERIALIZED (\n    ",
    select_due!(),
    "
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries AS w
SET state = 'processing',
    claim_token = gen_random_uuid(),
    claim_expires_at = $3,
    next_attempt_at = $3,
    updated_at = $1
FROM due
WHERE w.id = due.id
  AND w.state IN ('pending', 'processing')
  AND w.next_attempt_at <= $1
RETURNING w.id, w.claim_token, w.cycle_attempts, w.endpoint_id, w.submission_id, w.created_at,
          due.previous_state"
);

/// SQLite, step 1 (inside `BEGIN IMMEDIATE`, which already excludes other writers):
/// the due rows, in due order.
const DUE_SQLITE: &str = select_due!();

/// SQLite, step 2: the same guarded UPDATE; `randomblob(16)` is a fresh UUID's bytes.
const CLAIM_SQLITE: &str = "\
UPDATE webhook_deliveries
SET state = 'processing',
    claim_token = randomblob(16),
    claim_expires_at = $2,
    next_attempt_at = $2,
    updated_at = $1
WHERE state IN ('pending', 'processing')
  AND next_attempt_at <= $1
  AND id IN ({ids})
RETURNING id, claim_token, cycle_attempts, endpoint_id, submission_id, created_at";

/// Gives a claim back at once (when its delivery cannot be sent), fenced by its token.
const RELEASE: &str = "\
UPDATE webhook_deliveries
SET state = 'pending', claim_token = NULL, claim_expires_at = NULL, next_attempt_at = $3, updated_at = $3
WHERE id = $1 AND claim_token = $2";

/// A delivery this worker now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The delivery.
    pub delivery_id: Uuid,
    /// The token every later write must present.
    pub claim_token: Uuid,
    /// The state before the claim (`pending`, or `processing` for an expired lease).
    pub previous_state: DeliveryState,
    /// Attempts already made in this cycle.
    pub cycle_attempts: i32,
    /// The endpoint to deliver to.
    pub endpoint_id: Uuid,
    /// The submission to deliver.
    pub submission_id: Uuid,
    /// When the delivery was created (for end-to-end latency).
    pub created_at: DateTime<Utc>,
    /// When this claim's lease runs out.
    pub lease_expires_at: DateTime<Utc>,
}

/// Claims up to `limit` due deliveries for `lease`, and publishes `PROCESSING` for each
/// that was `pending` (retaking an expired lease changes no state).
pub async fn claim_due(
    db: &Db,
    events: &Events,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claim>, DbErr> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let now = db::now();
    let lease_expires_at =
        now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(60));
    let txn = db.begin_read_committed().await?;
    let claims = match db.backend() {
        DbBackend::Postgres => {
            let rows = txn
                .query_all_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    CLAIM_POSTGRES,
                    [now.into(), i64::from(limit).into(), lease_expires_at.into()],
                ))
                .await?;
            rows.iter()
                .map(|row| {
                    let previous: String = row.try_get("", "previous_state")?;
                    claim_of(row, &previous, lease_expires_at)
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        backend => claim_sqlite(&txn, backend, now, limit, lease_expires_at).await?,
    };
    let changes = claims
        .iter()
        .filter(|claim| claim.previous_state != DeliveryState::Processing)
        .map(|claim| StateChange {
            delivery_id: claim.delivery_id,
            endpoint_id: claim.endpoint_id,
            previous_state: Some(claim.previous_state),
            state: DeliveryState::Processing,
            at: now,
        })
        .collect();
    let staged = events.stage(&txn, changes).await?;
    txn.commit().await?;
    staged.committed();
    Ok(claims)
}

/// SQLite's two steps, inside the write transaction `txn` (`BEGIN IMMEDIATE`).
async fn claim_sqlite(
    txn: &DatabaseTransaction,
    backend: DbBackend,
    now: DateTime<Utc>,
    limit: u32,
    lease_expires_at: DateTime<Utc>,
) -> Result<Vec<Claim>, DbErr> {
    let due = txn
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            DUE_SQLITE,
            [now.into(), i64::from(limit).into()],
        ))
        .await?;
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let mut previous = Vec::with_capacity(due.len());
    for row in &due {
        let id: Uuid = row.try_get("", "id")?;
        let state: String = row.try_get("", "previous_state")?;
        previous.push((id, state));
    }
    let sql = CLAIM_SQLITE.replace("{ids}", &Db::placeholders(3, previous.len()));
    let mut values = vec![now.into(), lease_expires_at.into()];
    values.extend(previous.iter().map(|(id, _)| (*id).into()));
    let claimed = txn
        .query_all_raw(Statement::from_sql_and_values(backend, &sql, values))
        .await?;
    // RETURNING on SQLite can only name the updated table: the previous states come from step 1.
    claimed
        .iter()
        .map(|row| {
            let id: Uuid = row.try_get("", "id")?;
            let state = previous
                .iter()
                .find(|(due_id, _)| *due_id == id)
                .map(|(_, state)| state.as_str())
                .unwrap_or_default();
            claim_of(row, state, lease_expires_at)
        })
        .collect()
}

fn claim_of(
    row: &QueryResult,
    previous: &str,
    lease_expires_at: DateTime<Utc>,
) -> Result<Claim, DbErr> {
    Ok(Claim {
        delivery_id: row.try_get("", "id")?,
        claim_token: row.try_get("", "claim_token")?,
        previous_state: DeliveryState::parse(previous)
            .ok_or_else(|| DbErr::Type(format!("unknown delivery state {previous:?}")))?,
        cycle_attempts: row.try_get("", "cycle_attempts")?,
        endpoint_id: row.try_get("", "endpoint_id")?,
        submission_id: row.try_get("", "submission_id")?,
        created_at: row.try_get("", "created_at")?,
        lease_expires_at,
    })
}

/// Returns claims to `pending`, due now, so any worker may take them again without
/// waiting for their lease. Claims that were meanwhile superseded are left alone.
pub async fn release(db: &Db, events: &Events, claims: &[Claim]) -> Result<(), DbErr> {
    let now = db::now();
    let txn = db.begin_read_committed().await?;
    let mut changes = Vec::new();
    for claim in claims {
        let released = txn
            .execute_raw(Statement::from_sql_and_values(
                db.backend(),
                RELEASE,
                [
                    claim.delivery_id.into(),
                    claim.claim_token.into(),
                    now.into(),
                ],
            ))
            .await?;
        if released.rows_affected() == 1 {
            changes.push(StateChange {
                delivery_id: claim.delivery_id,
                endpoint_id: claim.endpoint_id,
                previous_state: Some(DeliveryState::Processing),
                state: DeliveryState::Pending,
                at: now,
            });
        }
    }
    let staged = events.stage(&txn, changes).await?;
    txn.commit().await?;
    staged.committed();
    Ok(())
}
