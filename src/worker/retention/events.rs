//! Retention of published events: an event goes once no submission refers to it. Most go
//! in the transaction that prunes their last delivery ([`with_last_submission`]); the few
//! that never had a submission (published to no endpoint) are found by a sweep that walks
//! the expired events in time order, each one once per process ([`EventSweep`]), instead
//! of reading again, on every run, the expired events that deliveries still hold.

use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::db::sql::{fill, sqlite_ids};
use crate::db::Db;

/// PostgreSQL: the events `$1` (whose submissions this transaction has just deleted),
/// locked in id order. Two batches pruning the last submissions of one event then take
/// turns: the second's next statement sees the first's deletions, so one of them takes the
/// event, never neither.
const LOCK_EVENTS_POSTGRES: &str =
    "SELECT id FROM events WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE";

/// PostgreSQL, with their locks held: those of the events `$1` no submission refers to.
const DELETE_UNREFERENCED_POSTGRES: &str = "\
DELETE FROM events e WHERE e.id = ANY($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.event_id = e.id)";

/// SQLite (inside its write transaction, which excludes every other writer): the same, for
/// the events named as one JSON array of hex ids.
const DELETE_UNREFERENCED_SQLITE: &str = "\
DELETE FROM events WHERE id IN (SELECT unhex(value) FROM json_each($1))
  AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.event_id = events.id)";

/// The next `$2` events created before the cut-off `$1`, in time order, from just past the
/// last one examined (`{past_examined}`: `$3`, `$4`, the last one's time and id). The
/// index on `created_at` finds them (ties, in id order, are sorted a group at a time); an
/// index on `(created_at, id)` would have needed a migration that locks `events` while it
/// builds, holding up every `publish` of a live deployment.
const NEXT_EXAMINED: &str = "\
SELECT id, created_at FROM events
WHERE created_at < {after($1)} {past_examined}
ORDER BY created_at, id
LIMIT $2";

/// PostgreSQL, one step of the sweep in one statement: of the next events examined, those
/// no submission refers to are deleted (one another transaction holds is left: a batch
/// pruning its last submission holds it, and takes it), and the last one examined is
/// returned with how many went.
const SWEEP_POSTGRES: &str = "\
WITH examined AS ({examined}), gone AS (
    DELETE FROM events WHERE id IN (
        SELECT e.id FROM events e
        WHERE e.id IN (SELECT id FROM examined)
          AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.event_id = e.id)
        FOR UPDATE OF e SKIP LOCKED)
    RETURNING id
), last AS (
    SELECT id, created_at FROM examined ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT COUNT(*) FROM examined) AS examined, (SELECT COUNT(*) FROM gone) AS pruned,
       last.id, last.created_at
FROM (SELECT 1) AS one LEFT JOIN last ON TRUE";

/// Takes the events `events` once their last submission is gone, in the transaction that
/// deleted the submissions (`events` may repeat, and may include ones still referred to).
pub async fn with_last_submission(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    events: &[Uuid],
) -> Result<u64, DbErr> {
    if events.is_empty() {
        return Ok(0);
    }
    let mut events = events.to_vec();
    events.sort_unstable();
    events.dedup();
    let deleted = match backend {
        DbBackend::Postgres => {
            let ids = Value::from(events);
            txn.query_all_raw(Statement::from_sql_and_values(
                backend,
                LOCK_EVENTS_POSTGRES,
                [ids.clone()],
            ))
            .await?;
            txn.execute_raw(Statement::from_sql_and_values(
                backend,
                DELETE_UNREFERENCED_POSTGRES,
                [ids],
            ))
            .await?
        }
        _ => {
            txn.execute_raw(Statement::from_sql_and_values(
                backend,
                DELETE_UNREFERENCED_SQLITE,
                [sqlite_ids(&events)],
            ))
            .await?
        }
    };
    Ok(deleted.rows_affected())
}

/// One step of an [`EventSweep`]: how many events it examined, and how many of them went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepStep {
    /// Events read (at most the step's limit: fewer means the sweep reached the cut-off).
    pub examined: u64,
    /// Events deleted among them.
    pub pruned: u64,
}

/// A walk over the expired events in time order, deleting those no submission refers to.
/// It remembers the last event it examined, so each run reads only the events that expired
/// since: one still referred to when the sweep passed goes with its last submission
/// instead. A new sweep (a process starting) walks every expired event once.
#[derive(Debug, Default)]
pub struct EventSweep {
    /// The last event examined: its time and id.
    examined_to: Mutex<Option<(DateTime<Utc>, Uuid)>>,
}

impl EventSweep {
    /// Examines up to `limit` more events created more than `days` days ago, deleting those
    /// no submission refers to, and moves past them.
    pub async fn step(&self, db: &Db, days: u32, limit: i64) -> Result<SweepStep, DbErr> {
        match db.backend() {
            DbBackend::Postgres => {
                let row = db
                    .conn()
                    .query_one_raw(self.statement(db, days, limit, SWEEP_POSTGRES))
                    .await?
                    .ok_or_else(|| DbErr::RecordNotFound("a sweep step".into()))?;
                let step = SweepStep {
                    examined: count(row.try_get("", "examined")?),
                    pruned: count(row.try_get("", "pruned")?),
                };
                let last: Option<Uuid> = row.try_get("", "id")?;
                if let Some(id) = last {
                    self.moved_to((row.try_get("", "created_at")?, id));
                }
                Ok(step)
            }
            backend => {
                let txn = db.begin_write().await?;
                let examined = txn
                    .query_all_raw(self.statement(db, days, limit, "{examined}"))
                    .await?;
                let mut ids = Vec::with_capacity(examined.len());
                let mut last = None;
                for row in &examined {
                    let id: Uuid = row.try_get("", "id")?;
                    ids.push(id);
                    last = Some((row.try_get("", "created_at")?, id));
                }
                let pruned = with_last_submission(&txn, backend, &ids).await?;
                txn.commit().await?;
                if let Some(last) = last {
                    self.moved_to(last);
                }
                Ok(SweepStep {
                    examined: examined.len() as u64,
                    pruned,
                })
            }
        }
    }

    /// What one step from here does, on PostgreSQL: its plan with the work it did
    /// (`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`), in a transaction rolled back after.
    pub async fn explain_step(
        &self,
        db: &Db,
        days: u32,
        limit: i64,
    ) -> Result<serde_json::Value, DbErr> {
        use sea_orm::TransactionTrait as _;
        let statement = self.statement(db, days, limit, SWEEP_POSTGRES);
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

    /// The last event examined, now `last`.
    fn moved_to(&self, last: (DateTime<Utc>, Uuid)) {
        *self
            .examined_to
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(last);
    }

    /// `template` with `{examined}` the next events to examine from here, and its values.
    fn statement(&self, db: &Db, days: u32, limit: i64, template: &str) -> Statement {
        let clock = db.clock();
        let mut values = vec![clock.before(super::retention(days)), limit.into()];
        let examined_to = *self
            .examined_to
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let past_examined = match examined_to {
            Some((created_at, id)) => {
                values.extend([Value::from(created_at), Value::from(id)]);
                "AND created_at >= $3 AND (created_at > $3 OR id > $4)"
            }
            None => "",
        };
        let examined = fill(NEXT_EXAMINED, &[("past_examined", past_examined)]);
        let sql = fill(template, &[("examined", &examined)]);
        clock.statement(&sql, values)
    }
}

/// A count read from the database, never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
