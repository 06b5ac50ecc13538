//! Replayed and resent deliveries rejoining their lines: they enter like any delivery (and
//! their lines are searched from the start at the next hand-off), and one submitted before
//! a head that is only waiting for its next retry takes the line over.

use std::collections::HashMap;
use std::sync::OnceLock;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use super::{enter, Line, Place, ENTERING_SQLITE};
use crate::db::parking::with_parking;
use crate::db::sql::fill;
use crate::db::Clock;

/// PostgreSQL, after replayed deliveries `$1` entered their lines (whose locks this
/// transaction now holds): where a line's head is only waiting for its next retry (not in
/// flight) and a delivery submitted before it waits, that earlier one becomes the head, due
/// now (or parked), and the head goes back to waiting, keeping the time of the retry it
/// waited for (`resume_at`) for when the line is handed back. The head is demoted only while it is
/// still pending and not waiting on its newest version (a claim that took it meanwhile wins:
/// it is in flight, and the earlier one waits for it), and the earlier one is promoted only
/// if the head was demoted.
const REHEAD_POSTGRES: &str = "\
WITH lines AS (
    SELECT DISTINCT endpoint_id, ordering_key FROM webhook_deliveries
    WHERE id = ANY($1::uuid[]) AND ordering_key IS NOT NULL
), heads AS (
    SELECT h.id, h.line_seq, lines.endpoint_id, lines.ordering_key
    FROM lines CROSS JOIN LATERAL (
        SELECT d.id, d.line_seq FROM webhook_deliveries d
        WHERE d.endpoint_id = lines.endpoint_id AND d.ordering_key = lines.ordering_key
          AND d.state = 'pending' AND NOT d.waiting
        LIMIT 1) h
), earlier AS (
    SELECT e.id, heads.id AS head_id
    FROM heads CROSS JOIN LATERAL (
        SELECT d.id FROM webhook_deliveries d
        WHERE d.endpoint_id = heads.endpoint_id AND d.ordering_key = heads.ordering_key
          AND d.state = 'pending' AND d.waiting AND d.line_seq < heads.line_seq
        ORDER BY d.line_seq LIMIT 1) e
), demoted AS (
    UPDATE webhook_deliveries w
    SET waiting = TRUE, resume_at = w.next_attempt_at, next_attempt_at = NULL, updated_at = {now}
    FROM earlier
    WHERE w.id = earlier.head_id AND w.state = 'pending' AND NOT w.waiting
    RETURNING w.id
)
UPDATE webhook_deliveries w
SET waiting = FALSE, updated_at = {now}, resume_at = NULL,
    next_attempt_at = CASE WHEN {parked(w.endpoint_id)} THEN NULL ELSE {now} END
FROM earlier JOIN demoted ON demoted.id = earlier.head_id
WHERE w.id = earlier.id
RETURNING w.id";

/// After deliveries `{ids}` rejoined their lines (whose locks this transaction holds), each
/// of those lines is searched from its start at its next hand-off: a rejoined delivery keeps
/// its old number, which may be below the line's `waiting_from` (see [`super::hand_on`]).
const SEARCH_FROM_START: &str = "\
UPDATE ordering_lines SET waiting_from = NULL
FROM (SELECT DISTINCT endpoint_id, ordering_key FROM webhook_deliveries
      WHERE id {ids} AND ordering_key IS NOT NULL) AS rejoined
WHERE ordering_lines.endpoint_id = rejoined.endpoint_id
  AND ordering_lines.ordering_key = rejoined.ordering_key
  AND ordering_lines.waiting_from IS NOT NULL";

/// SQLite, per line after replayed deliveries entered it: its head if only waiting for
/// its next retry, and the first delivery waiting in it, with their numbers.
const REHEAD_FIND_SQLITE: &str = "\
SELECT h.id AS head_id, h.line_seq AS head_seq,
       (SELECT d.id FROM webhook_deliveries d
        WHERE d.endpoint_id = $1 AND d.ordering_key = $2 AND d.state = 'pending' AND d.waiting
          AND d.line_seq < h.line_seq
        ORDER BY d.line_seq LIMIT 1) AS earlier_id
FROM webhook_deliveries h
WHERE h.endpoint_id = $1 AND h.ordering_key = $2 AND h.state = 'pending' AND NOT h.waiting";

/// ... the head back to waiting, keeping the time of its next retry for when the line is
/// handed back ...
const DEMOTE_SQLITE: &str = "\
UPDATE webhook_deliveries
SET waiting = TRUE, resume_at = next_attempt_at, next_attempt_at = NULL, updated_at = {now}
WHERE id = $1";

/// ... and the earlier one its head.
const PROMOTE_SQLITE: &str = "\
UPDATE webhook_deliveries
SET waiting = FALSE, updated_at = {now}, resume_at = NULL,
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
WHERE id = $1";

/// Replayed or resent deliveries `ids` (restarted earlier in `txn`) rejoin their lines:
/// they enter, each in its original place, and where a line's head is only waiting for its
/// next retry and one submitted before it is now waiting, that one becomes the head (a
/// replayed delivery becomes the head if it is the earliest; a head in flight finishes
/// first). Returns each keyed delivery's place.
pub async fn rejoin(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    ids: &[Uuid],
) -> std::result::Result<HashMap<Uuid, Place>, DbErr> {
    let mut places = enter(txn, backend, ids).await?;
    if places.is_empty() {
        return Ok(places);
    }
    let (list, values) = crate::db::Db::id_list(backend, 1, ids, false);
    let sql = fill(SEARCH_FROM_START, &[("ids", &list)]);
    txn.execute_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?;
    let promoted = yield_to_earlier(txn, backend, ids).await?;
    for id in promoted {
        if let Some(place) = places.get_mut(&id) {
            place.waiting = false;
        }
    }
    Ok(places)
}

/// In the lines of `ids`: where the head is only waiting for its next retry and a delivery
/// submitted before it waits, that one becomes the head, due now (or parked), and the head
/// waits behind it. Run for replayed deliveries as they rejoin, and for keyed heads whose
/// attempt just ended in a retry (recorded earlier in `txn`, which holds their rows), which
/// so give their line to one replayed while they were in flight. The head's demotion is
/// conditional on its newest version, so of two statements racing to rehead one line, one
/// promotes and the other finds no head to demote. Returns the deliveries promoted.
pub async fn yield_to_earlier(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    ids: &[Uuid],
) -> std::result::Result<Vec<Uuid>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let clock = Clock::new(backend);
    let mut promoted = Vec::new();
    if backend == DbBackend::Postgres {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| with_parking(DbBackend::Postgres, REHEAD_POSTGRES));
        for row in txn
            .query_all_raw(clock.statement(sql, [Value::from(ids.to_vec())]))
            .await?
        {
            promoted.push(row.try_get::<Uuid>("", "id")?);
        }
    } else {
        let (list, values) = crate::db::Db::id_list(backend, 1, ids, false);
        let sql = fill(ENTERING_SQLITE, &[("ids", &list)]);
        let mut lines: Vec<Line> = Vec::new();
        for row in txn
            .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
            .await?
        {
            let line: Line = (
                row.try_get("", "endpoint_id")?,
                row.try_get("", "ordering_key")?,
            );
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        let promote = with_parking(backend, PROMOTE_SQLITE);
        for (endpoint_id, key) in lines {
            let found = txn
                .query_one_raw(Statement::from_sql_and_values(
                    backend,
                    REHEAD_FIND_SQLITE,
                    [endpoint_id.into(), key.into()],
                ))
                .await?;
            let Some(found) = found else { continue };
            let (head, earlier): (Uuid, Option<Uuid>) = (
                found.try_get("", "head_id")?,
                found.try_get("", "earlier_id")?,
            );
            let Some(earlier) = earlier else { continue };
            txn.execute_raw(clock.statement(DEMOTE_SQLITE, [head.into()]))
                .await?;
            txn.execute_raw(clock.statement(&promote, [earlier.into()]))
                .await?;
            promoted.push(earlier);
        }
    }
    Ok(promoted)
}
