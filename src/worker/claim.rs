//! Claiming due deliveries (race 1): each due row goes to exactly one worker, whatever the
//! number of processes, only with a fresh claim token and lease, and within its endpoint's
//! cap, rate limit and pause, with free slots shared round robin across endpoints (the rules
//! are in [`crate::service::flow`]).
//!
//! A claim is one transaction: lock the turns of the ready endpoints, longest waiting first
//! (`FOR UPDATE SKIP LOCKED`: claims for one endpoint take turns across processes); claim
//! each one's due rows in due order, as many as its share and its free slots allow (counted
//! by this second statement, which starts after the locks are held and so sees every claim
//! committed before it); read what that left; and set each endpoint's next turn.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult, Value};
use uuid::Uuid;

use super::targets::{self, load_targets, Target};
use crate::db::{Clock, Db};
use crate::events::{Events, StateChange};
use crate::secrets::SecretKeys;
use crate::service::flow::{self, Facts, Rate, Standing, Turn};
use crate::service::parking::with_parking;

/// Most endpoints one claim takes turns from.
const MAX_TURNS: u32 = 32;

/// The cap on requests in flight of an endpoint that sets none, when the caller names none.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 32;

/// Step 1: the ready endpoints' turns, longest waiting first, locked (PostgreSQL: skipping
/// turns another claim holds, never waiting), with what limits them. `$1`: the most to take.
const LOCK_TURNS: &str = "\
SELECT f.endpoint_id, f.rate_tat, f.served_at, e.paused_until, e.max_in_flight, e.rate_limit,
       e.disabled, {now} AS now
FROM endpoint_flow f JOIN endpoints e ON e.id = f.endpoint_id
WHERE f.turn_at <= {now}
ORDER BY f.turn_at, f.endpoint_id
LIMIT $1 {lock}";

/// Step 2 on PostgreSQL, one statement: for each locked endpoint (`$1` ids, `$2` how many
/// it may start, `$3` its cap), its requests in flight now, then its due rows in due order
/// (`pending` and due, or `processing` with an expired lease: a `processing` row's
/// `next_attempt_at` is its lease expiry), at most its free slots, locked skipping rows
/// another transaction holds; the UPDATE re-checks that each row is still due (the guard)
/// and gives it a fresh token and a lease of `$4`, on the database's clock. A row is claimed
/// only if this UPDATE returned it. What to send (see [`crate::worker::targets`]) comes back
/// with each claimed row, saving a query per batch.
const CLAIM_POSTGRES: &str = concat!(
    "WITH turns AS (
    SELECT t.endpoint_id, t.wanted,
           t.cap - (SELECT COUNT(*) FROM webhook_deliveries p
                    WHERE p.endpoint_id = t.endpoint_id AND p.state = 'processing'
                      AND p.next_attempt_at > {now}) AS free
    FROM unnest($1::uuid[], $2::int[], $3::int[]) AS t(endpoint_id, wanted, cap)
), due AS MATERIALIZED (
    SELECT d.id, d.state AS previous_state, d.submission_id, d.endpoint_id
    FROM turns CROSS JOIN LATERAL (
        SELECT d.id, d.state, d.submission_id, d.endpoint_id FROM webhook_deliveries d
        WHERE d.endpoint_id = turns.endpoint_id AND d.state IN ('pending', 'processing')
          AND d.next_attempt_at <= {now}
        ORDER BY d.next_attempt_at
        LIMIT GREATEST(0, LEAST(turns.wanted, turns.free))
        FOR UPDATE OF d SKIP LOCKED
    ) d
)
UPDATE webhook_deliveries AS w
SET state = 'processing', claim_token = gen_random_uuid(), claim_expires_at = {after($4)},
    next_attempt_at = {after($4)}, updated_at = {now}
FROM due
JOIN submissions s ON s.id = due.submission_id
JOIN endpoints e ON e.id = due.endpoint_id
WHERE w.id = due.id
  AND w.state IN ('pending', 'processing')
  AND w.next_attempt_at <= {now}
RETURNING w.id, w.claim_token, w.cycle_attempts, w.endpoint_id, w.submission_id, w.created_at,
          w.claim_expires_at, w.updated_at, due.previous_state, ",
    crate::targets_columns!(),
    ""
);

/// Step 2 on SQLite (inside `BEGIN IMMEDIATE`, which already excludes other writers), per
/// endpoint: its requests in flight now.
const IN_FLIGHT_SQLITE: &str = "SELECT COUNT(*) AS n FROM webhook_deliveries \
     WHERE endpoint_id = $1 AND state = 'processing' AND next_attempt_at > {now}";

/// ... its due rows in due order, at most `$2`.
const DUE_SQLITE: &str = "SELECT id, state AS previous_state FROM webhook_deliveries \
     WHERE endpoint_id = $1 AND state IN ('pending', 'processing') AND next_attempt_at <= {now} \
     ORDER BY next_attempt_at LIMIT $2";

/// ... and the same guarded UPDATE as on PostgreSQL; `randomblob(16)` is a fresh UUID's bytes.
const CLAIM_SQLITE: &str = "\
UPDATE webhook_deliveries
SET state = 'processing', claim_token = randomblob(16), claim_expires_at = {after($1)},
    next_attempt_at = {after($1)}, updated_at = {now}
WHERE state IN ('pending', 'processing')
  AND next_attempt_at <= {now}
  AND id IN ({ids})
RETURNING id, claim_token, cycle_attempts, endpoint_id, submission_id, created_at,
          claim_expires_at, updated_at";

/// Step 3: what the claim left for each endpoint, this transaction's claims included: the
/// earliest due time of its waiting and in-flight rows, and its requests in flight with
/// the earliest of their leases. Each an index lookup.
const FACTS: &str = "\
WITH t(endpoint_id) AS ({endpoints})
SELECT t.endpoint_id,
       (SELECT d.next_attempt_at FROM webhook_deliveries d
        WHERE d.endpoint_id = t.endpoint_id AND d.state IN ('pending', 'processing')
          AND d.next_attempt_at IS NOT NULL
        ORDER BY d.next_attempt_at LIMIT 1) AS due_at,
       (SELECT COUNT(*) FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND p.state = 'processing'
          AND p.next_attempt_at > {now}) AS in_flight,
       (SELECT MIN(p.next_attempt_at) FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND p.state = 'processing'
          AND p.next_attempt_at > {now}) AS lease_min
FROM t";

/// Step 4 on PostgreSQL: every endpoint's next turn in one statement (times as text, ''
/// for none: arrays cannot hold NULL timestamps here).
const SET_TURNS_POSTGRES: &str = "\
UPDATE endpoint_flow AS f
SET turn_at = NULLIF(v.turn_at, '')::timestamptz,
    rate_tat = NULLIF(v.rate_tat, '')::timestamptz,
    blocked_until = NULLIF(v.blocked_until, '')::timestamptz,
    served_at = NULLIF(v.served_at, '')::timestamptz
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
     AS v(endpoint_id, turn_at, rate_tat, blocked_until, served_at)
WHERE f.endpoint_id = v.endpoint_id";

/// Step 4 on SQLite, per endpoint.
const SET_TURN_SQLITE: &str = "UPDATE endpoint_flow \
     SET turn_at = $2, rate_tat = $3, blocked_until = $4, served_at = $5 WHERE endpoint_id = $1";

/// An expired lease of a disabled endpoint goes back to `pending`, parked (or due, if a
/// re-enable committed meanwhile), so nothing of it stays `processing` while it is off.
const PARK_EXPIRED: &str = "\
UPDATE webhook_deliveries
SET state = 'pending', claim_token = NULL, claim_expires_at = NULL, updated_at = {now},
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
WHERE endpoint_id = $1 AND state = 'processing' AND next_attempt_at <= {now}
RETURNING id, updated_at";

/// A due `pending` row of a disabled endpoint (disabled by a path that did not park it)
/// leaves the due index the same way.
const PARK_DUE: &str = "\
UPDATE webhook_deliveries
SET next_attempt_at = NULL, updated_at = {now}
WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at <= {now}
  AND {parked(webhook_deliveries.endpoint_id)}";

/// Gives a claim back at once (when its delivery cannot be sent), fenced by its token:
/// due now, or parked if its endpoint was disabled meanwhile.
const RELEASE: &str = "\
UPDATE webhook_deliveries
SET state = 'pending', claim_token = NULL, claim_expires_at = NULL, updated_at = {now},
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
WHERE id = $1 AND claim_token = $2
RETURNING updated_at";

/// A delivery this worker now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The delivery.
    pub delivery_id: Uuid,
    /// The token every later write must present.
    pub claim_token: Uuid,
    /// The state before the claim (`pending`, or `processing` for an expired lease).
    pub previous_state: DeliveryState,
    /// Attempts already made in this cycle.
    pub cycle_attempts: i32,
    /// The endpoint to deliver to.
    pub endpoint_id: Uuid,
    /// The submission to deliver.
    pub submission_id: Uuid,
    /// When the delivery was created (for end-to-end latency).
    pub created_at: DateTime<Utc>,
    /// When this claim's lease runs out.
    pub lease_expires_at: DateTime<Utc>,
}

/// What to claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest {
    /// The most deliveries to claim (the worker's free slots).
    pub limit: u32,
    /// How long each claim holds its delivery.
    pub lease: Duration,
    /// The cap of endpoints that set none (`COURIER_ENDPOINT_MAX_IN_FLIGHT`).
    pub default_max_in_flight: u32,
}

/// What a claim did.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The deliveries now held.
    pub claims: Vec<Claim>,
    /// Whether some endpoint is ready for another claim at once (more is due than this
    /// claim could take).
    pub more: bool,
    /// Endpoints this claim put to sleep (nothing due, or full): looked at again once it
    /// has committed, see [`Claimed::settle`].
    slept: Vec<Uuid>,
    /// Disabled endpoints whose turn came: their expired leases are parked.
    disabled: Vec<Uuid>,
    /// The default cap the claim used.
    default_max_in_flight: u32,
    /// The PostgreSQL rows of the claims (with what to send).
    rows: Vec<QueryResult>,
}

impl Claimed {
    /// The claim's follow-up after its commit, which must not delay the requests: wake any
    /// endpoint it put to sleep that meanwhile got due work or a free slot (a submission
    /// that committed between the claim's snapshot and its commit saw the endpoint still
    /// ready and did not wake it), and park the expired leases of disabled endpoints.
    pub fn follow_up(&self) -> FollowUp {
        FollowUp {
            slept: self.slept.clone(),
            disabled: self.disabled.clone(),
            default_max_in_flight: self.default_max_in_flight,
        }
    }
}

/// What is left to do once a claim has committed; see [`Claimed::follow_up`].
#[derive(Debug, Default)]
pub struct FollowUp {
    slept: Vec<Uuid>,
    disabled: Vec<Uuid>,
    default_max_in_flight: u32,
}

impl FollowUp {
    /// Whether there is anything to do.
    pub fn is_empty(&self) -> bool {
        self.slept.is_empty() && self.disabled.is_empty()
    }

    /// Does it; returns how many endpoints it woke.
    pub async fn run(self, db: &Db, events: &Events) -> Result<u64, DbErr> {
        for endpoint_id in &self.disabled {
            park_expired(db, events, *endpoint_id).await?;
        }
        if self.slept.is_empty() {
            return Ok(0);
        }
        wake_ready(db, &self.slept, self.default_max_in_flight).await
    }
}

/// Wakes those of `endpoints` that sleep but have due work and a free slot (all endpoints,
/// when `endpoints` is `None`: the backstop sweep). Returns how many it woke.
pub async fn sweep(db: &Db, default_max_in_flight: u32) -> Result<u64, DbErr> {
    let sql = flow::sweep(db.backend(), None);
    let statement = db
        .clock()
        .statement(&sql, [i64::from(default_max_in_flight).into()]);
    Ok(db.conn().execute_raw(statement).await?.rows_affected())
}

async fn wake_ready(db: &Db, endpoints: &[Uuid], default_max_in_flight: u32) -> Result<u64, DbErr> {
    let mut values = vec![Value::from(i64::from(default_max_in_flight))];
    let only = match db.backend() {
        DbBackend::Postgres => {
            values.push(Value::from(endpoints.to_vec()));
            "= ANY($2::uuid[])".to_owned()
        }
        _ => {
            values.extend(endpoints.iter().map(|id| Value::from(*id)));
            format!("IN ({})", Db::placeholders(2, endpoints.len()))
        }
    };
    let sql = flow::sweep(db.backend(), Some(&only));
    let statement = db.clock().statement(&sql, values);
    Ok(db.conn().execute_raw(statement).await?.rows_affected())
}

/// Claims up to `limit` due deliveries for `lease` under the default cap, publishes
/// `PROCESSING` for each that was `pending` (retaking an expired lease changes no state),
/// and runs the claim's follow-up.
pub async fn claim_due(
    db: &Db,
    events: &Events,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claim>, DbErr> {
    let request = ClaimRequest {
        limit,
        lease,
        default_max_in_flight: DEFAULT_MAX_IN_FLIGHT,
    };
    let claimed = claim(db, events, request).await?;
    claimed.follow_up().run(db, events).await?;
    Ok(claimed.claims)
}

/// [`claim`], with what to send for each claim. On PostgreSQL it comes back from the claim
/// itself; on SQLite it is read right after. The follow-up is left to the caller.
pub async fn claim_due_with_targets(
    db: &Db,
    events: &Events,
    keys: &SecretKeys,
    request: ClaimRequest,
) -> Result<(Claimed, HashMap<Uuid, Target>), ClaimError> {
    let mut claimed = claim(db, events, request).await?;
    let rows = std::mem::take(&mut claimed.rows);
    let targets = match db.backend() {
        DbBackend::Postgres => targets::from_rows(keys, &claimed.claims, &rows),
        _ => load_targets(db, keys, &claimed.claims).await,
    };
    match targets {
        Ok(targets) => Ok((claimed, targets)),
        Err(err) => Err(ClaimError::Load(claimed, err)),
    }
}

/// Why [`claim_due_with_targets`] failed.
#[derive(Debug)]
pub enum ClaimError {
    /// Nothing was claimed (or the claim was not confirmed: its rows are reclaimed after
    /// their lease).
    Claim(DbErr),
    /// These were claimed, but what to send could not be read: release them.
    Load(Claimed, DbErr),
}

impl From<DbErr> for ClaimError {
    fn from(err: DbErr) -> Self {
        ClaimError::Claim(err)
    }
}

/// Claims under `request` in one transaction (see the module docs) and publishes the
/// state changes once it commits.
pub async fn claim(db: &Db, events: &Events, request: ClaimRequest) -> Result<Claimed, DbErr> {
    if request.limit == 0 {
        return Ok(Claimed::default());
    }
    let (claimed, staged) = db
        .transaction(|txn| async move {
            let (claimed, changes) = claim_in(&txn, db, request).await?;
            let staged = events.stage(&*txn, changes).await?;
            Ok((claimed, staged))
        })
        .await?;
    staged.committed();
    Ok(claimed)
}

/// A claimed row and when the claim changed it.
type Taken = (Claim, DateTime<Utc>);

/// The four steps of a claim inside its transaction, and the state changes to publish
/// (`PENDING` -> `PROCESSING`; retaking an expired lease changes no state).
async fn claim_in(
    txn: &DatabaseTransaction,
    db: &Db,
    request: ClaimRequest,
) -> Result<(Claimed, Vec<StateChange>), DbErr> {
    let backend = db.backend();
    let lock = match backend {
        DbBackend::Postgres => "FOR UPDATE OF f SKIP LOCKED",
        _ => "",
    };
    let turns = request.limit.min(MAX_TURNS);
    let locked = txn
        .query_all_raw(db.clock().statement(
            &LOCK_TURNS.replace("{lock}", lock),
            [i64::from(turns).into()],
        ))
        .await?;
    if locked.is_empty() {
        let claimed = Claimed {
            default_max_in_flight: request.default_max_in_flight,
            ..Claimed::default()
        };
        return Ok((claimed, Vec::new()));
    }
    let mut now = crate::db::now();
    let mut standings = Vec::with_capacity(locked.len());
    for row in &locked {
        now = row.try_get("", "now")?;
        standings.push(standing(row, request.default_max_in_flight)?);
    }
    let wants = flow::wants(&standings, now, request.limit);

    let (taken, rows) = match backend {
        DbBackend::Postgres => claim_postgres(txn, db, &standings, &wants, request.lease).await?,
        _ => (
            claim_sqlite(txn, db, &standings, &wants, request.lease).await?,
            Vec::new(),
        ),
    };

    let changes = taken
        .iter()
        .filter(|(claim, _)| claim.previous_state != DeliveryState::Processing)
        .map(|(claim, at)| StateChange {
            delivery_id: claim.delivery_id,
            endpoint_id: claim.endpoint_id,
            previous_state: Some(claim.previous_state),
            state: DeliveryState::Processing,
            at: *at,
        })
        .collect();
    let claims: Vec<Claim> = taken.into_iter().map(|(claim, _)| claim).collect();
    let ids: Vec<Uuid> = standings.iter().map(|s| s.endpoint_id).collect();
    let facts = facts(txn, db, &ids, &claims).await?;
    let mut claimed = Claimed {
        default_max_in_flight: request.default_max_in_flight,
        ..Claimed::default()
    };
    let mut next = Vec::with_capacity(standings.len());
    for standing in &standings {
        let facts = facts.get(&standing.endpoint_id).copied().unwrap_or(Facts {
            taken: 0,
            due_at: None,
            in_flight: 0,
            lease_min: None,
        });
        let turn = flow::next_turn(standing, &facts, now);
        if standing.disabled {
            claimed.disabled.push(standing.endpoint_id);
        } else if turn.asleep(now) {
            claimed.slept.push(standing.endpoint_id);
        }
        claimed.more |= turn.ready(now);
        next.push((standing.endpoint_id, turn));
    }
    claimed.more |= locked.len() as u32 == turns;
    set_turns(txn, db, &next).await?;
    claimed.claims = claims;
    claimed.rows = rows;
    Ok((claimed, changes))
}

/// An endpoint's standing from a [`LOCK_TURNS`] row.
fn standing(row: &QueryResult, default_max_in_flight: u32) -> Result<Standing, DbErr> {
    let cap: Option<i32> = row.try_get("", "max_in_flight")?;
    let rate: Option<i32> = row.try_get("", "rate_limit")?;
    Ok(Standing {
        endpoint_id: row.try_get("", "endpoint_id")?,
        disabled: row.try_get("", "disabled")?,
        max_in_flight: cap
            .and_then(|cap| u32::try_from(cap).ok())
            .unwrap_or(default_max_in_flight)
            .max(1),
        rate: rate
            .and_then(|rate| u32::try_from(rate).ok())
            .map(Rate::new),
        rate_tat: row.try_get("", "rate_tat")?,
        paused_until: row.try_get("", "paused_until")?,
        served_at: row.try_get("", "served_at")?,
    })
}

/// Step 2 on PostgreSQL.
async fn claim_postgres(
    txn: &DatabaseTransaction,
    db: &Db,
    standings: &[Standing],
    wants: &[u32],
    lease: Duration,
) -> Result<(Vec<Taken>, Vec<QueryResult>), DbErr> {
    let wanted: Vec<(Uuid, i32, i32)> = standings
        .iter()
        .zip(wants)
        .filter(|(_, want)| **want > 0)
        .map(|(s, want)| {
            let cap = i32::try_from(s.max_in_flight).unwrap_or(i32::MAX);
            (s.endpoint_id, i32::try_from(*want).unwrap_or(i32::MAX), cap)
        })
        .collect();
    if wanted.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let clock = db.clock();
    let values = [
        Value::from(wanted.iter().map(|w| w.0).collect::<Vec<_>>()),
        Value::from(wanted.iter().map(|w| w.1).collect::<Vec<_>>()),
        Value::from(wanted.iter().map(|w| w.2).collect::<Vec<_>>()),
        clock.after(lease),
    ];
    let returned = txn
        .query_all_raw(clock.statement(CLAIM_POSTGRES, values))
        .await?;
    let claims = returned
        .iter()
        .map(|row| {
            let previous: String = row.try_get("", "previous_state")?;
            claim_from(row, &previous)
        })
        .collect::<Result<Vec<_>, DbErr>>()?;
    Ok((claims, returned))
}

/// Step 2 on SQLite.
async fn claim_sqlite(
    txn: &DatabaseTransaction,
    db: &Db,
    standings: &[Standing],
    wants: &[u32],
    lease: Duration,
) -> Result<Vec<Taken>, DbErr> {
    let mut previous: Vec<(Uuid, String)> = Vec::new();
    for (standing, want) in standings.iter().zip(wants) {
        if *want == 0 {
            continue;
        }
        let clock = db.clock();
        let in_flight: i64 = match txn
            .query_one_raw(clock.statement(IN_FLIGHT_SQLITE, [standing.endpoint_id.into()]))
            .await?
        {
            Some(row) => row.try_get("", "n")?,
            None => 0,
        };
        let free = (i64::from(standing.max_in_flight) - in_flight).max(0);
        let take = free.min(i64::from(*want));
        if take == 0 {
            continue;
        }
        for row in txn
            .query_all_raw(clock.statement(DUE_SQLITE, [standing.endpoint_id.into(), take.into()]))
            .await?
        {
            previous.push((row.try_get("", "id")?, row.try_get("", "previous_state")?));
        }
    }
    if previous.is_empty() {
        return Ok(Vec::new());
    }
    let sql = CLAIM_SQLITE.replace("{ids}", &Db::placeholders(2, previous.len()));
    let clock = db.clock();
    let mut values = vec![clock.after(lease)];
    values.extend(previous.iter().map(|(id, _)| Value::from(*id)));
    let claimed = txn.query_all_raw(clock.statement(&sql, values)).await?;
    // RETURNING on SQLite can only name the updated table: the previous states come from above.
    let mut claims = Vec::with_capacity(claimed.len());
    for row in &claimed {
        let id: Uuid = row.try_get("", "id")?;
        let state = previous
            .iter()
            .find(|(due_id, _)| *due_id == id)
            .map(|(_, state)| state.as_str())
            .unwrap_or_default();
        claims.push(claim_from(row, state)?);
    }
    Ok(claims)
}

/// Step 3: [`FACTS`] for `endpoints`, with how many of `claims` each got.
async fn facts(
    txn: &DatabaseTransaction,
    db: &Db,
    endpoints: &[Uuid],
    claims: &[Claim],
) -> Result<HashMap<Uuid, Facts>, DbErr> {
    let (list, values) = match db.backend() {
        DbBackend::Postgres => (
            "SELECT unnest($1::uuid[])".to_owned(),
            vec![Value::from(endpoints.to_vec())],
        ),
        _ => (
            format!(
                "VALUES {}",
                (1..=endpoints.len())
                    .map(|n| format!("(${n})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            endpoints.iter().map(|id| Value::from(*id)).collect(),
        ),
    };
    let sql = FACTS.replace("{endpoints}", &list);
    let mut facts = HashMap::with_capacity(endpoints.len());
    for row in txn
        .query_all_raw(db.clock().statement(&sql, values))
        .await?
    {
        let endpoint_id: Uuid = row.try_get("", "endpoint_id")?;
        let taken = claims
            .iter()
            .filter(|c| c.endpoint_id == endpoint_id)
            .count();
        facts.insert(
            endpoint_id,
            Facts {
                taken: u32::try_from(taken).unwrap_or(u32::MAX),
                due_at: row.try_get("", "due_at")?,
                in_flight: row.try_get("", "in_flight")?,
                lease_min: row.try_get("", "lease_min")?,
            },
        );
    }
    Ok(facts)
}

/// Step 4: the endpoints' next turns.
async fn set_turns(
    txn: &DatabaseTransaction,
    db: &Db,
    turns: &[(Uuid, Turn)],
) -> Result<(), DbErr> {
    if turns.is_empty() {
        return Ok(());
    }
    match db.backend() {
        DbBackend::Postgres => {
            let text = |at: Option<DateTime<Utc>>| {
                at.map_or_else(String::new, |at| {
                    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                })
            };
            let values = [
                Value::from(turns.iter().map(|(id, _)| *id).collect::<Vec<_>>()),
                Value::from(
                    turns
                        .iter()
                        .map(|(_, t)| text(t.turn_at))
                        .collect::<Vec<_>>(),
                ),
                Value::from(
                    turns
                        .iter()
                        .map(|(_, t)| text(t.rate_tat))
                        .collect::<Vec<_>>(),
                ),
                Value::from(
                    turns
                        .iter()
                        .map(|(_, t)| text(t.blocked_until))
                        .collect::<Vec<_>>(),
                ),
                Value::from(
                    turns
                        .iter()
                        .map(|(_, t)| text(t.served_at))
                        .collect::<Vec<_>>(),
                ),
            ];
            txn.execute_raw(Clock::new(DbBackend::Postgres).statement(SET_TURNS_POSTGRES, values))
                .await?;
        }
        backend => {
            for (endpoint_id, turn) in turns {
                let values = [
                    Value::from(*endpoint_id),
                    Value::from(turn.turn_at),
                    Value::from(turn.rate_tat),
                    Value::from(turn.blocked_until),
                    Value::from(turn.served_at),
                ];
                txn.execute_raw(Clock::new(backend).statement(SET_TURN_SQLITE, values))
                    .await?;
            }
        }
    }
    Ok(())
}

fn claim_from(row: &QueryResult, previous: &str) -> Result<Taken, DbErr> {
    let previous_state = DeliveryState::parse(previous)
        .ok_or_else(|| DbErr::Type(format!("unknown delivery state {previous:?}")))?;
    let token: Option<Uuid> = row.try_get("", "claim_token")?;
    let lease: Option<DateTime<Utc>> = row.try_get("", "claim_expires_at")?;
    let (Some(claim_token), Some(lease_expires_at)) = (token, lease) else {
        return Err(DbErr::Custom(
            "a claimed row came back without its claim".into(),
        ));
    };
    let claim = Claim {
        delivery_id: row.try_get("", "id")?,
        claim_token,
        previous_state,
        cycle_attempts: row.try_get("", "cycle_attempts")?,
        endpoint_id: row.try_get("", "endpoint_id")?,
        submission_id: row.try_get("", "submission_id")?,
        created_at: row.try_get("", "created_at")?,
        lease_expires_at,
    };
    Ok((claim, row.try_get("", "updated_at")?))
}

/// Parks the due rows and expired leases of a disabled endpoint (see [`PARK_DUE`] and
/// [`PARK_EXPIRED`]) and publishes the leases' return to `PENDING`.
async fn park_expired(db: &Db, events: &Events, endpoint_id: Uuid) -> Result<(), DbErr> {
    let staged = db
        .transaction(|txn| async move {
            let sql = with_parking(db.backend(), PARK_EXPIRED);
            let parked = txn
                .query_all_raw(db.clock().statement(&sql, [endpoint_id.into()]))
                .await?;
            let sql = with_parking(db.backend(), PARK_DUE);
            txn.execute_raw(db.clock().statement(&sql, [endpoint_id.into()]))
                .await?;
            let mut changes = Vec::with_capacity(parked.len());
            for row in parked {
                changes.push(StateChange {
                    delivery_id: row.try_get("", "id")?,
                    endpoint_id,
                    previous_state: Some(DeliveryState::Processing),
                    state: DeliveryState::Pending,
                    at: row.try_get("", "updated_at")?,
                });
            }
            events.stage(&*txn, changes).await
        })
        .await?;
    staged.committed();
    Ok(())
}

/// Returns claims to `pending`, due now, so any worker may take them again without
/// waiting for their lease (parked instead if the endpoint was disabled meanwhile), and
/// wakes their endpoints. Claims that were meanwhile superseded are left alone.
pub async fn release(db: &Db, events: &Events, claims: &[Claim]) -> Result<(), DbErr> {
    let staged = db
        .transaction(|txn| async move {
            let sql = with_parking(db.backend(), RELEASE);
            let mut changes = Vec::new();
            let mut endpoints = Vec::new();
            for claim in claims {
                let released = txn
                    .query_one_raw(
                        db.clock()
                            .statement(&sql, [claim.delivery_id.into(), claim.claim_token.into()]),
                    )
                    .await?;
                if let Some(row) = released {
                    endpoints.push(claim.endpoint_id);
                    changes.push(StateChange {
                        delivery_id: claim.delivery_id,
                        endpoint_id: claim.endpoint_id,
                        previous_state: Some(DeliveryState::Processing),
                        state: DeliveryState::Pending,
                        at: row.try_get("", "updated_at")?,
                    });
                }
            }
            flow::wake_endpoints(&*txn, db.backend(), &endpoints).await?;
            events.stage(&*txn, changes).await
        })
        .await?;
    staged.committed();
    Ok(())
}
