//! How many deliveries each endpoint has in each state, without counting history: the
//! delivered count is kept in sharded rows that every change into or out of `delivered`
//! adjusts in its own transaction (one upsert that adds, as the rate limit does), and the
//! other states, which hold only work in progress and failures, are counted from their
//! partial indexes.

use std::collections::{BTreeMap, HashMap};

use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::db::sql::{fill, Rows};
use crate::db::Db;

/// Rows per endpoint that delivered counts are spread over, so that concurrent recorders
/// of one busy endpoint rarely wait for each other's row.
pub const SHARDS: i16 = 16;

/// Adds each row's `delta` to its endpoint's shard. `{rows}` is a [`Rows`] of
/// [`DELTA_COLUMNS`], at most one per endpoint and shard (a statement may not change one
/// row twice). `WHERE true` lets SQLite tell `ON CONFLICT` from a join.
const ADD_DELIVERED: &str = "\
WITH v (endpoint_id, shard, delta) AS ({rows})
INSERT INTO endpoint_delivered_counts (endpoint_id, shard, delivered)
SELECT endpoint_id, shard, delta FROM v WHERE true
ON CONFLICT (endpoint_id, shard)
DO UPDATE SET delivered = endpoint_delivered_counts.delivered + excluded.delivered";

/// The types of [`ADD_DELIVERED`]'s rows.
const DELTA_COLUMNS: &[&str] = &["uuid", "int2", "int8"];

/// The delivered count of each of `{ids}` (a [`Db::id_list`]); `SUM` of a bigint is
/// numeric on PostgreSQL, hence the cast.
pub const DELIVERED: &str = "\
SELECT endpoint_id, CAST(SUM(delivered) AS BIGINT) AS n FROM endpoint_delivered_counts
WHERE endpoint_id {ids} GROUP BY endpoint_id";

/// The states of work in progress and of failures, each from its partial index: the
/// pending and processing rows from the due index, the failed ones from theirs.
pub const UNSETTLED: &str = "\
SELECT endpoint_id, state, COUNT(*) AS n FROM webhook_deliveries
WHERE endpoint_id {ids} AND state IN ('pending', 'processing') GROUP BY endpoint_id, state
UNION ALL
SELECT endpoint_id, state, COUNT(*) AS n FROM webhook_deliveries
WHERE endpoint_id {ids} AND state = 'failed' GROUP BY endpoint_id, state";

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

/// Changes to delivered counts, gathered per endpoint, to write with [`Tally::write`]
/// in the transaction that made them.
#[derive(Debug, Default)]
pub struct Tally {
    deltas: BTreeMap<Uuid, i64>,
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
        let delivered = |state| state == Some(DeliveryState::Delivered);
        let delta = i64::from(delivered(to)) - i64::from(delivered(from));
        if delta != 0 {
            *self.deltas.entry(endpoint_id).or_default() += delta;
        }
    }

    /// Writes the changes in one statement, on one shard per endpoint chosen at random,
    /// endpoints in id order (so concurrent writers lock their rows in the same order).
    pub async fn write(self, conn: &impl ConnectionTrait, backend: DbBackend) -> Result<(), DbErr> {
        let mut rows = Rows::new(backend, DELTA_COLUMNS);
        let mut any = false;
        for (endpoint_id, delta) in self.deltas {
            if delta == 0 {
                continue;
            }
            let shard = i16::from(rand::random::<u8>()) % SHARDS;
            rows.push([
                Value::from(endpoint_id),
                Value::from(shard),
                Value::from(delta),
            ])?;
            any = true;
        }
        if !any {
            return Ok(());
        }
        let (rows, values) = rows.render(1);
        let sql = fill(ADD_DELIVERED, &[("rows", &rows)]);
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
    // Both halves name the same numbered parameters.
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
            DeliveryState::Failed => entry.failed = n,
            DeliveryState::Delivered => {}
        }
    }
    let delivered = fill(DELIVERED, &[("ids", &list)]);
    for row in conn
        .query_all_raw(Statement::from_sql_and_values(backend, &delivered, values))
        .await?
    {
        let endpoint: Uuid = row.try_get("", "endpoint_id")?;
        let n: i64 = row.try_get("", "n")?;
        counts.entry(endpoint).or_default().delivered = n.max(0);
    }
    Ok(counts)
}
