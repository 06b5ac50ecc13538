//! The statements of fair share and flow control: waking an endpoint's turn (in the
//! statement or transaction that made its work due), the sweep that looks again, a new
//! endpoint's row, a settings change, and a `Retry-After` pause.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Value};
use uuid::Uuid;

use crate::db::sql::fill;
use crate::db::{Clock, Db};

/// The soonest a sleeping endpoint `{x}` (a flow row) can be served: now, or once a
/// pause or its rate limit lets it go.
const FLOOR: &str = "CASE WHEN {x}.blocked_until > {now} THEN {x}.blocked_until ELSE {now} END";

/// The turn a woken endpoint `{x}` takes: when it was last served, so it goes ahead of every
/// endpoint served since (round robin: least recently served first), unless a pause or its
/// rate limit holds it back.
const WOKEN_TURN: &str = "CASE WHEN {x}.blocked_until > {now} THEN {x}.blocked_until \
     WHEN {x}.served_at IS NULL OR {x}.served_at > {now} THEN {now} ELSE {x}.served_at END";

/// Whether the flow row `{x}` sleeps: its turn is further off than its floor.
const ASLEEP: &str = "({x}.turn_at IS NULL OR {x}.turn_at > {floor})";

fn woken_turn(row: &str) -> String {
    fill(WOKEN_TURN, &[("x", row)])
}

fn asleep(row: &str) -> String {
    let floor = fill(FLOOR, &[("x", row)]);
    fill(ASLEEP, &[("floor", &floor), ("x", row)])
}

/// The statement that wakes the endpoints listed by the SQL `endpoints` (a subquery or a
/// list of ids): each that sleeps becomes ready, taking its turn by when it was last
/// served. It writes nothing for an
/// endpoint already ready, so the common case costs no row lock. On PostgreSQL the rows it
/// writes are locked in id order, so concurrent wakers cannot deadlock; it waits for a claim
/// holding the row, then decides on what that claim wrote. Usable as a data-modifying CTE.
pub fn wake(backend: DbBackend, endpoints: &str) -> String {
    match backend {
        DbBackend::Postgres => format!(
            "UPDATE endpoint_flow SET turn_at = {turn} WHERE endpoint_id IN (\
             SELECT woken.endpoint_id FROM endpoint_flow woken \
             WHERE woken.endpoint_id IN ({endpoints}) AND {asleep} \
             ORDER BY woken.endpoint_id FOR UPDATE)",
            turn = woken_turn("endpoint_flow"),
            asleep = asleep("woken"),
        ),
        _ => format!(
            "UPDATE endpoint_flow SET turn_at = {turn} \
             WHERE endpoint_id IN ({endpoints}) AND {asleep}",
            turn = woken_turn("endpoint_flow"),
            asleep = asleep("endpoint_flow"),
        ),
    }
}

/// Wakes the sleeping endpoints that have due work and a free slot: all of them (the
/// backstop sweep), or with `{only}` those a claim just put to sleep. `$1` is the default
/// cap. Rows a claim holds are skipped: that claim decides their turn, and looks again
/// itself if it puts them to sleep.
const SWEEP: &str = "\
UPDATE endpoint_flow SET turn_at = {turn}
WHERE endpoint_id IN (
    SELECT f.endpoint_id FROM endpoint_flow f JOIN endpoints e ON e.id = f.endpoint_id
    WHERE {asleep} AND NOT e.disabled {only}
      AND EXISTS (
          SELECT 1 FROM webhook_deliveries d
          WHERE d.endpoint_id = f.endpoint_id AND {due(d)})
      AND (SELECT COUNT(*) FROM webhook_deliveries p
           WHERE p.endpoint_id = f.endpoint_id AND {in_flight(p)}) < COALESCE(e.max_in_flight, $1)
    ORDER BY f.endpoint_id {lock})";

/// The sweep statement for `backend` (wake the sleeping endpoints with due work and a
/// free slot), over every endpoint or (`only`: the SQL of a list of ids, such
/// as `= ANY($2::uuid[])` or `IN ($2, $3)`) some.
pub fn sweep(backend: DbBackend, only: Option<&str>) -> String {
    let lock = match backend {
        DbBackend::Postgres => "FOR UPDATE OF f SKIP LOCKED",
        _ => "",
    };
    let only = only.map_or_else(String::new, |ids| format!("AND f.endpoint_id {ids}"));
    fill(
        SWEEP,
        &[
            ("turn", &woken_turn("endpoint_flow")),
            ("asleep", &asleep("f")),
            ("only", &only),
            ("lock", lock),
        ],
    )
}

/// A new endpoint's row: nothing due yet; it takes its first turn by its creation.
pub const INSERT_FLOW: &str =
    "INSERT INTO endpoint_flow (endpoint_id, served_at) VALUES ($1, {now})";

/// Re-enabled (an operator's "go"): the endpoint is looked at afresh, its limiter starts
/// over and any hold ends (a pause is read from the endpoint itself, where enabling lifts it).
pub const FLOW_RESTARTED: &str = "UPDATE endpoint_flow \
     SET rate_tat = NULL, blocked_until = NULL, turn_at = {now} WHERE endpoint_id = $1";

/// After its cap changed, an endpoint is looked at afresh by the next claim on any process
/// (which reads the cap from the endpoint). Its rate limiter's schedule and any hold stand:
/// a `Retry-After` not yet recorded still holds every process off.
pub const CAP_CHANGED: &str = "UPDATE endpoint_flow SET turn_at = {now} WHERE endpoint_id = $1";

/// After its rate limit changed: as [`CAP_CHANGED`], and the limiter's schedule runs no
/// later than one interval of the new limit from now (`$2`, bound by `Clock::after_opt`;
/// NULL when the limit was lifted, which clears the schedule). A lower limit keeps the
/// schedule and spaces the next starts by its own interval, never sooner. A hold stands: a
/// `Retry-After` not yet recorded, or the old limit's wait, at most one of its intervals.
pub const RATE_CHANGED: &str = "UPDATE endpoint_flow \
     SET rate_tat = CASE WHEN {after($2)} IS NULL OR rate_tat > {after($2)} \
                         THEN {after($2)} ELSE rate_tat END, \
         turn_at = {now} \
     WHERE endpoint_id = $1";

/// The moment a `429` or `503` with `Retry-After` comes back, before its outcome is
/// recorded: the endpoint's turn is held back for `$2` from now (database clock), unless a
/// longer hold stands, so no claim on any process starts another request to it meanwhile.
/// The recording then pauses the endpoint itself ([`PAUSE_ENDPOINT`], [`PAUSE_TURN`]),
/// which is what `pausedUntil` shows and `courier.endpoint.paused` announces.
pub const HOLD_TURN: &str = "UPDATE endpoint_flow \
     SET blocked_until = CASE WHEN blocked_until > {after($2)} THEN blocked_until \
                              ELSE {after($2)} END, \
         turn_at = CASE WHEN turn_at IS NULL OR turn_at > {after($2)} THEN turn_at \
                        ELSE {after($2)} END \
     WHERE endpoint_id = $1";

/// A `429` or `503` with `Retry-After` pauses the whole endpoint until `$2` from now on the
/// database's clock (shown as `pausedUntil`); a longer pause already set stands.
pub const PAUSE_ENDPOINT: &str = "UPDATE endpoints SET paused_until = {after($2)} \
     WHERE id = $1 AND (paused_until IS NULL OR paused_until < {after($2)}) \
     RETURNING paused_until";

/// The paused endpoint's turn waits for the pause (`$2`, the moment [`PAUSE_ENDPOINT`]
/// stored): no claim on any process starts anything for it before then. A longer hold
/// stands: another `Retry-After` of the endpoint, answered before this one was recorded,
/// whose own recording is still to come.
pub const PAUSE_TURN: &str = "UPDATE endpoint_flow \
     SET blocked_until = CASE WHEN blocked_until > $2 THEN blocked_until ELSE $2 END, \
         turn_at = CASE WHEN turn_at IS NULL OR turn_at > $2 THEN turn_at ELSE $2 END \
     WHERE endpoint_id = $1";

/// Wakes `endpoints` inside `txn` (see [`wake`]), in the transaction that made their work due.
pub async fn wake_endpoints(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    endpoints: &[Uuid],
) -> Result<(), DbErr> {
    let mut endpoints = endpoints.to_vec();
    endpoints.sort();
    endpoints.dedup();
    if endpoints.is_empty() {
        return Ok(());
    }
    let (list, values) = match backend {
        DbBackend::Postgres => (
            "SELECT unnest($1::uuid[])".to_owned(),
            vec![Value::from(endpoints)],
        ),
        _ => (
            Db::placeholders(1, endpoints.len()),
            endpoints.into_iter().map(Value::from).collect(),
        ),
    };
    let sql = wake(backend, &list);
    txn.execute_raw(Clock::new(backend).statement(&sql, values))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wake_and_sweep_statements_render_for_both_backends() {
        let pg = wake(DbBackend::Postgres, "SELECT endpoint_id FROM stored");
        assert!(pg.contains("ORDER BY woken.endpoint_id FOR UPDATE"), "{pg}");
        assert!(
            pg.contains("woken.turn_at IS NULL OR woken.turn_at > CASE WHEN woken.blocked_until")
        );
        let sqlite = wake(DbBackend::Sqlite, "$1");
        assert!(
            !sqlite.contains("FOR UPDATE") && !sqlite.contains("{x}"),
            "{sqlite}"
        );
        assert!(!sqlite.contains("{floor}"), "{sqlite}");
        let sweep_pg = sweep(DbBackend::Postgres, Some("= ANY($2::uuid[])"));
        assert!(sweep_pg.contains("AND f.endpoint_id = ANY($2::uuid[])"));
        assert!(sweep_pg.contains("FOR UPDATE OF f SKIP LOCKED"));
        assert!(!sweep(DbBackend::Sqlite, None).contains("{only}"));
    }
}
