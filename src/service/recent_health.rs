//! An endpoint's health at a glance, from bounded data: every recorded attempt is added, in
//! the transaction that records it, to a per-minute row of its endpoint (sharded, one
//! upsert that adds, as the settled counts are), and `Endpoint.health` sums the last hour's
//! rows: at most 60 minutes times [`SHARDS`] rows per endpoint, however long the history.
//! Latency is kept as a histogram over fixed bounds, so percentiles are read as the bound of
//! the bucket they fall in (and the slowest attempt for the last one).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, DurationRound, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::db::sql::{fill, Rows};
use crate::db::Db;

/// How far back `Endpoint.health` looks.
pub const WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// The latency buckets' upper bounds, in milliseconds; one more bucket holds the rest.
pub const BOUNDS_MS: [i64; 10] = [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];

/// Buckets per row: one per bound, and one for anything slower.
const BUCKETS: usize = BOUNDS_MS.len() + 1;

/// Rows per endpoint and minute, so concurrent recorders of one busy endpoint rarely wait
/// for each other's row.
pub const SHARDS: i16 = 8;

/// Adds each row to its endpoint's minute and shard. `{rows}` is a [`Rows`] of
/// [`COLUMNS`], at most one per endpoint, minute and shard; `{greatest}` is the larger of
/// two values on the backend. `WHERE true` lets SQLite tell `ON CONFLICT` from a join.
const ADD: &str = "\
WITH v (endpoint_id, minute, shard, attempts, succeeded, slowest_ms,
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10) AS ({rows})
INSERT INTO endpoint_health_minutes
    (endpoint_id, minute, shard, attempts, succeeded, slowest_ms,
     b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10)
SELECT * FROM v WHERE true
ON CONFLICT (endpoint_id, minute, shard) DO UPDATE SET
    attempts = endpoint_health_minutes.attempts + excluded.attempts,
    succeeded = endpoint_health_minutes.succeeded + excluded.succeeded,
    slowest_ms = {greatest}(endpoint_health_minutes.slowest_ms, excluded.slowest_ms),
    b0 = endpoint_health_minutes.b0 + excluded.b0, b1 = endpoint_health_minutes.b1 + excluded.b1,
    b2 = endpoint_health_minutes.b2 + excluded.b2, b3 = endpoint_health_minutes.b3 + excluded.b3,
    b4 = endpoint_health_minutes.b4 + excluded.b4, b5 = endpoint_health_minutes.b5 + excluded.b5,
    b6 = endpoint_health_minutes.b6 + excluded.b6, b7 = endpoint_health_minutes.b7 + excluded.b7,
    b8 = endpoint_health_minutes.b8 + excluded.b8, b9 = endpoint_health_minutes.b9 + excluded.b9,
    b10 = endpoint_health_minutes.b10 + excluded.b10";

/// The types of [`ADD`]'s rows.
const COLUMNS: &[&str] = &[
    "uuid",
    "timestamptz",
    "int2",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
    "int8",
];

/// The window's sums for each of `{ids}` (a [`Db::id_list`]) since `$1`; `SUM` of a
/// bigint is numeric on PostgreSQL, hence the casts.
const RECENT: &str = "\
SELECT endpoint_id, CAST(SUM(attempts) AS BIGINT) AS attempts,
       CAST(SUM(succeeded) AS BIGINT) AS succeeded, CAST(MAX(slowest_ms) AS BIGINT) AS slowest_ms,
       CAST(SUM(b0) AS BIGINT) AS b0, CAST(SUM(b1) AS BIGINT) AS b1, CAST(SUM(b2) AS BIGINT) AS b2,
       CAST(SUM(b3) AS BIGINT) AS b3, CAST(SUM(b4) AS BIGINT) AS b4, CAST(SUM(b5) AS BIGINT) AS b5,
       CAST(SUM(b6) AS BIGINT) AS b6, CAST(SUM(b7) AS BIGINT) AS b7, CAST(SUM(b8) AS BIGINT) AS b8,
       CAST(SUM(b9) AS BIGINT) AS b9, CAST(SUM(b10) AS BIGINT) AS b10
FROM endpoint_health_minutes
WHERE minute >= $1 AND endpoint_id {ids}
GROUP BY endpoint_id";

/// Minutes that left the window (and a minute of slack for clocks).
const PRUNE: &str = "DELETE FROM endpoint_health_minutes WHERE minute < $1";

/// One minute of one endpoint: attempts, 2xx answers, the slowest, and the histogram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Minute {
    attempts: i64,
    succeeded: i64,
    slowest_ms: i64,
    buckets: [i64; BUCKETS],
}

impl Minute {
    fn add(&mut self, succeeded: bool, duration_ms: i64) {
        self.attempts += 1;
        self.succeeded += i64::from(succeeded);
        self.slowest_ms = self.slowest_ms.max(duration_ms);
        let bucket = BOUNDS_MS
            .iter()
            .position(|bound| duration_ms <= *bound)
            .unwrap_or(BUCKETS - 1);
        self.buckets[bucket] += 1;
    }
}

/// Attempts gathered per endpoint and minute, to write with [`Minutes::write`] in the
/// transaction that records them.
#[derive(Debug, Default)]
pub struct Minutes {
    minutes: BTreeMap<(Uuid, DateTime<Utc>), Minute>,
}

impl Minutes {
    /// Nothing gathered yet.
    pub fn new() -> Self {
        Minutes::default()
    }

    /// One attempt to `endpoint_id` that finished at `finished_at`, after `duration_ms`.
    pub fn add(
        &mut self,
        endpoint_id: Uuid,
        finished_at: DateTime<Utc>,
        succeeded: bool,
        duration_ms: i64,
    ) {
        let minute = finished_at
            .duration_trunc(chrono::Duration::minutes(1))
            .unwrap_or(finished_at);
        self.minutes
            .entry((endpoint_id, minute))
            .or_default()
            .add(succeeded, duration_ms.max(0));
    }

    /// Adds what was gathered, in one statement (nothing when nothing was).
    pub async fn write(self, conn: &impl ConnectionTrait, backend: DbBackend) -> Result<(), DbErr> {
        if self.minutes.is_empty() {
            return Ok(());
        }
        let shard = crate::db::shard::next(SHARDS);
        let mut rows = Rows::new(backend, COLUMNS);
        for ((endpoint_id, minute), tallied) in self.minutes {
            let mut row = vec![
                Value::from(endpoint_id),
                Value::from(minute),
                Value::from(shard),
                Value::from(tallied.attempts),
                Value::from(tallied.succeeded),
                Value::from(tallied.slowest_ms),
            ];
            row.extend(tallied.buckets.iter().map(|n| Value::from(*n)));
            rows.push(row)?;
        }
        let greatest = match backend {
            DbBackend::Postgres => "GREATEST",
            _ => "MAX",
        };
        let (rows, values) = rows.render(1);
        let sql = fill(ADD, &[("rows", &rows), ("greatest", greatest)]);
        conn.execute_raw(Statement::from_sql_and_values(backend, sql, values))
            .await?;
        Ok(())
    }
}

/// How an endpoint fared over the last [`WINDOW`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecentHealth {
    /// Attempts recorded.
    pub attempts: i64,
    /// Of those, answered 2xx.
    pub succeeded: i64,
    slowest_ms: i64,
    buckets: [i64; BUCKETS],
}

impl RecentHealth {
    /// The share of attempts answered 2xx; `None` without attempts.
    pub fn success_rate(&self) -> Option<f64> {
        (self.attempts > 0).then(|| self.succeeded as f64 / self.attempts as f64)
    }

    /// The latency below which a share `quantile` (0 to 1) of the attempts finished: the
    /// upper bound of the bucket it falls in (the slowest attempt's time for the last
    /// bucket); `None` without attempts.
    pub fn latency_ms(&self, quantile: f64) -> Option<i64> {
        let total: i64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let wanted = ((quantile.clamp(0.0, 1.0) * total as f64).ceil() as i64).max(1);
        let mut seen = 0;
        for (bucket, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                return Some(BOUNDS_MS.get(bucket).copied().unwrap_or(self.slowest_ms));
            }
        }
        Some(self.slowest_ms)
    }
}

/// The last [`WINDOW`] of each of `endpoint_ids` (every one present, with zeros when quiet),
/// by this process's clock: a measurement, not a decision.
pub async fn recent(db: &Db, endpoint_ids: &[Uuid]) -> Result<HashMap<Uuid, RecentHealth>, DbErr> {
    let mut found: HashMap<Uuid, RecentHealth> = endpoint_ids
        .iter()
        .map(|id| (*id, RecentHealth::default()))
        .collect();
    if endpoint_ids.is_empty() {
        return Ok(found);
    }
    let backend = db.backend();
    let (list, ids) = Db::id_list(backend, 2, endpoint_ids, false);
    let mut values = vec![Value::from(crate::db::now() - WINDOW)];
    values.extend(ids);
    let sql = fill(RECENT, &[("ids", &list)]);
    for row in db
        .conn()
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
    {
        let mut health = RecentHealth {
            attempts: row.try_get("", "attempts")?,
            succeeded: row.try_get("", "succeeded")?,
            slowest_ms: row.try_get("", "slowest_ms")?,
            buckets: [0; BUCKETS],
        };
        for (bucket, n) in health.buckets.iter_mut().enumerate() {
            *n = row.try_get("", &format!("b{bucket}"))?;
        }
        found.insert(row.try_get("", "endpoint_id")?, health);
    }
    Ok(found)
}

/// Deletes the minutes that left the window; returns how many rows went.
pub async fn prune(db: &Db) -> Result<u64, DbErr> {
    let before = crate::db::now() - WINDOW - chrono::Duration::minutes(1);
    Ok(db
        .conn()
        .execute_raw(Statement::from_sql_and_values(
            db.backend(),
            PRUNE,
            [Value::from(before)],
        ))
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(durations: &[(bool, i64)]) -> RecentHealth {
        let mut minute = Minute::default();
        for (succeeded, ms) in durations {
            minute.add(*succeeded, *ms);
        }
        RecentHealth {
            attempts: minute.attempts,
            succeeded: minute.succeeded,
            slowest_ms: minute.slowest_ms,
            buckets: minute.buckets,
        }
    }

    #[test]
    fn percentiles_are_read_from_the_bucket_they_fall_in() {
        let quiet = health(&[]);
        assert_eq!(quiet.success_rate(), None);
        assert_eq!(quiet.latency_ms(0.5), None);
        let mixed = health(&[(true, 3), (true, 8), (false, 40), (true, 70_000)]);
        assert_eq!(mixed.success_rate(), Some(0.75));
        assert_eq!(mixed.latency_ms(0.5), Some(10));
        assert_eq!(mixed.latency_ms(0.75), Some(50));
        assert_eq!(
            mixed.latency_ms(0.99),
            Some(70_000),
            "the slowest, past the last bound"
        );
    }
}
