//! Parking, one rule in one place: a delivery whose endpoint is disabled has no due time
//! (`next_attempt_at IS NULL`), so no claim ever scans past it, until re-enabling makes it
//! due again. Every statement that gives a delivery a due time asks this rule. (A delivery
//! waiting behind its ordering line's head has no due time either, and re-enabling leaves it
//! waiting: see [`crate::service::lines`].)

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

/// Renders `{parked(X)}` in `template`, where `X` is the SQL naming a delivery's
/// endpoint id, as a boolean: whether that endpoint is disabled. On PostgreSQL the endpoint
/// row is read `FOR SHARE`: a disable holds it `FOR UPDATE` until it has parked the
/// backlog, so a statement racing it either waits and then sees it disabled, or goes first
/// and leaves a row the disable then parks. Never a due row after the disable commits.
/// (SQLite's write transactions already exclude each other.)
///
/// `{disabled(X)}` is the same question without the lock, for a claim's first look: a claim
/// gives no row a due time (it makes the row `processing`, which the disable's parking
/// leaves alone), so a claim that reads the endpoint as enabled is simply ordered before a
/// disable, and a lease that later expires meets the rule again. Only when it reads the
/// endpoint as disabled does the claim ask `{parked(X)}`, which waits for a re-enable in
/// flight and reads what it committed, so a claim never parks a row behind a re-enable. The
/// common case then costs no row lock on the endpoint per claimed delivery (nor the
/// multixacts of many workers share-locking one endpoint).
///
/// The rule for a statement that writes many rows at once is spelled `{enabled_join(X)}`:
/// each row joined to its endpoint when that endpoint is enabled; `{lock_enabled}` (at the
/// end of that `SELECT`) share-locks every such endpoint once, in id order, instead of once
/// per row as `{parked(X)}` would.
pub fn with_parking(backend: DbBackend, template: &str) -> String {
    let postgres = backend == DbBackend::Postgres;
    let read = |endpoint: &str, lock: bool| {
        let lock = if lock && postgres { " FOR SHARE" } else { "" };
        format!(
            "(SELECT parking.disabled FROM endpoints parking WHERE parking.id = {endpoint}{lock})"
        )
    };
    super::sql::render(template, |name, arg| match (name, arg) {
        ("parked", Some(endpoint)) => Some(read(endpoint, true)),
        ("disabled", Some(endpoint)) => Some(read(endpoint, false)),
        ("enabled_join", Some(endpoint)) => Some(format!(
            "JOIN endpoints parking ON parking.id = {endpoint} AND NOT parking.disabled"
        )),
        ("lock_enabled", None) if postgres => {
            Some("ORDER BY parking.id FOR SHARE OF parking".into())
        }
        ("lock_enabled", None) => Some(String::new()),
        _ => None,
    })
}

/// PostgreSQL: locks the endpoints of the deliveries `$1` (a `uuid[]`) once each, in id
/// order, as a recording locks the endpoints it writes (`FOR NO KEY UPDATE`, which holds off
/// a disable as the parking rule's share lock does): run before any of the deliveries is
/// locked, by work that restarts many of them and asks `{parked(X)}` of them. Such work on
/// one endpoint then takes turns with the endpoint's recordings and with other such work:
/// each rejoins or hands on the endpoint's lines (ordering keys), updating rows of the line
/// in its own order, and two holding the endpoint at once (a share lock each) deadlocked on
/// those rows.
const LOCK_ENDPOINTS_OF: &str = "\
SELECT id FROM endpoints
WHERE id IN (SELECT endpoint_id FROM webhook_deliveries WHERE id = ANY($1::uuid[]))
ORDER BY id
FOR NO KEY UPDATE";

/// Takes [`LOCK_ENDPOINTS_OF`] for the deliveries `ids` in `txn` (PostgreSQL; SQLite's
/// write transactions already exclude each other).
pub async fn lock_endpoints_of(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    ids: &[Uuid],
) -> Result<(), DbErr> {
    if backend == DbBackend::Postgres {
        txn.execute_raw(Statement::from_sql_and_values(
            backend,
            LOCK_ENDPOINTS_OF,
            [Value::from(ids.to_vec())],
        ))
        .await?;
    }
    Ok(())
}

/// PostgreSQL: share-locks the endpoints `$1` (a `uuid[]`) once each, in id order, for
/// work that then asks `{parked(X)}` of deliveries one by one in another order (claims
/// handed back): the endpoints are taken before the deliveries, as replays and recordings
/// take them, so such work never holds a delivery while it waits for an endpoint.
pub const SHARE_ENDPOINTS: &str = "\
SELECT id FROM endpoints WHERE id = ANY($1::uuid[]) ORDER BY id FOR SHARE";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_reads_the_endpoint_under_a_share_lock_on_postgres() {
        let template = "CASE WHEN {parked(d.endpoint_id)} THEN NULL ELSE {now} END";
        assert_eq!(
            with_parking(DbBackend::Postgres, template),
            "CASE WHEN (SELECT parking.disabled FROM endpoints parking \
             WHERE parking.id = d.endpoint_id FOR SHARE) THEN NULL ELSE {now} END"
        );
        assert_eq!(
            with_parking(DbBackend::Sqlite, template),
            "CASE WHEN (SELECT parking.disabled FROM endpoints parking \
             WHERE parking.id = d.endpoint_id) THEN NULL ELSE {now} END"
        );
        assert_eq!(
            with_parking(
                DbBackend::Postgres,
                "SELECT i.* FROM i {enabled_join(i.endpoint_id)} {lock_enabled}"
            ),
            "SELECT i.* FROM i JOIN endpoints parking ON parking.id = i.endpoint_id \
             AND NOT parking.disabled ORDER BY parking.id FOR SHARE OF parking"
        );
        assert_eq!(
            with_parking(DbBackend::Postgres, "{disabled(d.endpoint_id)}"),
            "(SELECT parking.disabled FROM endpoints parking WHERE parking.id = d.endpoint_id)"
        );
    }
}
