//! The claim's per-endpoint bookkeeping (see [`crate::service::flow`] for the rules): lock
//! the turns of the ready endpoints, read what a claim left for each (what is due, what is
//! in flight), write their next turns; and the claim's follow-up once committed (look again
//! at endpoints it put to sleep, park what a disabled endpoint still had due), and the
//! backstop sweep.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult, Value};
use uuid::Uuid;

use crate::bus::{notifying_after, ChangeBus, Staged, StateChange};
use crate::db::parking::with_parking;
use crate::db::sql::fill;
use crate::db::{Clock, Db};
use crate::service::flow::{self, Facts, Rate, Standing, Turn};

/// The ready endpoints' turns, longest waiting first, locked (PostgreSQL: skipping turns
/// another claim holds, never waiting), with what limits them. `$1`: the most to take;
/// `{revisit}`: full endpoints this process has since freed a slot of, whatever their turn;
/// `{only}`: the one endpoint a claim at submit looks at (see [`Turns::Of`]), or the
/// endpoints the claiming loop leaves to other processes (see [`Turns::Ready`]). An endpoint
/// counts as paused until the later of its pause and its turn's hold (a `Retry-After` not
/// yet recorded, see [`flow::HOLD_TURN`], or a rate limit's wait, which allows no start
/// before it either), so a turn revisited early starts nothing in a hold.
const LOCK_TURNS: &str = "\
SELECT f.endpoint_id, f.rate_tat, f.served_at,
       CASE WHEN e.paused_until IS NULL OR f.blocked_until > e.paused_until
            THEN COALESCE(f.blocked_until, e.paused_until) ELSE e.paused_until END
           AS paused_until,
       e.max_in_flight, e.rate_limit, e.disabled, {now} AS now {relax}
FROM endpoint_flow f JOIN endpoints e ON e.id = f.endpoint_id
WHERE (f.turn_at <= {now} {revisit}) {only}
ORDER BY f.turn_at, f.endpoint_id
LIMIT $1 {lock}";

/// A claim that is a transaction of its own commits without waiting for its WAL to reach
/// the disk (`synchronous_commit` off for that transaction only; set in its first
/// statement, so it costs no round trip). Its commit is visible to every other transaction
/// at once, as any commit, and a later durable commit (the outcome it leads to) flushes it
/// too. Only a crash of the database itself can lose it, within a fraction of a second:
/// its rows go back to the state before the claim and are claimed again, which is what a
/// crash between a durable claim and its outcome already leads to (the request is sent
/// again with the same `webhook-id`, after the lease instead of at once). What a claim
/// writes is never more than a lease, so it need not wait for the disk; a submission, an
/// outcome or an operator's change still does.
const RELAXED_COMMIT: &str = ", set_config('synchronous_commit', 'off', true) AS relaxed";

/// Whether a claim's transaction waits for its WAL flush at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// As the server is set: the claim shares its transaction with a write that must be
    /// durable (a submission claiming its own delivery).
    AsConfigured,
    /// Without waiting: the claim is its own transaction (see [`RELAXED_COMMIT`]).
    Relaxed,
}

/// Which turns a claim looks at.
#[derive(Debug, Clone, Copy)]
pub enum Turns<'a> {
    /// The ready endpoints, longest waiting first, and the full ones this process has
    /// since freed a slot of (`revisit`), but none of `except` (endpoints holding their
    /// whole share of this process's slots, see [`super::share`]): the claiming loop.
    Ready {
        /// Full endpoints to look at whatever their turn.
        revisit: &'a [Uuid],
        /// Endpoints whose turns this claim leaves to other processes.
        except: &'a [Uuid],
        /// If given, the only endpoints this claim looks at (the others are full).
        among: Option<&'a [Uuid]>,
    },
    /// This one endpoint, if its turn has come (a submission claiming its own fresh
    /// delivery, see [`crate::worker::handoff`]).
    Of(Uuid),
}

/// What the claim left for each endpoint, this transaction's claims included: the
/// earliest due time of its waiting and in-flight rows, and its requests in flight (less
/// `{not_ended}`: this process's requests that have ended) with the earliest of their
/// leases. Each an index lookup. SQLite's; PostgreSQL's claim statement reads the same
/// (see [`super::claim`]).
const FACTS: &str = "\
WITH t(endpoint_id) AS ({endpoints})
SELECT t.endpoint_id,
       (SELECT d.next_attempt_at FROM webhook_deliveries d
        WHERE d.endpoint_id = t.endpoint_id AND d.state IN ('pending', 'processing')
          AND d.next_attempt_at IS NOT NULL
        ORDER BY d.next_attempt_at LIMIT 1) AS due_at,
       (SELECT COUNT(*) FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND {in_flight(p)} {not_ended}) AS in_flight,
       (SELECT MIN(p.next_attempt_at) FROM webhook_deliveries p
        WHERE p.endpoint_id = t.endpoint_id AND {in_flight(p)} {not_ended}) AS lease_min
FROM t";

/// Every endpoint's next turn in one statement on PostgreSQL (times as text, '' for none:
/// arrays cannot hold NULL timestamps here), sent with the claim's notifications (see
/// [`set_turns_and_stage`]).
const SET_TURNS_POSTGRES: &str = "\
UPDATE endpoint_flow AS f
SET turn_at = NULLIF(v.turn_at, '')::timestamptz,
    rate_tat = NULLIF(v.rate_tat, '')::timestamptz,
    blocked_until = NULLIF(v.blocked_until, '')::timestamptz,
    served_at = NULLIF(v.served_at, '')::timestamptz
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
     AS v(endpoint_id, turn_at, rate_tat, blocked_until, served_at)
WHERE f.endpoint_id = v.endpoint_id";

/// One endpoint's next turn on SQLite.
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

/// Locks the turns of up to `limit` of `turns`, and returns their standings with the
/// database's time; on PostgreSQL, `commit` says whether the transaction then waits for
/// its WAL flush at commit.
pub async fn lock_turns(
    txn: &DatabaseTransaction,
    db: &Db,
    limit: u32,
    turns: Turns<'_>,
    default_max_in_flight: u32,
    commit: Commit,
) -> Result<(Vec<Standing>, DateTime<Utc>), DbErr> {
    let backend = db.backend();
    let postgres = backend == DbBackend::Postgres;
    let lock = if postgres {
        "FOR UPDATE OF f SKIP LOCKED"
    } else {
        ""
    };
    let relax = if postgres && commit == Commit::Relaxed {
        RELAXED_COMMIT
    } else {
        ""
    };
    let mut values = vec![Value::from(i64::from(limit))];
    let (revisit_sql, only_sql) = match turns {
        Turns::Ready {
            revisit,
            except,
            among,
        } => {
            let mut revisit_sql = String::new();
            if !revisit.is_empty() {
                let (list, ids) = Db::id_list(backend, values.len() + 1, revisit, false);
                values.extend(ids);
                revisit_sql = format!("OR f.endpoint_id {list}");
            }
            let mut except_sql = String::new();
            if !except.is_empty() {
                let (list, ids) = Db::id_list(backend, values.len() + 1, except, true);
                values.extend(ids);
                except_sql = format!("AND f.endpoint_id {list}");
            }
            if let Some(among) = among {
                let (list, ids) = Db::id_list(backend, values.len() + 1, among, false);
                values.extend(ids);
                except_sql.push_str(&format!(" AND f.endpoint_id {list}"));
            }
            (revisit_sql, except_sql)
        }
        Turns::Of(endpoint_id) => {
            values.push(Value::from(endpoint_id));
            (String::new(), "AND f.endpoint_id = $2".to_owned())
        }
    };
    let sql = fill(
        LOCK_TURNS,
        &[
            ("lock", lock),
            ("relax", relax),
            ("revisit", &revisit_sql),
            ("only", &only_sql),
        ],
    );
    let rows = txn
        .query_all_raw(db.clock().statement(&sql, values))
        .await?;
    let mut now = crate::db::now();
    let mut standings = Vec::with_capacity(rows.len());
    for row in &rows {
        now = row.try_get("", "now")?;
        standings.push(standing(row, default_max_in_flight)?);
    }
    Ok((standings, now))
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

/// What the claim left for `endpoints` (see the `FACTS` statement), with how many
/// deliveries each got (`taken`), leaving out the
/// `ended` requests.
pub async fn facts(
    txn: &DatabaseTransaction,
    db: &Db,
    endpoints: &[Uuid],
    taken: &HashMap<Uuid, u32>,
    ended: &[Uuid],
) -> Result<HashMap<Uuid, Facts>, DbErr> {
    let backend = db.backend();
    let (list, mut values) = match backend {
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
    let (not_ended, ended_values) = Db::id_list(backend, values.len() + 1, ended, true);
    values.extend(ended_values);
    let not_ended = format!("AND p.id {not_ended}");
    let sql = fill(FACTS, &[("endpoints", &list), ("not_ended", &not_ended)]);
    let mut facts = HashMap::with_capacity(endpoints.len());
    for row in txn
        .query_all_raw(db.clock().statement(&sql, values))
        .await?
    {
        let endpoint_id: Uuid = row.try_get("", "endpoint_id")?;
        facts.insert(
            endpoint_id,
            Facts {
                taken: taken.get(&endpoint_id).copied().unwrap_or(0),
                due_at: row.try_get("", "due_at")?,
                in_flight: row.try_get("", "in_flight")?,
                lease_min: row.try_get("", "lease_min")?,
            },
        );
    }
    Ok(facts)
}

/// Writes the endpoints' next turns and stages `changes` (see [`ChangeBus::stage`]): on
/// PostgreSQL in one statement, so a claim's last write costs no round trip of its own.
pub async fn set_turns_and_stage(
    txn: &DatabaseTransaction,
    db: &Db,
    bus: &ChangeBus,
    turns: &[(Uuid, Turn)],
    changes: Vec<StateChange>,
) -> Result<Staged, DbErr> {
    match db.backend() {
        DbBackend::Postgres if !turns.is_empty() => {
            bus.stage_alongside(txn, changes, SET_TURNS_POSTGRES, turns_postgres(turns))
                .await
        }
        DbBackend::Postgres => bus.stage(txn, changes).await,
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
            bus.stage(txn, changes).await
        }
    }
}

/// The values of [`SET_TURNS_POSTGRES`] for `turns`.
fn turns_postgres(turns: &[(Uuid, Turn)]) -> Vec<Value> {
    let text = |at: Option<DateTime<Utc>>| {
        at.map_or_else(String::new, |at| {
            at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        })
    };
    let column = |pick: fn(&Turn) -> Option<DateTime<Utc>>| {
        Value::from(turns.iter().map(|(_, t)| text(pick(t))).collect::<Vec<_>>())
    };
    vec![
        Value::from(turns.iter().map(|(id, _)| *id).collect::<Vec<_>>()),
        column(|t| t.turn_at),
        column(|t| t.rate_tat),
        column(|t| t.blocked_until),
        column(|t| t.served_at),
    ]
}

/// Prepares and plans the statement of [`set_turns_and_stage`] on `txn`'s connection
/// (PostgreSQL), setting and sending nothing.
pub async fn warm_set_turns(txn: &DatabaseTransaction) -> Result<(), DbErr> {
    let mut values = turns_postgres(&[]);
    values.push(Value::from(Vec::<String>::new()));
    let sql = notifying_after(SET_TURNS_POSTGRES, values.len());
    txn.execute_raw(Clock::new(DbBackend::Postgres).statement(&sql, values))
        .await?;
    Ok(())
}

/// What is left to do once a claim has committed, which must not delay its requests: wake
/// any endpoint it put to sleep that meanwhile got due work or a free slot (a submission
/// that committed between the claim's snapshot and its commit saw the endpoint still ready
/// and did not wake it), and park what disabled endpoints still had due.
#[derive(Debug, Default)]
pub struct FollowUp {
    /// Endpoints the claim put to sleep.
    pub slept: Vec<Uuid>,
    /// Disabled endpoints whose turn came.
    pub disabled: Vec<Uuid>,
    /// The default cap the claim used.
    pub default_max_in_flight: u32,
}

impl FollowUp {
    /// Whether there is anything to do.
    pub fn is_empty(&self) -> bool {
        self.slept.is_empty() && self.disabled.is_empty()
    }

    /// Does it; returns how many endpoints it woke.
    pub async fn run(self, db: &Db, bus: &ChangeBus) -> Result<u64, DbErr> {
        for endpoint_id in &self.disabled {
            park_disabled(db, bus, *endpoint_id).await?;
        }
        if self.slept.is_empty() {
            return Ok(0);
        }
        wake_ready(db, Some(&self.slept), self.default_max_in_flight).await
    }
}

/// The soonest turn still ahead, of any endpoint, set by any process (a rate limit's next
/// start, a pause's end, a retry's due time, or a woken endpoint held back by either), with
/// the database's time: one look at the turn index.
const SOONEST_TURN: &str = "\
SELECT (SELECT MIN(turn_at) FROM endpoint_flow WHERE turn_at > {now}) AS turn_at, {now} AS now";

/// How long until the soonest turn still ahead on the database (see [`SOONEST_TURN`]), if
/// any: an idle worker looks again then rather than at its next poll.
pub async fn soonest_turn(db: &Db) -> Result<Option<std::time::Duration>, DbErr> {
    let row = db
        .conn()
        .query_one_raw(db.clock().statement(SOONEST_TURN, Vec::<Value>::new()))
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let turn_at: Option<DateTime<Utc>> = row.try_get("", "turn_at")?;
    let now: DateTime<Utc> = row.try_get("", "now")?;
    Ok(turn_at.and_then(|at| (at - now).to_std().ok()))
}

/// Wakes every sleeping endpoint with due work and a free slot: the backstop sweep.
/// Returns how many it woke.
pub async fn sweep(db: &Db, default_max_in_flight: u32) -> Result<u64, DbErr> {
    wake_ready(db, None, default_max_in_flight).await
}

/// [`flow::sweep`] over `only` those endpoints, or all.
async fn wake_ready(
    db: &Db,
    only: Option<&[Uuid]>,
    default_max_in_flight: u32,
) -> Result<u64, DbErr> {
    let mut values = vec![Value::from(i64::from(default_max_in_flight))];
    let list = only.map(|ids| {
        let (list, ids) = Db::id_list(db.backend(), 2, ids, false);
        values.extend(ids);
        list
    });
    let sql = flow::sweep(db.backend(), list.as_deref());
    let statement = db.clock().statement(&sql, values);
    Ok(db.conn().execute_raw(statement).await?.rows_affected())
}

/// Parks the due rows and expired leases of a disabled endpoint (see [`PARK_DUE`] and
/// [`PARK_EXPIRED`]) and publishes the leases' return to `PENDING`.
async fn park_disabled(db: &Db, bus: &ChangeBus, endpoint_id: Uuid) -> Result<(), DbErr> {
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
            bus.stage(&*txn, changes).await
        })
        .await?;
    staged.committed();
    Ok(())
}
