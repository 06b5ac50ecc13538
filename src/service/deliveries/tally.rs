//! How many deliveries each endpoint has in each state, without counting history: the
//! settled counts (delivered, failed) are kept in sharded rows that every change into or
//! out of those states adjusts in its own transaction (one upsert that adds, as the rate
//! limit does), and the work in progress (pending, processing) is counted from its partial
//! index.

use std::collections::{BTreeMap, HashMap};

use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::db::sql::{fill, Rows};
use crate::db::Db;

/// Rows per endpoint that settled counts are spread over, so that concurrent recorders
/// of one busy endpoint rarely wait for each other's row.
pub const SHARDS: i16 = 16;

/// Adds each row's deltas to its endpoint's shard. `{rows}` is a [`Rows`] of
/// [`DELTA_COLUMNS`], at most one per endpoint and shard (a statement may not change one
/// row twice). `WHERE true` lets SQLite tell `ON CONFLICT` from a join.
const ADD_SETTLED: &str = "\
WITH v (endpoint_id, shard, delivered, failed) AS ({rows})
INSERT INTO endpoint_settled_counts (endpoint_id, shard, delivered, failed)
SELECT endpoint_id, shard, delivered, failed FROM v WHERE true
ON CONFLICT (endpoint_id, shard)
DO UPDATE SET delivered = endpoint_settled_counts.delivered + excluded.delivered,
              failed = endpoint_settled_counts.failed + excluded.failed";

/// The types of [`ADD_SETTLED`]'s rows.
const DELTA_COLUMNS: &[&str] = &["uuid", "int2", "int8", "int8"];

/// The settled counts of each of `{ids}` (a [`Db::id_list`]); `SUM` of a bigint is
/// numeric on PostgreSQL, hence the casts.
pub const SETTLED: &str = "\
SELECT endpoint_id, CAST(SUM(delivered) AS BIGINT) AS delivered,
       CAST(SUM(failed) AS BIGINT) AS failed
FROM endpoint_settled_counts WHERE endpoint_id {ids} GROUP BY endpoint_id";

/// The work in progress, from the due index (which holds only pending and processing rows).
pub const UNSETTLED: &str = "\
SELECT endpoint_id, state, COUNT(*) AS n FROM webhook_deliveries
WHERE endpoint_id {ids} AND state IN ('pending', 'processing') GROUP BY endpoint_id, state";

/// How many deliveries of an endpoint are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Waiting for an attempt.
    pub pending: i64,
    /// Being attempted.
    pub processing: i64,
    /// Accepted by the endpoint.
    pub delivered: i64,
    /// Out of attempts.
    pub failed: i64,
}

/// Changes to settled counts, gathered per endpoint (delivered, failed), to write with
/// [`Tally::write`] in the transaction that made them.
#[derive(Debug, Default)]
pub struct Tally {
    deltas: BTreeMap<Uuid, [i64; 2]>,
}

impl Tally {
    /// Nothing changed yet.
    pub fn new() -> Self {
        Tally::default()
    }

    /// A delivery of `endpoint_id` moved from `from` to `to` (`None`: it was created, or
    /// deleted).
    pub fn moved(
        &mut self,
        endpoint_id: Uuid,
        from: Option<DeliveryState>,
        to: Option<DeliveryState>,
    ) {
        let counted = |state: Option<DeliveryState>| match state {
            Some(DeliveryState::Delivered) => [1, 0],
            Some(DeliveryState::Failed) => [0, 1],
            _ => [0, 0],
        };
        let (to, from) = (counted(to), counted(from));
        let delta = [to[0] - from[0], to[1] - from[1]];
        if delta != [0, 0] {
            let entry = self.deltas.entry(endpoint_id).or_default();
            entry[0] += delta[0];
            entry[1] += delta[1];
        }
    }

    /// Writes the changes in one statement, on one shard for this write (see
    /// [`crate::db::shard`]), endpoints in id order (so concurrent writers lock their rows
    /// in the same order).
    pub async fn write(self, conn: &impl ConnectionTrait, backend: DbBackend) -> Result<(), DbErr> {
        let mut rows = Rows::new(backend, DELTA_COLUMNS);
        let mut any = false;
        let shard = crate::db::shard::next(SHARDS);
        for (endpoint_id, [delivered, failed]) in self.deltas {
            if delivered == 0 && failed == 0 {
                continue;
            }
            rows.push([
                Value::from(endpoint_id),
                Value::from(shard),
                Value::from(delivered),
                Value::from(failed),
            ])?;
            any = true;
        }
        if !any {
            return Ok(());
        }
        let (rows, values) = rows.render(1);
        let sql = fill(ADD_SETTLED, &[("rows", &rows)]);
        conn.execute_raw(Statement::from_sql_and_values(backend, sql, values))
            .await?;
        Ok(())
    }
}

/// Per-state counts for each of `endpoint_ids`: two statements, neither reading history.
pub async fn counts(db: &Db, endpoint_ids: &[Uuid]) -> Result<HashMap<Uuid, StateCounts>, DbErr> {
    let mut counts: HashMap<Uuid, StateCounts> = endpoint_ids
        .iter()
        .map(|id| (*id, StateCounts::default()))
        .collect();
    if endpoint_ids.is_empty() {
        return Ok(counts);
    }
    let backend = db.backend();
    let conn = db.conn();
    let (list, values) = Db::id_list(backend, 1, endpoint_ids, false);
    let unsettled = fill(UNSETTLED, &[("ids", &list)]);
    for row in conn
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            &unsettled,
            values.clone(),
        ))
        .await?
    {
        let endpoint: Uuid = row.try_get("", "endpoint_id")?;
        let state: DeliveryState = row.try_get("", "state")?;
        let n: i64 = row.try_get("", "n")?;
        let entry = counts.entry(endpoint).or_default();
        match state {
            DeliveryState::Pending => entry.pending = n,
            DeliveryState::Processing => entry.processing = n,
            DeliveryState::Delivered | DeliveryState::Failed => {}
        }
    }
    let settled = fill(SETTLED, &[("ids", &list)]);
    for row in conn
        .query_all_raw(Statement::from_sql_and_values(backend, &settled, values))
        .await?
    {
        let endpoint: Uuid = row.try_get("", "endpoint_id")?;
        let delivered: i64 = row.try_get("", "delivered")?;
        let failed: i64 = row.try_get("", "failed")?;
        let entry = counts.entry(endpoint).or_default();
        entry.delivered = delivered.max(0);
        entry.failed = failed.max(0);
    }
    Ok(counts)
}
