//! The claim at submit made by the statement that stores the submission (PostgreSQL, a
//! submission without an ordering key): one round trip, whose commit is the only one
//! before the request leaves.
//!
//! The statement stores the delivery already claimed (`processing`, with a fresh token and
//! a lease, on the database's clock) when its endpoint has room under the same rules as any
//! claim (see [`crate::service::flow`]): enabled, not paused or held, a free slot under its
//! cap (this process's ended requests left out), and nothing older due first. It takes the
//! endpoint's turn as a claim does (`FOR UPDATE SKIP LOCKED`), and counts what is in flight
//! in its own snapshot, which may predate a claim that committed while it ran: so it claims
//! only if the turn it locked is the very version its snapshot holds. Every claim writes
//! its endpoints' turns in the transaction that claims, so an unchanged turn means no claim
//! committed since the snapshot (and a turn another claim holds is skipped, as any claim
//! skips it). A rate-limited endpoint is left to an ordinary claim: its limiter's rule is
//! [`crate::service::flow::Rate`]'s alone.
//!
//! The claim moves the endpoint's turn to no later than its lease and marks it served; the
//! next claim to look computes the turn in full (a turn set early only costs a look).

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Value};

use crate::bus::StateChange;
use crate::db::sql::fill;
use crate::db::Db;
use crate::worker::claim::{claimed_in_store, left_full, ClaimRequest, Claimed};
use crate::worker::targets;
use entity::webhook_delivery::DeliveryState;

use super::store::{reported_by_row, store_statement, Notify, Prepared, Reported};

/// The room a submission's endpoint has for it (the `{room}` slot of the store statement;
/// only ever for a statement of one row, without an ordering key):
/// `{cap}` is the cap of endpoints that set none, `{lease}` the lease's end (an
/// `{after(X)}`), `{ended}` this process's ended requests. The endpoint is read under a share
/// lock (the newest version), its turn locked skipping one another claim holds.
const ROOM: &str = "\
claim_endpoint AS MATERIALIZED (
    SELECT e.id, e.max_in_flight, e.rate_limit, e.paused_until, e.disabled, e.url,
           e.signing_secret, e.previous_signing_secret, e.previous_secret_expires_at
    FROM endpoints e WHERE e.id IN (SELECT endpoint_id FROM valid WHERE ordering_key = '')
      AND (SELECT COUNT(*) FROM input) = 1
    FOR SHARE OF e
), claim_turn AS MATERIALIZED (
    SELECT f.endpoint_id, f.xmin AS version, f.blocked_until
    FROM endpoint_flow f WHERE f.endpoint_id IN (SELECT id FROM claim_endpoint)
    FOR UPDATE OF f SKIP LOCKED
), claim_standing AS MATERIALIZED (
    SELECT t.endpoint_id, n.in_flight, COALESCE(e.max_in_flight, {cap}) AS cap,
           EXISTS (SELECT 1 FROM endpoint_flow seen
                   WHERE seen.endpoint_id = t.endpoint_id AND seen.xmin = t.version) AS unchanged,
           NOT e.disabled AND e.rate_limit IS NULL
             AND (e.paused_until IS NULL OR e.paused_until <= {now})
             AND (t.blocked_until IS NULL OR t.blocked_until <= {now})
             AND NOT EXISTS (
                 SELECT 1 FROM webhook_deliveries d
                 WHERE d.endpoint_id = t.endpoint_id AND {due(d)}) AS open
    FROM claim_turn t JOIN claim_endpoint e ON e.id = t.endpoint_id
    CROSS JOIN LATERAL (
        SELECT COUNT(*) AS in_flight FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND {in_flight(p)} AND p.id <> ALL({ended})
    ) n
), room AS MATERIALIZED (
    SELECT endpoint_id, gen_random_uuid() AS token, {lease} AS lease
    FROM claim_standing WHERE unchanged AND open AND in_flight < cap
)";

/// The other forms of the store statement claim nothing.
const NO_ROOM: &str = "room (endpoint_id, token, lease) AS \
     (SELECT NULL::uuid, NULL::uuid, NULL::timestamptz WHERE FALSE)";

/// The claim's write besides the row: its endpoint's turn, served now and due no later
/// than the lease.
const CLAIM_WRITES: &str = ", turned AS (
    UPDATE endpoint_flow f
    SET served_at = {now},
        turn_at = CASE WHEN f.turn_at IS NULL OR f.turn_at > d.claim_expires_at
                       THEN d.claim_expires_at ELSE f.turn_at END
    FROM stored_deliveries d
    WHERE d.claim_token IS NOT NULL AND f.endpoint_id = d.endpoint_id
)";

/// What each row reports of its claim: the claim (`claim`: `claimed`; `full`: the endpoint
/// had no free slot; `other`: no claim for another reason), the endpoint's requests in
/// flight before it and its cap, and the claimed row's columns with what to send.
const CLAIM_COLUMNS: &str = ",
       stored_deliveries.claim_token, stored_deliveries.claim_expires_at,
       CASE WHEN stored_deliveries.claim_token IS NOT NULL THEN 'claimed'
            WHEN claim_standing.unchanged AND claim_standing.in_flight >= claim_standing.cap
            THEN 'full' ELSE 'other' END AS claim,
       claim_standing.in_flight AS in_flight_before, claim_standing.cap,
       0 AS cycle_attempts, input.endpoint_id, input.submission_id,
       NULLIF(input.ordering_key, '') AS ordering_key, NULLIF(input.event_type, '') AS event_type,
       stored_deliveries.created_at AS updated_at,
       {target_columns}";

/// The joins [`CLAIM_COLUMNS`] reads: the standing, and `e` and `s` as the target columns
/// name the endpoint and the submission.
const CLAIM_JOINS: &str = "
LEFT JOIN claim_standing ON claim_standing.endpoint_id = input.endpoint_id
LEFT JOIN claim_endpoint e
    ON e.id = input.endpoint_id AND stored_deliveries.claim_token IS NOT NULL
CROSS JOIN LATERAL (
    SELECT NULL::uuid AS event_id, input.payload,
           NULLIF(input.trace_context, '') AS trace_context
) s";

/// The changes the claiming statement publishes: each creation, then the claim of a
/// claimed one (`{processing}`: its wire form), stamped with the stored time.
const STORED_CHANGES: &str = "\
SELECT change.wire, change.at FROM (
    SELECT input.event AS wire, d.created_at AS at, 0 AS step
    FROM input JOIN stored_deliveries d ON d.id = input.delivery_id
    UNION ALL
    SELECT {processing} AS wire, d.created_at AS at, 1 AS step
    FROM stored_deliveries d WHERE d.claim_token IS NOT NULL
) change ORDER BY change.step";

/// The slots of the claiming form of the store statement, its own parameters numbered
/// from `first`: the cap of endpoints that set none, the lease, this process's ended
/// requests, and the wire form of the claim's change.
pub(super) fn slots(first: usize) -> Vec<(&'static str, String)> {
    let room = fill(
        ROOM,
        &[
            ("cap", &format!("${first}::int")),
            ("lease", &format!("{{after(${})}}", first + 1)),
            ("ended", &format!("${}::uuid[]", first + 2)),
        ],
    );
    vec![
        ("room", room),
        ("claim_writes", CLAIM_WRITES.to_owned()),
        ("claim_columns", targets::with_columns(CLAIM_COLUMNS, "")),
        ("claim_joins", CLAIM_JOINS.to_owned()),
    ]
}

/// The query of the changes the claiming form publishes, its parameters numbered as in
/// [`slots`].
pub(super) fn stored_changes(first: usize) -> String {
    fill(
        STORED_CHANGES,
        &[("processing", &format!("${}::text", first + 3))],
    )
}

/// The slots of the other forms: no room, so nothing is claimed.
pub(super) fn no_room() -> Vec<(&'static str, String)> {
    vec![
        ("room", NO_ROOM.to_owned()),
        ("claim_writes", String::new()),
        ("claim_columns", String::new()),
        ("claim_joins", String::new()),
    ]
}

/// What the claiming statement did beyond storing.
#[derive(Debug)]
pub enum ClaimInStore {
    /// It claimed the new delivery: the claim, ready for the worker.
    Claimed(Box<Claimed>),
    /// The endpoint had no free slot (its cap given, with the ended requests the statement
    /// left out): nothing to claim until one of its requests ends.
    Full(Box<Claimed>),
    /// No claim, for another reason (a rate limit, a pause, older work due, its turn held
    /// or changed by another claim meanwhile): an ordinary claim decides.
    Other,
    /// Nothing was stored.
    NotStored,
}

/// Stores `prepared` (no ordering key) in one statement, committed on its own, claiming
/// its delivery under `request` when its endpoint has room. What its row reported, and the
/// claim.
pub(super) async fn store_and_claim(
    db: &Db,
    prepared: &Prepared,
    request: &ClaimRequest,
) -> Result<(Option<Reported>, ClaimInStore), DbErr> {
    if prepared.submission.ordering_key.is_some() {
        return Err(DbErr::Custom(
            "a submission with an ordering key is claimed in its transaction".into(),
        ));
    }
    let processing = StateChange {
        delivery_id: prepared.delivery.id,
        endpoint_id: prepared.delivery.endpoint_id,
        previous_state: Some(DeliveryState::Pending),
        state: DeliveryState::Processing,
        at: prepared.created.at,
    };
    let cap = i32::try_from(request.default_max_in_flight).unwrap_or(i32::MAX);
    let processing = processing.to_wire()?;
    let rows = db
        .autocommit(|| {
            let claim = claim_values(db, cap, request, processing.clone());
            store_statement(std::slice::from_ref(prepared), Notify::Claiming, claim)
        })
        .await?;
    let reported = reported_by_row(&rows)?.remove(&prepared.delivery.id);
    let Some(row) = rows.into_iter().next() else {
        return Ok((reported, ClaimInStore::NotStored));
    };
    if !matches!(reported, Some(Reported::Created(..))) {
        return Ok((reported, ClaimInStore::NotStored));
    }
    let verdict: String = row.try_get("", "claim")?;
    let claim = match verdict.as_str() {
        "claimed" => {
            let (in_flight, cap) = standing(&row)?;
            // Full once this one is in flight: looked at again when enough of its requests end.
            let full = in_flight.saturating_add(1) >= i64::from(cap);
            ClaimInStore::Claimed(Box::new(claimed_in_store(
                row,
                full.then_some(cap),
                request,
            )?))
        }
        "full" => {
            let (_, cap) = standing(&row)?;
            let endpoint_id = prepared.delivery.endpoint_id;
            ClaimInStore::Full(Box::new(left_full(endpoint_id, cap, request)))
        }
        _ => ClaimInStore::Other,
    };
    Ok((reported, claim))
}

/// The endpoint's requests in flight before the claim, and its cap, as `row` reports them.
fn standing(row: &QueryResult) -> Result<(i64, u32), DbErr> {
    let in_flight: i64 = row.try_get("", "in_flight_before")?;
    let cap: i32 = row.try_get("", "cap")?;
    Ok((in_flight, u32::try_from(cap).unwrap_or(u32::MAX)))
}

/// The claiming form's own parameters (see [`slots`]).
fn claim_values(db: &Db, cap: i32, request: &ClaimRequest, processing: String) -> [Value; 4] {
    [
        Value::from(cap),
        db.clock().after(request.lease),
        Value::from(request.ended.ended.clone()),
        Value::from(processing),
    ]
}

/// Prepares and plans the claiming form on `txn`'s connection, with no rows: nothing is
/// written.
pub(super) async fn warm(txn: &DatabaseTransaction, db: &Db) -> Result<(), DbErr> {
    let request = ClaimRequest {
        lease: std::time::Duration::from_secs(1),
        ..ClaimRequest::default()
    };
    let claim = claim_values(db, 1, &request, String::new());
    txn.query_all_raw(store_statement(&[], Notify::Claiming, claim)?)
        .await?;
    Ok(())
}
