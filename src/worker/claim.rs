//! Claiming due deliveries (race 1): each due row goes to exactly one worker, whatever
//! the number of processes, and only with a fresh claim token and lease.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult};
use uuid::Uuid;

use super::targets::{self, load_targets, Target};
use crate::db::{Clock, Db};
use crate::events::{Events, StateChange};
use crate::secrets::SecretKeys;
use crate::service::parking::with_parking;

/// The due rows, in due order: `pending` and due, or `processing` with an expired lease
/// (a `processing` row's `next_attempt_at` is its lease expiry). `parked`: the row's endpoint
/// is disabled, so instead of being claimed the row is parked (see [`crate::service::parking`]); expired
/// leases of a disabled endpoint leave the due index that way. `$1` is the most to take.
/// One definition, used by both backends below.
macro_rules! select_due {
    () => {
        "SELECT d.id, d.state AS previous_state, d.submission_id, d.endpoint_id,
           CASE WHEN {disabled(d.endpoint_id)} THEN {parked(d.endpoint_id)} ELSE false END AS parked
    FROM webhook_deliveries d
    WHERE d.state IN ('pending', 'processing')
      AND d.next_attempt_at <= {now}
    ORDER BY d.next_attempt_at
    LIMIT $1"
    };
}

/// PostgreSQL: one statement. The `MATERIALIZED` CTE picks due rows in due order and
/// locks them, skipping rows another transaction holds (never waiting on them); the
/// UPDATE re-checks that each row is still due (the guard) and gives it a fresh token and
/// a lease of `$2`, on the database's clock. A row is claimed only if this UPDATE returned
/// it with a token. A `processing` row's `next_attempt_at` is its lease expiry, so
/// abandoned work is due again by the same test. What to send (payload, URL, secrets; see
/// [`crate::worker::targets`]) comes back with each claimed row, saving a query per batch.
const CLAIM_POSTGRES: &str = concat!(
    "WITH due AS MATERIALIZED (\n    ",
    select_due!(),
    "
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries AS w
SET state = CASE WHEN due.parked THEN 'pending' ELSE 'processing' END,
    claim_token = CASE WHEN due.parked THEN NULL ELSE gen_random_uuid() END,
    claim_expires_at = CASE WHEN due.parked THEN NULL ELSE {after($2)} END,
    next_attempt_at = CASE WHEN due.parked THEN NULL ELSE {after($2)} END,
    updated_at = {now}
FROM due
JOIN submissions s ON s.id = due.submission_id
JOIN endpoints e ON e.id = due.endpoint_id
WHERE w.id = due.id
  AND w.state IN ('pending', 'processing')
  AND w.next_attempt_at <= {now}
RETURNING w.id, w.claim_token, w.cycle_attempts, w.endpoint_id, w.submission_id, w.created_at,
          w.claim_expires_at, w.updated_at, due.previous_state, ",
    crate::targets_columns!(),
    ""
);

/// SQLite, step 1 (inside `BEGIN IMMEDIATE`, which already excludes other writers):
/// the due rows, in due order.
const DUE_SQLITE: &str = select_due!();

/// SQLite, step 2: the same guarded UPDATE; `randomblob(16)` is a fresh UUID's bytes.
const CLAIM_SQLITE: &str = "\
UPDATE webhook_deliveries
SET state = CASE WHEN {parked(endpoint_id)} THEN 'pending' ELSE 'processing' END,
    claim_token = CASE WHEN {parked(endpoint_id)} THEN NULL ELSE randomblob(16) END,
    claim_expires_at = CASE WHEN {parked(endpoint_id)} THEN NULL ELSE {after($1)} END,
    next_attempt_at = CASE WHEN {parked(endpoint_id)} THEN NULL ELSE {after($1)} END,
    updated_at = {now}
WHERE state IN ('pending', 'processing')
  AND next_attempt_at <= {now}
  AND id IN ({ids})
RETURNING id, claim_token, cycle_attempts, endpoint_id, submission_id, created_at,
          claim_expires_at, updated_at";

/// Gives a claim back at once (when its delivery cannot be sent), fenced by its token:
/// due now, or parked if its endpoint was disabled meanwhile.
const RELEASE: &str = "\
UPDATE webhook_deliveries
SET state = 'pending', claim_token = NULL, claim_expires_at = NULL, updated_at = {now},
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
WHERE id = $1 AND claim_token = $2
RETURNING updated_at";

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
/// that was `pending` (retaking an expired lease changes no state). Due rows of disabled
/// endpoints are parked instead (an expired lease goes back to `PENDING`, with no due time).
pub async fn claim_due(
    db: &Db,
    events: &Events,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claim>, DbErr> {
    Ok(claim_rows(db, events, limit, lease).await?.0)
}

/// [`claim_due`], with what to send for each claim. On PostgreSQL it comes back from the
/// claim itself; on SQLite it is read right after.
pub async fn claim_due_with_targets(
    db: &Db,
    events: &Events,
    keys: &SecretKeys,
    limit: u32,
    lease: Duration,
) -> Result<(Vec<Claim>, HashMap<Uuid, Target>), ClaimError> {
    let (claims, rows) = claim_rows(db, events, limit, lease).await?;
    let targets = match db.backend() {
        DbBackend::Postgres => targets::from_rows(keys, &claims, &rows),
        _ => load_targets(db, keys, &claims).await,
    };
    match targets {
        Ok(targets) => Ok((claims, targets)),
        Err(err) => Err(ClaimError::Load(claims, err)),
    }
}

/// Why [`claim_due_with_targets`] failed.
#[derive(Debug)]
pub enum ClaimError {
    /// Nothing was claimed (or the claim was not confirmed: its rows are reclaimed after
    /// their lease).
    Claim(DbErr),
    /// These were claimed, but what to send could not be read: release them.
    Load(Vec<Claim>, DbErr),
}

impl From<DbErr> for ClaimError {
    fn from(err: DbErr) -> Self {
        ClaimError::Claim(err)
    }
}

/// Claims, and the claimed rows as PostgreSQL returned them (with what to send; none on SQLite).
async fn claim_rows(
    db: &Db,
    events: &Events,
    limit: u32,
    lease: Duration,
) -> Result<(Vec<Claim>, Vec<QueryResult>), DbErr> {
    if limit == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let (claims, staged) = db
        .transaction(|txn| async move {
            let clock = db.clock();
            let (rows, returned) = match db.backend() {
                DbBackend::Postgres => {
                    let sql = with_parking(DbBackend::Postgres, CLAIM_POSTGRES);
                    let returned = txn
                        .query_all_raw(
                            clock.statement(&sql, [i64::from(limit).into(), clock.after(lease)]),
                        )
                        .await?;
                    let rows = returned
                        .iter()
                        .map(|row| {
                            let previous: String = row.try_get("", "previous_state")?;
                            taken(row, &previous)
                        })
                        .collect::<Result<Vec<_>, DbErr>>()?;
                    (rows, returned)
                }
                backend => (
                    claim_sqlite(&txn, backend, clock, limit, lease).await?,
                    Vec::new(),
                ),
            };
            let mut claims = Vec::with_capacity(rows.len());
            let mut changes = Vec::new();
            for row in rows {
                let state = if row.claim.is_some() {
                    DeliveryState::Processing
                } else {
                    DeliveryState::Pending
                };
                if row.previous_state != state {
                    changes.push(StateChange {
                        delivery_id: row.delivery_id,
                        endpoint_id: row.endpoint_id,
                        previous_state: Some(row.previous_state),
                        state,
                        at: row.at,
                    });
                }
                claims.extend(row.claim);
            }
            let staged = events.stage(&*txn, changes).await?;
            Ok(((claims, returned), staged))
        })
        .await?;
    staged.committed();
    Ok(claims)
}

/// A due row as the claim left it: claimed, or parked (`claim: None`).
struct Taken {
    delivery_id: Uuid,
    endpoint_id: Uuid,
    previous_state: DeliveryState,
    at: DateTime<Utc>,
    claim: Option<Claim>,
}

/// SQLite's two steps, inside the write transaction `txn` (`BEGIN IMMEDIATE`).
async fn claim_sqlite(
    txn: &DatabaseTransaction,
    backend: DbBackend,
    clock: Clock,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Taken>, DbErr> {
    let due = txn
        .query_all_raw(clock.statement(
            &with_parking(backend, DUE_SQLITE),
            [i64::from(limit).into()],
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
    let sql =
        with_parking(backend, CLAIM_SQLITE).replace("{ids}", &Db::placeholders(2, previous.len()));
    let mut values = vec![clock.after(lease)];
    values.extend(previous.iter().map(|(id, _)| (*id).into()));
    let claimed = txn.query_all_raw(clock.statement(&sql, values)).await?;
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
            taken(row, state)
        })
        .collect()
}

fn taken(row: &QueryResult, previous: &str) -> Result<Taken, DbErr> {
    let previous_state = DeliveryState::parse(previous)
        .ok_or_else(|| DbErr::Type(format!("unknown delivery state {previous:?}")))?;
    let delivery_id: Uuid = row.try_get("", "id")?;
    let endpoint_id: Uuid = row.try_get("", "endpoint_id")?;
    let token: Option<Uuid> = row.try_get("", "claim_token")?;
    let lease: Option<DateTime<Utc>> = row.try_get("", "claim_expires_at")?;
    let claim = match (token, lease) {
        (Some(claim_token), Some(lease_expires_at)) => Some(Claim {
            delivery_id,
            claim_token,
            previous_state,
            cycle_attempts: row.try_get("", "cycle_attempts")?,
            endpoint_id,
            submission_id: row.try_get("", "submission_id")?,
            created_at: row.try_get("", "created_at")?,
            lease_expires_at,
        }),
        _ => None,
    };
    Ok(Taken {
        delivery_id,
        endpoint_id,
        previous_state,
        at: row.try_get("", "updated_at")?,
        claim,
    })
}

/// Returns claims to `pending`, due now, so any worker may take them again without
/// waiting for their lease (parked instead if the endpoint was disabled meanwhile). Claims
/// that were meanwhile superseded are left alone.
pub async fn release(db: &Db, events: &Events, claims: &[Claim]) -> Result<(), DbErr> {
    let staged = db
        .transaction(|txn| async move {
            let sql = with_parking(db.backend(), RELEASE);
            let mut changes = Vec::new();
            for claim in claims {
                let released = txn
                    .query_one_raw(
                        db.clock()
                            .statement(&sql, [claim.delivery_id.into(), claim.claim_token.into()]),
                    )
                    .await?;
                if let Some(row) = released {
                    changes.push(StateChange {
                        delivery_id: claim.delivery_id,
                        endpoint_id: claim.endpoint_id,
                        previous_state: Some(DeliveryState::Processing),
                        state: DeliveryState::Pending,
                        at: row.try_get("", "updated_at")?,
                    });
                }
            }
            events.stage(&*txn, changes).await
        })
        .await?;
    staged.committed();
    Ok(())
}
