//! The endpoint pause a recording applies for a `Retry-After` on 429 or 503, telling
//! whether it starts a pause (announced) or only makes one longer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};
use uuid::Uuid;

use crate::db::Db;
use crate::service::flow::{PAUSE_ENDPOINT, PAUSE_TURN};

/// [`PAUSE_ENDPOINT`] on PostgreSQL, telling also whether a pause was already running: the
/// endpoint row is locked first and read as it is (the newest version), then paused.
const PAUSE_ENDPOINT_POSTGRES: &str = "\
WITH before AS (SELECT id, paused_until FROM endpoints WHERE id = $1 FOR UPDATE)
UPDATE endpoints e SET paused_until = {after($2)}
FROM before
WHERE e.id = before.id AND (e.paused_until IS NULL OR e.paused_until < {after($2)})
RETURNING e.paused_until, COALESCE(before.paused_until > {now}, FALSE) AS was_paused";

/// SQLite, before [`PAUSE_ENDPOINT`]: whether a pause is running.
const PAUSED_NOW_SQLITE: &str = "SELECT COALESCE(paused_until > {now}, FALSE) AS paused \
     FROM endpoints WHERE id = $1";

/// An endpoint a recording paused (logged once it commits).
#[derive(Debug)]
pub(super) struct Paused {
    pub(super) endpoint_id: Uuid,
    pub(super) until: Option<DateTime<Utc>>,
    pub(super) wait: Duration,
    /// Whether a pause was already running (and this one only made it longer): only a
    /// pause that starts is told as `courier.endpoint.paused`.
    pub(super) extended: bool,
}

/// Pauses `endpoint_id` for `wait` from now (database clock) unless a longer pause stands,
/// and holds its turn back until then.
pub(super) async fn pause(
    txn: &DatabaseTransaction,
    db: &Db,
    endpoint_id: Uuid,
    wait: Duration,
) -> Result<Option<Paused>, DbErr> {
    let clock = db.clock();
    let sql = match db.backend() {
        DbBackend::Postgres => PAUSE_ENDPOINT_POSTGRES,
        _ => PAUSE_ENDPOINT,
    };
    let extended = match db.backend() {
        DbBackend::Postgres => None,
        // SQLite's write transaction excludes every other writer: what it reads holds.
        _ => {
            let row = txn
                .query_one_raw(clock.statement(PAUSED_NOW_SQLITE, [endpoint_id.into()]))
                .await?;
            Some(match row {
                Some(row) => row.try_get::<bool>("", "paused")?,
                None => false,
            })
        }
    };
    let paused = txn
        .query_one_raw(clock.statement(sql, [endpoint_id.into(), clock.after(wait)]))
        .await?;
    let Some(row) = paused else {
        return Ok(None);
    };
    let until: Option<DateTime<Utc>> = row.try_get("", "paused_until")?;
    let extended = match extended {
        Some(extended) => extended,
        None => row.try_get("", "was_paused")?,
    };
    txn.execute_raw(Statement::from_sql_and_values(
        db.backend(),
        PAUSE_TURN,
        [endpoint_id.into(), until.into()],
    ))
    .await?;
    Ok(Some(Paused {
        endpoint_id,
        until,
        wait,
        extended,
    }))
}
