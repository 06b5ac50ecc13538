//! Step 2 of a claim on SQLite, inside `BEGIN IMMEDIATE` (which already excludes every
//! other writer): per endpoint its requests in flight and its due rows, then one guarded
//! UPDATE of them all.

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Value};
use uuid::Uuid;

use entity::webhook_delivery::DeliveryState;

use super::{attempts_bound, claim_from, ClaimRequest, Taken};
use crate::db::sql::fill;
use crate::db::Db;
use crate::service::flow::Standing;

/// Step 2 on SQLite (inside `BEGIN IMMEDIATE`, which already excludes other writers), per
/// endpoint: its requests in flight now (less `{not_ended}`).
const IN_FLIGHT_SQLITE: &str = "SELECT COUNT(*) AS n FROM webhook_deliveries \
     WHERE endpoint_id = $1 AND {in_flight(webhook_deliveries)} AND id {not_ended}";

/// ... its due rows in due order, at most `$2`.
const DUE_SQLITE: &str = "SELECT id, state AS previous_state FROM webhook_deliveries \
     WHERE endpoint_id = $1 AND {due(webhook_deliveries)} \
     ORDER BY next_attempt_at LIMIT $2";

/// ... and the UPDATE, guarded by the due conditions again (the write transaction excludes
/// every other writer, so they hold), counting a retaken lease as an attempt up to the
/// cycle's `$2`; `randomblob(16)` is a fresh UUID's bytes.
const CLAIM_SQLITE: &str = "\
UPDATE webhook_deliveries
SET state = 'processing', claim_token = randomblob(16), claim_expires_at = {after($1)},
    next_attempt_at = {after($1)}, updated_at = {now},
    cycle_attempts = MIN(cycle_attempts + {retaken}, $2)
WHERE {due(webhook_deliveries)}
  AND id {ids}
RETURNING id, claim_token, cycle_attempts, endpoint_id, submission_id, created_at,
          claim_expires_at, updated_at, ordering_key, event_type";

/// Step 2 on SQLite.
pub(super) async fn claim_sqlite(
    txn: &DatabaseTransaction,
    db: &Db,
    standings: &[Standing],
    wants: &[u32],
    request: &ClaimRequest,
) -> Result<Vec<Taken>, DbErr> {
    let mut previous: Vec<(Uuid, DeliveryState)> = Vec::new();
    let (not_ended, ended_values) = Db::id_list(db.backend(), 2, &request.ended.ended, true);
    let in_flight_sql = fill(IN_FLIGHT_SQLITE, &[("not_ended", &not_ended)]);
    for (standing, want) in standings.iter().zip(wants) {
        if *want == 0 {
            continue;
        }
        let clock = db.clock();
        let mut values = vec![Value::from(standing.endpoint_id)];
        values.extend(ended_values.iter().cloned());
        let in_flight: i64 = match txn
            .query_one_raw(clock.statement(&in_flight_sql, values))
            .await?
        {
            Some(row) => row.try_get("", "n")?,
            None => 0,
        };
        let free = (i64::from(standing.max_in_flight) - in_flight).max(0);
        let take = free.min(i64::from(*want));
        if take == 0 {
            continue;
        }
        for row in txn
            .query_all_raw(clock.statement(DUE_SQLITE, [standing.endpoint_id.into(), take.into()]))
            .await?
        {
            previous.push((row.try_get("", "id")?, row.try_get("", "previous_state")?));
        }
    }
    if previous.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = previous.iter().map(|(id, _)| *id).collect();
    let (list, id_values) = Db::id_list(db.backend(), 3, &ids, false);
    let retaken = super::retaken("state");
    let sql = fill(CLAIM_SQLITE, &[("ids", &list), ("retaken", &retaken)]);
    let clock = db.clock();
    let mut values = vec![
        clock.after(request.lease),
        Value::from(attempts_bound(request)),
    ];
    values.extend(id_values);
    let claimed = txn.query_all_raw(clock.statement(&sql, values)).await?;
    // RETURNING on SQLite can only name the updated table: the previous states come from above.
    let mut claims = Vec::with_capacity(claimed.len());
    for row in &claimed {
        let id: Uuid = row.try_get("", "id")?;
        let state = previous
            .iter()
            .find(|(due_id, _)| *due_id == id)
            .map(|(_, state)| *state)
            .ok_or_else(|| DbErr::RecordNotFound("the state of a claimed row".into()))?;
        claims.push(claim_from(row, state)?);
    }
    Ok(claims)
}
