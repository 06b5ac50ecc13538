//! Steps 2 and 3 of a claim on PostgreSQL, one statement: claim each locked endpoint's due
//! rows within its free slots, and read what the claim left for it, with what to send for
//! each claimed row.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Value};
use uuid::Uuid;

use super::{attempts_bound, claim_from, retaken, ClaimRequest, Taken};
use crate::db::Db;
use crate::service::flow::{Facts, Standing};
use crate::worker::targets;

/// For each locked endpoint (`$1` ids, `$2` how many it may start, `$3` its cap): its
/// requests in flight now (less `$5`, this process's requests that have ended and wait to
/// be recorded) and the earliest of their leases; then its due rows in due order (`pending`
/// and due, or `processing` with an expired lease: a `processing` row's `next_attempt_at`
/// is its lease expiry), at most its free slots, locked skipping rows another transaction
/// holds; the UPDATE gives each a fresh token and a lease of `$4`, on the database's clock,
/// and counts a retaken lease as an attempt, up to the cycle's `$6`.
/// A row is claimed only if this UPDATE returned it. The statement starts after the turns
/// are locked, so it sees every claim committed before it.
///
/// The lock is the guard: `FOR UPDATE` evaluates the due conditions on the newest version
/// of each row it locks (a row changed since the statement's snapshot is re-checked, at
/// READ COMMITTED; at a stricter level the change is a serialization failure, retried),
/// and nothing can change a locked row before this statement commits. So the UPDATE finds
/// its rows by primary key alone: repeating the conditions there invites PostgreSQL, with
/// statistics taken when little was pending, to read every due row of the table through
/// the due index and match it against the batch, which with a large backlog cost a second
/// a claim.
///
/// Each endpoint comes back once per claimed row with what to send (see
/// [`crate::worker::targets`]), or once with no row, beside what the claim left it (see
/// [`Facts`]), read in the same snapshot: the earliest due time of the rows it did not
/// claim (`rest_due_at`; a claimed row's is its new lease), and its requests in flight
/// before the claim with the earliest of their leases. The rows it claimed are left out by
/// their ids, gathered once per endpoint (`taken`): a row-by-row look into `due` cost as much
/// as the update itself when a claim took 64 rows. Reading them in a statement of
/// their own cost a round trip on every claim; what that statement could see besides
/// (an outcome recorded meanwhile) only ever made a slot look taken, and the recorder
/// wakes an endpoint once its outcomes commit (see [`crate::service::flow`]).
const CLAIM: &str = "\
WITH turns AS MATERIALIZED (
    SELECT t.endpoint_id, t.wanted, t.cap, f.in_flight, f.lease_min
    FROM unnest($1::uuid[], $2::int[], $3::int[]) AS t(endpoint_id, wanted, cap)
    CROSS JOIN LATERAL (
        SELECT COUNT(*) AS in_flight, MIN(p.next_attempt_at) AS lease_min
        FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND {in_flight(p)} AND p.id <> ALL($5::uuid[])
    ) f
), due AS MATERIALIZED (
    SELECT d.id, d.state AS previous_state, d.submission_id, d.endpoint_id
    FROM turns CROSS JOIN LATERAL (
        SELECT d.id, d.state, d.submission_id, d.endpoint_id FROM webhook_deliveries d
        WHERE d.endpoint_id = turns.endpoint_id AND {due(d)}
        ORDER BY d.next_attempt_at
        LIMIT GREATEST(0, LEAST(turns.wanted, turns.cap - turns.in_flight))
        FOR UPDATE OF d SKIP LOCKED
    ) d
), claimed AS (
    UPDATE webhook_deliveries AS w
    SET state = 'processing', claim_token = gen_random_uuid(), claim_expires_at = {after($4)},
        next_attempt_at = {after($4)}, updated_at = {now},
        cycle_attempts = LEAST(w.cycle_attempts + {retaken}, $6::int4)
    FROM due
    JOIN submissions s ON s.id = due.submission_id
    JOIN endpoints e ON e.id = due.endpoint_id
    WHERE w.id = due.id
    RETURNING w.id, w.claim_token, w.cycle_attempts, w.endpoint_id, w.submission_id,
              w.created_at, w.claim_expires_at, w.updated_at, w.ordering_key, w.event_type,
              due.previous_state, {target_columns}
), taken AS MATERIALIZED (
    SELECT due.endpoint_id, array_agg(due.id) AS ids FROM due GROUP BY due.endpoint_id
), rest AS MATERIALIZED (
    SELECT turns.endpoint_id, turns.in_flight, turns.lease_min,
           (SELECT d.next_attempt_at FROM webhook_deliveries d
            WHERE d.endpoint_id = turns.endpoint_id AND d.state IN ('pending', 'processing')
              AND d.next_attempt_at IS NOT NULL
              AND d.id <> ALL(COALESCE(taken.ids, '{}'::uuid[]))
            ORDER BY d.next_attempt_at LIMIT 1) AS rest_due_at
    FROM turns LEFT JOIN taken ON taken.endpoint_id = turns.endpoint_id
)
SELECT rest.endpoint_id AS turn_endpoint_id, rest.in_flight AS in_flight_before,
       rest.lease_min AS lease_min_before, rest.rest_due_at, claimed.*
FROM rest LEFT JOIN claimed ON claimed.endpoint_id = rest.endpoint_id";

/// What one claim statement did: the rows it claimed, their rows (with what to send), and
/// what it left each endpoint.
pub(super) struct ClaimedHere {
    pub taken: Vec<Taken>,
    pub rows: Vec<QueryResult>,
    pub facts: HashMap<Uuid, Facts>,
}

/// Steps 2 and 3: claims up to `wants` of each of `standings` (a want of 0 claims nothing
/// and still reads the endpoint's facts) for the `request`'s lease, leaving its ended
/// requests out of in-flight counts.
pub(super) async fn claim(
    txn: &DatabaseTransaction,
    db: &Db,
    standings: &[Standing],
    wants: &[u32],
    request: &ClaimRequest,
) -> Result<ClaimedHere, DbErr> {
    let wanted: Vec<(Uuid, i32, i32)> = standings
        .iter()
        .zip(wants)
        .map(|(s, want)| {
            let cap = i32::try_from(s.max_in_flight).unwrap_or(i32::MAX);
            (s.endpoint_id, i32::try_from(*want).unwrap_or(i32::MAX), cap)
        })
        .collect();
    let returned = txn
        .query_all_raw(statement(
            db,
            &wanted,
            request.lease,
            &request.ended.ended,
            attempts_bound(request),
        ))
        .await?;
    let mut taken = Vec::with_capacity(returned.len());
    let mut facts: HashMap<Uuid, Facts> = HashMap::with_capacity(standings.len());
    let mut rows = Vec::with_capacity(returned.len());
    for row in returned {
        let endpoint_id: Uuid = row.try_get("", "turn_endpoint_id")?;
        let entry = match facts.entry(endpoint_id) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(Facts {
                taken: 0,
                due_at: row.try_get("", "rest_due_at")?,
                in_flight: row.try_get("", "in_flight_before")?,
                lease_min: row.try_get("", "lease_min_before")?,
            }),
        };
        let id: Option<Uuid> = row.try_get("", "id")?;
        if id.is_none() {
            continue;
        }
        let previous: DeliveryState = row.try_get("", "previous_state")?;
        let (claim, at) = claim_from(&row, previous)?;
        // The claimed row is in flight now, until its new lease.
        let lease = Some(claim.lease_expires_at);
        entry.taken += 1;
        entry.in_flight += 1;
        entry.due_at = earliest(entry.due_at, lease);
        entry.lease_min = earliest(entry.lease_min, lease);
        taken.push((claim, at));
        rows.push(row);
    }
    Ok(ClaimedHere { taken, rows, facts })
}

/// The earlier of two optional times.
fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// [`CLAIM`] for `wanted` (endpoint, how many, cap).
fn statement(
    db: &Db,
    wanted: &[(Uuid, i32, i32)],
    lease: Duration,
    ended: &[Uuid],
    attempts_bound: i32,
) -> sea_orm::Statement {
    let clock = db.clock();
    let values = [
        Value::from(wanted.iter().map(|w| w.0).collect::<Vec<_>>()),
        Value::from(wanted.iter().map(|w| w.1).collect::<Vec<_>>()),
        Value::from(wanted.iter().map(|w| w.2).collect::<Vec<_>>()),
        clock.after(lease),
        Value::from(ended.to_vec()),
        Value::from(attempts_bound),
    ];
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        crate::db::sql::fill(
            &targets::with_columns(CLAIM, ""),
            &[("retaken", &retaken("due.previous_state"))],
        )
    });
    clock.statement(sql, values)
}

/// Prepares and plans the statement on `txn`'s connection, asking for nothing: nothing is
/// locked or written.
pub(super) async fn warm(txn: &DatabaseTransaction, db: &Db) -> Result<(), DbErr> {
    txn.query_all_raw(statement(db, &[], Duration::from_secs(1), &[], i32::MAX))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_of_two_optional_times_ignores_a_missing_one() {
        let early = DateTime::<Utc>::from_timestamp(1_000, 0);
        let late = DateTime::<Utc>::from_timestamp(2_000, 0);
        assert_eq!(earliest(early, late), early);
        assert_eq!(earliest(late, early), early);
        assert_eq!(earliest(None, late), late);
        assert_eq!(earliest(early, None), early);
        assert_eq!(earliest(None, None), None);
    }
}
