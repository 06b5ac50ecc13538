//! Storing submissions, each with its delivery and the `PENDING` event, and telling what
//! happened as a value the SQL reports ([`Stored`]): one statement for any number of
//! submissions on PostgreSQL (one submission is a batch of one), one write transaction per
//! submission on SQLite.

use std::collections::HashMap;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::{self, DeliveryState};
use entity::{endpoint, submission};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait,
    IntoActiveModel, QueryResult, Statement, TryInsertResult, Value,
};
use serde_json::Value as Json;
use uuid::Uuid;

use crate::bus::{self, ChangeBus, Staged, StateChange};
use crate::db::parking::with_parking;
use crate::db::sql::{fill, Rows};
use crate::db::{Clock, Db};
use crate::service::flow;
use crate::service::lines::{self, Place};
use crate::worker::claim::{ClaimRequest, Claimed};
use crate::worker::handoff::{claim_at_submit, FailedClaim};

use super::claim_in_store;

/// PostgreSQL, for any number of submissions: the submissions, their deliveries and their
/// creation events in one statement. A row whose endpoint is unknown or disabled is
/// skipped (the endpoints read under the parking rule's share lock, once each, so a
/// concurrent disable is serialised with this write); so is a row whose idempotency key is
/// already taken, by an earlier submission or by another row of the same statement. Every
/// row comes back with its outcome and, when stored, the time it was stored with (the
/// database's). The endpoints' turns are woken if they slept (see [`crate::service::flow`]).
/// A row with an ordering key enters its line (see [`crate::service::lines`]) and, unless
/// it is the line's head, is stored waiting, without a due time. A row its endpoint has
/// `{room}` for is stored already claimed (see [`super::claim_in_store`]; the other forms
/// have no room), and its endpoint's turn is then left to the claim rather than woken.
/// `{rows}` is a [`Rows`] of [`STORE_COLUMNS`]: no key, no event type, no ordering key and
/// no trace context travel as `''` (none can be empty), no submitter as the nil id.
const STORE_POSTGRES: &str = "\
WITH input (submission_id, delivery_id, endpoint_id, idempotency_key, payload, payload_hash,
            submitted_by, event, event_type, ordering_key, trace_context) AS ({rows}),
valid AS (
    SELECT input.* FROM input {enabled_join(input.endpoint_id)} {lock_enabled}
), stored_submissions AS (
    INSERT INTO submissions
        (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at, event_type,
         ordering_key, trace_context)
    SELECT submission_id, endpoint_id, NULLIF(idempotency_key, ''), payload, payload_hash,
           NULLIF(submitted_by, '00000000-0000-0000-0000-000000000000'), {now},
           NULLIF(event_type, ''), NULLIF(ordering_key, ''), NULLIF(trace_context, '')
    FROM valid
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING id, created_at
), keyed AS (
    SELECT valid.delivery_id, valid.endpoint_id, valid.ordering_key, NULL::bigint AS line_seq
    FROM valid JOIN stored_submissions s ON s.id = valid.submission_id
    WHERE valid.ordering_key <> ''
), {enter_lines}, {room}, stored_deliveries AS (
    INSERT INTO webhook_deliveries
        (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at,
         event_type, ordering_key, line_seq, waiting, claim_token, claim_expires_at)
    SELECT valid.delivery_id, valid.submission_id, valid.endpoint_id,
           CASE WHEN room.token IS NULL THEN 'pending' ELSE 'processing' END, 0,
           CASE WHEN p.waiting THEN NULL ELSE COALESCE(room.lease, s.created_at) END,
           s.created_at, s.created_at,
           NULLIF(valid.event_type, ''), NULLIF(valid.ordering_key, ''), p.line_seq,
           COALESCE(p.waiting, FALSE), room.token, room.lease
    FROM valid JOIN stored_submissions s ON s.id = valid.submission_id
    LEFT JOIN line_places p ON p.delivery_id = valid.delivery_id
    LEFT JOIN room ON room.endpoint_id = valid.endpoint_id
    RETURNING id, endpoint_id, created_at, line_seq, waiting, claim_token, claim_expires_at
), woken AS (
    {wake}
), notified AS (
    {notify}
){claim_writes}
SELECT input.delivery_id AS id,
       CASE WHEN stored_deliveries.id IS NOT NULL THEN 'created'
            WHEN valid.delivery_id IS NOT NULL THEN 'key_taken'
            WHEN EXISTS (SELECT 1 FROM endpoints e WHERE e.id = input.endpoint_id) THEN 'disabled'
            ELSE 'missing' END AS outcome,
       stored_deliveries.created_at, stored_deliveries.line_seq, stored_deliveries.waiting{claim_columns}
FROM input
LEFT JOIN valid ON valid.delivery_id = input.delivery_id
LEFT JOIN stored_deliveries ON stored_deliveries.id = input.delivery_id
CROSS JOIN notified{claim_joins}";

/// The types of `STORE_POSTGRES`' rows.
const STORE_COLUMNS: &[&str] = &[
    "uuid", "uuid", "uuid", "text", "jsonb", "text", "uuid", "text", "text", "text", "text",
];

/// The creation events of what `STORE_POSTGRES` stored, stamped with the stored time.
const STORED_CHANGES: &str = "\
SELECT input.event AS wire, d.created_at AS at
FROM input JOIN stored_deliveries d ON d.id = input.delivery_id";

/// What storing one submission did.
#[derive(Debug, Clone)]
pub enum Stored {
    /// Stored: the submission and its delivery as written (with the database's time on
    /// PostgreSQL), and whether the submission claimed the delivery as it stored it (see
    /// [`super::claiming::store_claiming`]): then the worker has it already and needs no wake-up.
    Created(Box<submission::Model>, Box<webhook_delivery::Model>, bool),
    /// Its idempotency key was already taken for the endpoint; nothing was written.
    KeyTaken,
    /// The endpoint is disabled; nothing was written.
    EndpointDisabled,
    /// There is no such endpoint; nothing was written.
    EndpointMissing,
}

/// A submission about to be stored.
#[derive(Debug, Clone)]
pub struct NewRows {
    /// The submission row.
    pub submission: submission::Model,
    /// Its delivery's id.
    pub delivery_id: Uuid,
}

/// The rows of a submission ready to write, and the event announcing them.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The submission row.
    pub submission: submission::Model,
    /// The delivery row: `pending`, due now.
    pub delivery: webhook_delivery::Model,
    /// `previousState: null` -> `PENDING`.
    pub created: StateChange,
}

/// Builds the rows to write for `rows`, timed by `rows.submission.created_at` (on
/// PostgreSQL the statement replaces that time with the database's).
pub fn prepare(rows: NewRows) -> Prepared {
    let submission = rows.submission;
    let now = submission.created_at;
    let delivery = webhook_delivery::Model {
        id: rows.delivery_id,
        submission_id: submission.id,
        endpoint_id: submission.endpoint_id,
        state: DeliveryState::Pending,
        cycle_attempts: 0,
        next_attempt_at: Some(now),
        claim_token: None,
        claim_expires_at: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        event_type: submission.event_type.clone(),
        ordering_key: submission.ordering_key.clone(),
        line_seq: None,
        waiting: false,
    };
    let created = StateChange {
        delivery_id: delivery.id,
        endpoint_id: delivery.endpoint_id,
        previous_state: None,
        state: DeliveryState::Pending,
        at: now,
    };
    Prepared {
        submission,
        delivery,
        created,
    }
}

/// Stores one submission and its `pending` delivery, due now, and publishes the creation.
pub async fn store(db: &Db, bus: &ChangeBus, rows: NewRows) -> Result<Stored, DbErr> {
    store_prepared(db, bus, prepare(rows)).await
}

/// [`store`], for rows already prepared.
pub(super) async fn store_prepared(
    db: &Db,
    bus: &ChangeBus,
    prepared: Prepared,
) -> Result<Stored, DbErr> {
    match db.backend() {
        DbBackend::Postgres => {
            let reported = store_many(db, std::slice::from_ref(&prepared)).await?;
            let reported = reported.get(&prepared.delivery.id).copied();
            Ok(outcome(prepared, reported))
        }
        _ => Ok(store_sqlite(db, bus, &prepared, None).await?.0),
    }
}

/// What a row of `STORE_POSTGRES` reported, by delivery id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// Stored, at this time, and where it stands in its line if it has an ordering key.
    Created(DateTime<Utc>, Option<Place>),
    /// See [`Stored::KeyTaken`].
    KeyTaken,
    /// See [`Stored::EndpointDisabled`].
    EndpointDisabled,
    /// See [`Stored::EndpointMissing`].
    EndpointMissing,
}

/// The outcome for `prepared` from what its row reported (`None`: no row, which a correct
/// statement never gives; told as a missing endpoint, since nothing was written).
pub fn outcome(prepared: Prepared, reported: Option<Reported>) -> Stored {
    match reported {
        Some(Reported::Created(at, place)) => {
            let Prepared {
                mut submission,
                mut delivery,
                ..
            } = prepared;
            submission.created_at = at;
            stamp(&mut delivery, at);
            if let Some(place) = place {
                placed(&mut delivery, place);
            }
            Stored::Created(Box::new(submission), Box::new(delivery), false)
        }
        Some(Reported::KeyTaken) => Stored::KeyTaken,
        Some(Reported::EndpointDisabled) => Stored::EndpointDisabled,
        Some(Reported::EndpointMissing) | None => Stored::EndpointMissing,
    }
}

/// Writes `prepared` with `STORE_POSTGRES`, committed on its own (one round trip however
/// many rows), and returns what each row reported, by delivery id.
pub async fn store_many(db: &Db, prepared: &[Prepared]) -> Result<HashMap<Uuid, Reported>, DbErr> {
    // Built afresh for each try (rarely more than one), straight into the statement.
    let statement = || store_statement(prepared, Notify::InStatement, []);
    // A batch with ordering keys upserts its lines' rows, which concurrent batches of the
    // same lines also update: at READ COMMITTED such a batch waits for the other and goes
    // on, while at a stricter server default it would fail to serialize again and again on
    // a busy line. So it runs in a transaction under the race policy (READ COMMITTED); the
    // rest stays one round trip.
    let keyed = prepared.iter().any(|p| p.submission.ordering_key.is_some());
    let reported = if keyed {
        db.transaction(|txn| {
            let statement = statement();
            async move { txn.query_all_raw(statement?).await }
        })
        .await?
    } else {
        db.autocommit(statement).await?
    };
    reported_by_row(&reported)
}

/// Who publishes the creation of what `STORE_POSTGRES` stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Notify {
    /// The statement itself, with its commit.
    InStatement,
    /// The caller, staging it later in the same transaction (with a claim's changes).
    Staged,
    /// The statement itself, which also claims the one submission it stores when its
    /// endpoint has room (see [`super::claim_in_store`]), publishing the claim with it.
    Claiming,
}

/// `STORE_POSTGRES` for `prepared`, bound, with `more` values after the rows' (the claiming
/// form's own). On PostgreSQL the rows travel as arrays, so the text is the same for every
/// batch: it is rendered once per process (for each way of publishing the creation).
pub(super) fn store_statement(
    prepared: &[Prepared],
    notify: Notify,
    more: impl IntoIterator<Item = Value>,
) -> Result<Statement, DbErr> {
    let mut rows = Rows::new(DbBackend::Postgres, STORE_COLUMNS);
    for p in prepared {
        let s = &p.submission;
        rows.push([
            Value::from(s.id),
            Value::from(p.delivery.id),
            Value::from(s.endpoint_id),
            Value::from(s.idempotency_key.clone().unwrap_or_default()),
            Value::from(s.payload.clone()),
            Value::from(s.payload_hash.clone()),
            Value::from(s.submitted_by.unwrap_or_default()),
            Value::from(p.created.to_wire()?),
            Value::from(s.event_type.clone().unwrap_or_default()),
            Value::from(s.ordering_key.clone().unwrap_or_default()),
            Value::from(s.trace_context.clone().unwrap_or_default()),
        ])?;
    }
    let (rows, mut values) = rows.render(1);
    values.extend(more);
    static IN_STATEMENT: OnceLock<String> = OnceLock::new();
    static STAGED: OnceLock<String> = OnceLock::new();
    static CLAIMING: OnceLock<String> = OnceLock::new();
    let cell = match notify {
        Notify::InStatement => &IN_STATEMENT,
        Notify::Staged => &STAGED,
        Notify::Claiming => &CLAIMING,
    };
    let sql = cell.get_or_init(|| {
        let wake = flow::wake(
            DbBackend::Postgres,
            "SELECT endpoint_id FROM stored_deliveries WHERE NOT waiting AND claim_token IS NULL",
        );
        let publish = match notify {
            Notify::InStatement => bus::notify_created(STORED_CHANGES),
            Notify::Staged => "SELECT 0 AS notifications".to_owned(),
            Notify::Claiming => {
                bus::notify_created(&claim_in_store::stored_changes(STORE_COLUMNS.len() + 1))
            }
        };
        let claim = match notify {
            Notify::Claiming => claim_in_store::slots(STORE_COLUMNS.len() + 1),
            _ => claim_in_store::no_room(),
        };
        let lines = lines::enter_ctes("keyed");
        let mut slots = vec![
            ("rows", rows.as_str()),
            ("wake", &wake),
            ("notify", &publish),
            ("enter_lines", &lines),
        ];
        slots.extend(claim.iter().map(|(slot, text)| (*slot, text.as_str())));
        Clock::rendered_in_database(&fill(
            &with_parking(DbBackend::Postgres, STORE_POSTGRES),
            &slots,
        ))
    });
    Ok(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql.as_str(),
        values,
    ))
}

/// Prepares and plans, on `txn`'s connection, both forms of the statement that stores
/// submissions (PostgreSQL), with no rows: nothing is written.
pub async fn warm_statements(txn: &DatabaseTransaction, db: &Db) -> Result<(), DbErr> {
    for notify in [Notify::InStatement, Notify::Staged] {
        txn.query_all_raw(store_statement(&[], notify, [])?).await?;
    }
    claim_in_store::warm(txn, db).await
}

/// What each row of `STORE_POSTGRES` reported, by delivery id.
pub(super) fn reported_by_row(rows: &[QueryResult]) -> Result<HashMap<Uuid, Reported>, DbErr> {
    rows.iter()
        .map(|row| {
            let id: Uuid = row.try_get("", "id")?;
            let outcome: String = row.try_get("", "outcome")?;
            let reported = match outcome.as_str() {
                "created" => {
                    let line_seq: Option<i64> = row.try_get("", "line_seq")?;
                    let waiting: Option<bool> = row.try_get("", "waiting")?;
                    let place = line_seq.map(|line_seq| Place {
                        line_seq,
                        waiting: waiting.unwrap_or(false),
                    });
                    Reported::Created(row.try_get("", "created_at")?, place)
                }
                "key_taken" => Reported::KeyTaken,
                "disabled" => Reported::EndpointDisabled,
                _ => Reported::EndpointMissing,
            };
            Ok((id, reported))
        })
        .collect()
}

/// What [`store_sqlite`] did, and the claim it made at submit, if asked to.
pub(super) type StoredSqlite = (Stored, Option<(Claimed, Staged)>);

/// SQLite: one write transaction (`BEGIN IMMEDIATE`, which excludes every other writer):
/// the endpoint read, the submission inserted unless its key is taken, then its delivery,
/// the endpoint's turn woken, with `claim` its due work claimed at submit (see
/// [`super::claiming::store_claiming`]; a claim that fails fails the transaction, marked
/// in its [`FailedClaim`]), and the changes staged.
pub(super) async fn store_sqlite(
    db: &Db,
    bus: &ChangeBus,
    prepared: &Prepared,
    claim: Option<(&ClaimRequest, &FailedClaim)>,
) -> Result<StoredSqlite, DbErr> {
    let stored = db
        .transaction(|txn| async move {
            if let Some((_, failed)) = claim {
                failed.reset();
            }
            let target = endpoint::Entity::find_by_id(prepared.submission.endpoint_id)
                .one(&*txn)
                .await?;
            match target {
                None => return Ok(None),
                Some(endpoint) if endpoint.disabled => return Ok(Some(None)),
                Some(_) => {}
            }
            let inserted =
                submission::Entity::insert(prepared.submission.clone().into_active_model())
                    .on_conflict_do_nothing_on([
                        submission::Column::EndpointId,
                        submission::Column::IdempotencyKey,
                    ])
                    .exec_without_returning(&*txn)
                    .await?;
            if !matches!(inserted, TryInsertResult::Inserted(1)) {
                return Ok(Some(Some(None)));
            }
            let mut delivery = prepared
                .delivery
                .clone()
                .into_active_model()
                .insert(&*txn)
                .await?;
            let places = lines::enter(&*txn, db.backend(), &[delivery.id]).await?;
            if let Some(place) = places.get(&delivery.id) {
                placed(&mut delivery, *place);
            }
            flow::wake_endpoints(&*txn, db.backend(), &[delivery.endpoint_id]).await?;
            let created = prepared.created.clone();
            let (claimed, staged) = match claim {
                Some((request, failed)) if !delivery.waiting => {
                    let (claimed, staged) =
                        claim_at_submit(&txn, db, bus, request, failed, created).await?;
                    (Some(claimed), staged)
                }
                _ => (None, bus.stage(&*txn, vec![created]).await?),
            };
            Ok(Some(Some(Some((delivery, staged, claimed)))))
        })
        .await?;
    Ok(match stored {
        None => (Stored::EndpointMissing, None),
        Some(None) => (Stored::EndpointDisabled, None),
        Some(Some(None)) => (Stored::KeyTaken, None),
        Some(Some(Some((delivery, staged, claimed)))) => {
            let delivery_id = delivery.id;
            let created = |claimed| {
                Stored::Created(
                    Box::new(prepared.submission.clone()),
                    Box::new(delivery),
                    claimed,
                )
            };
            match claimed {
                // Published by the caller, which hands the claim over.
                Some(claimed) => {
                    let this_one = claimed.claims.iter().any(|c| c.delivery_id == delivery_id);
                    (created(this_one), Some((claimed, staged)))
                }
                None => {
                    staged.committed();
                    (created(false), None)
                }
            }
        }
    })
}

/// Sets a new delivery's times to `at`, the time the database stored it with.
pub fn stamp(delivery: &mut webhook_delivery::Model, at: chrono::DateTime<chrono::Utc>) {
    delivery.next_attempt_at = Some(at);
    delivery.created_at = at;
    delivery.updated_at = at;
}

/// Sets a delivery's place in its line: a waiting one has no due time.
pub fn placed(delivery: &mut webhook_delivery::Model, place: Place) {
    delivery.line_seq = Some(place.line_seq);
    delivery.waiting = place.waiting;
    if place.waiting {
        delivery.next_attempt_at = None;
    }
}

/// Whether `payload` could be stored as-is (kept here beside the SQL that stores it).
pub fn storable(payload: &Json) -> bool {
    !contains_nul(payload)
}

/// Whether any string or key in `value` holds U+0000, which PostgreSQL cannot store in
/// `jsonb`. Refused up front on every backend, so both behave alike.
fn contains_nul(value: &Json) -> bool {
    match value {
        Json::String(text) => text.contains('\0'),
        Json::Array(items) => items.iter().any(contains_nul),
        Json::Object(map) => map
            .iter()
            .any(|(key, item)| key.contains('\0') || contains_nul(item)),
        Json::Null | Json::Bool(_) | Json::Number(_) => false,
    }
}
