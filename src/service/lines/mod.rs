//! Ordering lines, one rule in one place: deliveries to one endpoint whose submissions carry
//! the same ordering key form a line, in the order their submissions committed, and only the
//! line's head (its earliest unsettled delivery) has a due time; the others wait (`waiting`,
//! no due time) until the head settles and hands the line on.
//!
//! Each line has an `ordering_lines` row counting its unsettled deliveries (`open`) and
//! numbering them (`last_seq`), and every change to who is in a line takes that row's lock
//! first. Entering (a new delivery, a replay, a resend) is an upsert whose `RETURNING` reads
//! the newest count, never a snapshot's: a delivery entering an empty line is the head, any
//! other waits, and numbers handed out under the lock follow commit order. Leaving (the head
//! recorded `DELIVERED` or `FAILED`, fenced by its claim token) takes the row's lock and
//! then, in a statement that starts after the lock is held and so sees every entry
//! committed before it, lowers the count and gives the first waiting delivery its due time
//! (found from the row's `waiting_from` on, see [`hand_on`]). Claims never look at lines: only heads are ever due, so no worker can attempt two deliveries of one line at
//! once, on any process, and a head whose lease expires is simply claimed again (its late
//! result is fenced out like any other).

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::db::parking::with_parking;
use crate::db::sql::fill;
use crate::db::Clock;
use crate::error::{Error, Result};
use crate::service::operational;

mod rejoin;

pub use self::rejoin::{rejoin, yield_to_earlier};

/// The longest ordering key, in characters.
pub const MAX_ORDERING_KEY_CHARS: usize = 255;

/// The webhook header that carries a delivery's ordering key.
pub const ORDERING_KEY_HEADER: &str = "webhook-ordering-key";

/// PostgreSQL, inside a statement: the lines of the deliveries in `{source}` (a relation of
/// `delivery_id, endpoint_id, ordering_key, line_seq`, the last NULL for a new delivery),
/// entered. Each line's row is upserted once however many of its deliveries enter, in key
/// order (so concurrent entries cannot deadlock), adding them to its count; `line_places`
/// then gives each delivery its number (a new one the next free, in id order; a replayed
/// one keeps its own) and whether it waits: all but the first of an empty line do.
const ENTER_CTES: &str = "\
line_counts AS (
    SELECT endpoint_id, ordering_key, COUNT(*) AS entering
    FROM {source} GROUP BY endpoint_id, ordering_key
), line_rows AS (
    INSERT INTO ordering_lines AS l (endpoint_id, ordering_key, last_seq, open, updated_at)
    SELECT endpoint_id, ordering_key, entering, entering, {now} FROM line_counts
    ORDER BY endpoint_id, ordering_key
    ON CONFLICT (endpoint_id, ordering_key) DO UPDATE
    SET last_seq = l.last_seq + excluded.last_seq, open = l.open + excluded.open,
        updated_at = excluded.updated_at
    RETURNING l.endpoint_id, l.ordering_key, l.last_seq, l.open
), line_places AS (
    SELECT e.delivery_id,
           COALESCE(e.line_seq, r.last_seq - c.entering + e.place) AS line_seq,
           r.open - c.entering + e.place > 1 AS waiting
    FROM (SELECT *, row_number() OVER (PARTITION BY endpoint_id, ordering_key
                                       ORDER BY line_seq, delivery_id) AS place
          FROM {source}) e
    JOIN line_counts c ON c.endpoint_id = e.endpoint_id AND c.ordering_key = e.ordering_key
    JOIN line_rows r ON r.endpoint_id = e.endpoint_id AND r.ordering_key = e.ordering_key
)";

/// PostgreSQL: the deliveries `$1` (written earlier in this transaction) enter their lines;
/// those that wait lose their due time.
const ENTER_POSTGRES: &str = "\
WITH entering AS (
    SELECT id AS delivery_id, endpoint_id, ordering_key, line_seq FROM webhook_deliveries
    WHERE id = ANY($1::uuid[]) AND ordering_key IS NOT NULL
), {enter_ctes}
UPDATE webhook_deliveries w
SET line_seq = p.line_seq, waiting = p.waiting,
    next_attempt_at = CASE WHEN p.waiting THEN NULL ELSE w.next_attempt_at END
FROM line_places p
WHERE w.id = p.delivery_id
RETURNING w.id, w.line_seq, w.waiting";

/// SQLite (inside `BEGIN IMMEDIATE`, which excludes every other writer): the deliveries
/// entering, line by line, in line order.
const ENTERING_SQLITE: &str = "\
SELECT id, endpoint_id, ordering_key, line_seq FROM webhook_deliveries
WHERE id {ids} AND ordering_key IS NOT NULL
ORDER BY endpoint_id, ordering_key, line_seq IS NULL, line_seq, id";

/// ... one line's row, upserted with `$3` deliveries more.
const UPSERT_LINE_SQLITE: &str = "\
INSERT INTO ordering_lines (endpoint_id, ordering_key, last_seq, open, updated_at)
VALUES ($1, $2, $3, $3, {now})
ON CONFLICT (endpoint_id, ordering_key) DO UPDATE
SET last_seq = ordering_lines.last_seq + excluded.last_seq,
    open = ordering_lines.open + excluded.open, updated_at = excluded.updated_at
RETURNING last_seq, open";

/// ... and each delivery's place.
const PLACE_SQLITE: &str = "\
UPDATE webhook_deliveries
SET line_seq = $2, waiting = $3, next_attempt_at = CASE WHEN $3 THEN NULL ELSE next_attempt_at END
WHERE id = $1";

/// PostgreSQL, first: the lines of the heads that settled (`$1` endpoints, `$2` keys, once
/// per head), locked in key order. What the next statement reads of them, and of their
/// waiting deliveries, is then everything committed before it.
const LOCK_LINES_POSTGRES: &str = "\
SELECT l.endpoint_id FROM ordering_lines l
JOIN (SELECT DISTINCT endpoint_id, ordering_key
      FROM unnest($1::uuid[], $2::text[]) AS t(endpoint_id, ordering_key)) s
  ON l.endpoint_id = s.endpoint_id AND l.ordering_key = s.ordering_key
ORDER BY l.endpoint_id, l.ordering_key
FOR UPDATE OF l";

/// PostgreSQL, then, with the lines' locks held (`$1` endpoints, `$2` keys, once per head
/// that settled): each line loses its settled heads from its count and, if still open, the
/// first delivery waiting in it becomes its head, due now (or parked while its endpoint is
/// disabled); one that was the head before, and lost the line while it waited for a retry
/// (see [`rejoin`]), is due at that retry's time instead (`resume_at`), so losing and
/// getting back its line costs it no attempt of its cycle. The search starts at the line's `waiting_from` (see [`hand_on`]), which then
/// moves past the new head. A statement of its own, so its snapshot is taken with the locks
/// held: a delivery that entered a line just before is seen (one statement with the locking
/// would read the lines' waiting deliveries from a snapshot taken before its lock waits).
/// Each line is read by its key (a lateral lookup, so a plan made without statistics
/// cannot read every line instead) and paired with its next delivery as it is read
/// (`lines`), so both updates join by key: pairing them in the lines' update instead
/// rescanned every next delivery for every line, 10,000 comparisons for 100 hand-ons.
const HAND_ON_POSTGRES: &str = "\
WITH settled AS (
    SELECT endpoint_id, ordering_key, COUNT(*) AS n
    FROM unnest($1::uuid[], $2::text[]) AS t(endpoint_id, ordering_key)
    GROUP BY endpoint_id, ordering_key
), lines AS MATERIALIZED (
    SELECT l.endpoint_id, l.ordering_key, l.last_seq, GREATEST(l.open - s.n, 0) AS open,
           next.id AS next_id, next.line_seq AS next_seq
    FROM settled s
    CROSS JOIN LATERAL (
        SELECT l.* FROM ordering_lines l
        WHERE l.endpoint_id = s.endpoint_id AND l.ordering_key = s.ordering_key LIMIT 1) l
    LEFT JOIN LATERAL (
        SELECT d.id, d.line_seq FROM webhook_deliveries d
        WHERE l.open - s.n > 0
          AND d.endpoint_id = l.endpoint_id AND d.ordering_key = l.ordering_key
          AND d.line_seq >= COALESCE(l.waiting_from, 0) AND d.state = 'pending' AND d.waiting
        ORDER BY d.line_seq LIMIT 1) next ON TRUE
), lowered AS (
    UPDATE ordering_lines l
    SET open = lines.open, updated_at = {now},
        waiting_from = LEAST(lines.next_seq + 1, lines.last_seq + 1)
    FROM lines
    WHERE l.endpoint_id = lines.endpoint_id AND l.ordering_key = lines.ordering_key
)
UPDATE webhook_deliveries w
SET waiting = FALSE, updated_at = {now}, resume_at = NULL,
    next_attempt_at = CASE WHEN {parked(w.endpoint_id)} THEN NULL
                           ELSE GREATEST({now}, w.resume_at) END
FROM lines
WHERE w.id = lines.next_id
RETURNING w.id, w.endpoint_id";

/// SQLite, per line: its count lowered by `$3` (an emptied line's bound moved past every
/// number it gave out)...
const LOWER_SQLITE: &str = "\
UPDATE ordering_lines
SET open = MAX(open - $3, 0), updated_at = {now},
    waiting_from = CASE WHEN open - $3 <= 0 THEN last_seq + 1 ELSE waiting_from END
WHERE endpoint_id = $1 AND ordering_key = $2
RETURNING open, COALESCE(waiting_from, 0) AS waiting_from";

/// ... its first waiting delivery from number `$3` on made its head (due at once, or at the
/// retry it was waiting for when it lost the line: see [`HAND_ON_POSTGRES`])...
const HAND_ON_SQLITE: &str = "\
UPDATE webhook_deliveries
SET waiting = FALSE, updated_at = {now}, resume_at = NULL,
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL
                           ELSE MAX({now}, COALESCE(resume_at, {now})) END
WHERE id = (SELECT d.id FROM webhook_deliveries d
            WHERE d.endpoint_id = $1 AND d.ordering_key = $2 AND d.line_seq >= $3
              AND d.state = 'pending' AND d.waiting
            ORDER BY d.line_seq LIMIT 1)
RETURNING id, endpoint_id, line_seq";

/// ... and its bound moved past the new head (`$3`, NULL when none was found).
const MOVE_BOUND_SQLITE: &str = "\
UPDATE ordering_lines
SET waiting_from = MIN(COALESCE($3 + 1, last_seq + 1), last_seq + 1)
WHERE endpoint_id = $1 AND ordering_key = $2";

/// A line's head: the unsettled delivery that does not wait.
const HEAD: &str = "\
SELECT id FROM webhook_deliveries
WHERE endpoint_id = $1 AND ordering_key = $2 AND state IN ('pending', 'processing') AND NOT waiting
ORDER BY line_seq LIMIT 1";

/// Lines with nothing open, idle since before the cut-off `$1`, at most `$2` of them:
/// retention prunes their rows. `{skip_locked}`: on PostgreSQL a line another transaction
/// holds is left for the next run; one entered after this statement's snapshot has a count
/// or a time that no longer matches once its lock is granted, and is kept.
const PRUNE_IDLE: &str = "\
DELETE FROM ordering_lines
WHERE (endpoint_id, ordering_key) IN (
    SELECT endpoint_id, ordering_key FROM ordering_lines
    WHERE open = 0 AND updated_at < {after($1)} LIMIT $2 {skip_locked})
  AND open = 0 AND updated_at < {after($1)}";

/// A line: its endpoint and ordering key.
type Line = (Uuid, String);

/// A delivery entering its line, with the number it already has (a replayed one's).
type Entering = (Uuid, Option<i64>);

/// Where a delivery stands in its line once entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Its number in the line.
    pub line_seq: i64,
    /// Whether it waits behind the line's head.
    pub waiting: bool,
}

/// `key` checked as an ordering key: 1 to [`MAX_ORDERING_KEY_CHARS`] characters, none of
/// them a control character (`BAD_USER_INPUT` otherwise). A new submission's key is also
/// checked with [`refuse_reserved`].
pub fn validate(key: &str) -> Result<String> {
    let chars = key.chars().count();
    if chars == 0 || chars > MAX_ORDERING_KEY_CHARS {
        return Err(Error::bad_input(format!(
            "orderingKey must be 1 to {MAX_ORDERING_KEY_CHARS} characters, got {chars}"
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::bad_input(
            "orderingKey must not contain control characters",
        ));
    }
    Ok(key.to_owned())
}

/// Refuses (`BAD_USER_INPUT`) a new submission's ordering key that begins with `courier.`,
/// the prefix of the lines Courier's own events take (see [`operational::about_key`]): a
/// caller's delivery in one of those lines would hold Courier's events behind it. Checked
/// after an idempotent repeat is answered, so a repeat of a submission stored before the
/// prefix was reserved still gets it back.
pub fn refuse_reserved(key: Option<&str>) -> Result<()> {
    match key {
        Some(key) if key.starts_with(operational::RESERVED_PREFIX) => {
            Err(Error::bad_input(format!(
                "orderingKey must not begin with `{}`: that prefix is reserved for Courier's own events",
                operational::RESERVED_PREFIX
            )))
        }
        _ => Ok(()),
    }
}

/// The `{source}`-entering CTEs for a statement of `backend` (PostgreSQL only: SQLite has no
/// data-modifying CTEs and enters with [`enter`]), after a `WITH` and before the statement
/// that reads `line_places`.
pub fn enter_ctes(source: &str) -> String {
    fill(ENTER_CTES, &[("source", source)])
}

/// The deliveries `ids`, written earlier in `txn`, enter their lines (those without an
/// ordering key are left alone); returns the place of each that has a key.
pub async fn enter(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    ids: &[Uuid],
) -> std::result::Result<HashMap<Uuid, Place>, DbErr> {
    let mut places = HashMap::new();
    if ids.is_empty() {
        return Ok(places);
    }
    let clock = Clock::new(backend);
    if backend == DbBackend::Postgres {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql =
            SQL.get_or_init(|| fill(ENTER_POSTGRES, &[("enter_ctes", &enter_ctes("entering"))]));
        for row in txn
            .query_all_raw(clock.statement(sql, [Value::from(ids.to_vec())]))
            .await?
        {
            places.insert(
                row.try_get("", "id")?,
                Place {
                    line_seq: row.try_get("", "line_seq")?,
                    waiting: row.try_get("", "waiting")?,
                },
            );
        }
        return Ok(places);
    }
    let (list, values) = crate::db::Db::id_list(backend, 1, ids, false);
    let sql = fill(ENTERING_SQLITE, &[("ids", &list)]);
    let rows = txn
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?;
    let mut lines: BTreeMap<Line, Vec<Entering>> = BTreeMap::new();
    for row in &rows {
        lines
            .entry((
                row.try_get("", "endpoint_id")?,
                row.try_get("", "ordering_key")?,
            ))
            .or_default()
            .push((row.try_get("", "id")?, row.try_get("", "line_seq")?));
    }
    for ((endpoint_id, key), entering) in lines {
        let count = entering.len() as i64;
        let values = [endpoint_id.into(), key.into(), count.into()];
        let Some(line) = txn
            .query_one_raw(clock.statement(UPSERT_LINE_SQLITE, values))
            .await?
        else {
            return Err(DbErr::RecordNotFound(
                "an ordering line just upserted".into(),
            ));
        };
        let last_seq: i64 = line.try_get("", "last_seq")?;
        let open: i64 = line.try_get("", "open")?;
        for (place, (id, seq)) in (1..).zip(entering) {
            let placed = Place {
                line_seq: seq.unwrap_or(last_seq - count + place),
                waiting: open - count + place > 1,
            };
            let values = [id.into(), placed.line_seq.into(), placed.waiting.into()];
            txn.execute_raw(Statement::from_sql_and_values(
                backend,
                PLACE_SQLITE,
                values,
            ))
            .await?;
            places.insert(id, placed);
        }
    }
    Ok(places)
}

/// Each of `settled` (a line's endpoint and key, once per head that settled in `txn`) hands
/// its line on: the line's count drops and its first waiting delivery, if any, becomes its
/// head. Returns the deliveries made heads, with their endpoints.
///
/// The search for that delivery starts at the line's `waiting_from`, a number no delivery
/// waiting in the line is below (NULL: the start), so it is one index seek however many
/// deliveries the line has settled: their index entries stay until vacuum, and walking
/// past them made every hand-off slower as a line grew. The bound is kept by every change
/// to the line, each under the line's lock: a hand-off moves it past the new head, or past
/// the last number given out when nothing waits (a new delivery is numbered above that);
/// an emptied line likewise; a replay or resend, whose delivery keeps its old number, sets
/// it back to the start ([`rejoin`]).
pub async fn hand_on(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    settled: &[(Uuid, String)],
) -> std::result::Result<Vec<(Uuid, Uuid)>, DbErr> {
    if settled.is_empty() {
        return Ok(Vec::new());
    }
    let clock = Clock::new(backend);
    let mut heads = Vec::new();
    if backend == DbBackend::Postgres {
        let endpoints = Value::from(settled.iter().map(|(e, _)| *e).collect::<Vec<_>>());
        let keys = Value::from(settled.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>());
        let values = [endpoints, keys];
        txn.query_all_raw(Statement::from_sql_and_values(
            backend,
            LOCK_LINES_POSTGRES,
            values.clone(),
        ))
        .await?;
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| with_parking(DbBackend::Postgres, HAND_ON_POSTGRES));
        for row in txn.query_all_raw(clock.statement(sql, values)).await? {
            heads.push((row.try_get("", "id")?, row.try_get("", "endpoint_id")?));
        }
        return Ok(heads);
    }
    let mut lines: BTreeMap<(Uuid, &str), i64> = BTreeMap::new();
    for (endpoint_id, key) in settled {
        *lines.entry((*endpoint_id, key.as_str())).or_default() += 1;
    }
    let hand_on = with_parking(backend, HAND_ON_SQLITE);
    for ((endpoint_id, key), count) in lines {
        let values = [endpoint_id.into(), key.into(), count.into()];
        let Some(line) = txn
            .query_one_raw(clock.statement(LOWER_SQLITE, values))
            .await?
        else {
            continue;
        };
        let open: i64 = line.try_get("", "open")?;
        if open == 0 {
            continue;
        }
        let from: i64 = line.try_get("", "waiting_from")?;
        let values = [endpoint_id.into(), key.into(), from.into()];
        let head = txn.query_one_raw(clock.statement(&hand_on, values)).await?;
        let mut head_seq: Option<i64> = None;
        if let Some(row) = head {
            heads.push((row.try_get("", "id")?, row.try_get("", "endpoint_id")?));
            head_seq = Some(row.try_get("", "line_seq")?);
        }
        let values = [endpoint_id.into(), key.into(), head_seq.into()];
        txn.execute_raw(Statement::from_sql_and_values(
            backend,
            MOVE_BOUND_SQLITE,
            values,
        ))
        .await?;
    }
    Ok(heads)
}

/// The head of the line of `endpoint_id` and `key`, if it has one.
pub async fn head_of(
    conn: &impl ConnectionTrait,
    backend: DbBackend,
    endpoint_id: Uuid,
    key: &str,
) -> std::result::Result<Option<Uuid>, DbErr> {
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            HEAD,
            [endpoint_id.into(), key.into()],
        ))
        .await?;
    row.map(|row| row.try_get("", "id")).transpose()
}

/// Deletes up to `limit` idle lines (nothing open, untouched since the cut-off `before`,
/// a [`Clock::before`] value); returns how many. A line pruned and entered again starts its
/// numbering afresh, which orders nothing wrongly: every delivery it numbered is settled.
pub async fn prune_idle(
    conn: &impl ConnectionTrait,
    backend: DbBackend,
    before: Value,
    limit: i64,
) -> std::result::Result<u64, DbErr> {
    let skip_locked = match backend {
        DbBackend::Postgres => "FOR UPDATE SKIP LOCKED",
        _ => "",
    };
    let sql = fill(PRUNE_IDLE, &[("skip_locked", skip_locked)]);
    let statement = Clock::new(backend).statement(&sql, [before, limit.into()]);
    Ok(conn.execute_raw(statement).await?.rows_affected())
}

/// `key` as a header value: visible ASCII stays as it is; any other byte of its UTF-8 (and
/// `%` itself) is percent-encoded, so every key fits a header and decodes back exactly.
pub fn header_value(key: &str) -> String {
    let mut value = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' {
            value.push(char::from(byte));
        } else {
            value.push_str(&format!("%{byte:02X}"));
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_255_characters_without_control_characters() {
        assert!(validate("order-42").is_ok());
        assert!(validate(&"é".repeat(255)).is_ok());
        assert!(validate("").is_err());
        assert!(validate(&"k".repeat(256)).is_err());
        assert!(validate("a\nb").is_err());
    }

    #[test]
    fn header_values_keep_visible_ascii_and_encode_the_rest() {
        assert_eq!(header_value("order-42:paid"), "order-42:paid");
        assert_eq!(header_value("a b%c"), "a%20b%25c");
        assert_eq!(header_value("é"), "%C3%A9");
    }
}
