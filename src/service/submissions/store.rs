//! Storing a submission and its delivery together, with the `PENDING` event, as cheaply as
//! each backend allows: one statement on PostgreSQL, one write transaction on SQLite.

use entity::webhook_delivery::{self, DeliveryState};
use entity::{endpoint, submission};
use sea_orm::{ActiveModelTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel};
use serde_json::Value;
use uuid::Uuid;

use crate::bus::{ChangeBus, StateChange};
use crate::db::parking::with_parking;
use crate::db::Db;
use crate::service::flow;

/// PostgreSQL: the submission, its delivery and the `NOTIFY` in one statement, in one
/// transaction. Nothing is written unless the endpoint exists and is enabled, read under
/// the parking rule's share lock so a concurrent disable is serialised with this write; a
/// lost idempotency race fails the whole statement on the unique constraint. Times are
/// the database's; the event carries the stored time. The endpoint's turn is woken if it
/// slept (see [`crate::service::flow`]).
const STORE_POSTGRES: &str = "\
WITH target AS (
    SELECT $1::uuid AS id WHERE {parked($1::uuid)} = false
), stored_submission AS (
    INSERT INTO submissions
        (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at, event_type)
    SELECT $2, target.id, $3, $4, $5, $6, {now}, $10 FROM target
    RETURNING id, endpoint_id, created_at
), stored_delivery AS (
    INSERT INTO webhook_deliveries
        (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at)
    SELECT $7, s.id, s.endpoint_id, 'pending', 0, s.created_at, s.created_at, s.created_at
    FROM stored_submission s
    RETURNING id, created_at
), woken AS (
    {wake}
)
SELECT stored_delivery.id, stored_delivery.created_at,
       pg_notify($8, jsonb_set($9::jsonb, '{t}', to_jsonb(stored_delivery.created_at))::text)
FROM stored_delivery";

/// A submission about to be stored.
#[derive(Debug, Clone)]
pub struct NewRows {
    /// The submission row.
    pub submission: submission::Model,
    /// Its delivery's id.
    pub delivery_id: Uuid,
}

/// What storing produces: the submission and its delivery as written.
pub type Stored = Option<(submission::Model, webhook_delivery::Model)>;

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

/// Stores the submission and its `pending` delivery, due now, and publishes the creation.
/// `Ok(None)`: the endpoint does not exist or is disabled, and nothing was written. On
/// PostgreSQL the rows come back with the database's time.
pub async fn store(db: &Db, bus: &ChangeBus, rows: NewRows) -> Result<Stored, DbErr> {
    let prepared = prepare(rows);
    match db.backend() {
        DbBackend::Postgres => store_postgres(db, prepared).await,
        _ => {
            let prepared = &prepared;
            let stored = db
                .transaction(|txn| async move {
                    let target = endpoint::Entity::find_by_id(prepared.submission.endpoint_id)
                        .one(&*txn)
                        .await?;
                    if target.is_none_or(|endpoint| endpoint.disabled) {
                        return Ok(None);
                    }
                    let submission = prepared
                        .submission
                        .clone()
                        .into_active_model()
                        .insert(&*txn)
                        .await?;
                    let delivery = prepared
                        .delivery
                        .clone()
                        .into_active_model()
                        .insert(&*txn)
                        .await?;
                    flow::wake_endpoints(&*txn, db.backend(), &[delivery.endpoint_id]).await?;
                    let staged = bus.stage(&*txn, vec![prepared.created.clone()]).await?;
                    Ok(Some((submission, delivery, staged)))
                })
                .await?;
            Ok(stored.map(|(submission, delivery, staged)| {
                staged.committed();
                (submission, delivery)
            }))
        }
    }
}

async fn store_postgres(db: &Db, prepared: Prepared) -> Result<Stored, DbErr> {
    let Prepared {
        mut submission,
        mut delivery,
        created,
    } = prepared;
    let sql = with_parking(DbBackend::Postgres, STORE_POSTGRES).replace(
        "{wake}",
        &flow::wake(
            DbBackend::Postgres,
            "SELECT endpoint_id FROM stored_submission",
        ),
    );
    let values = [
        submission.endpoint_id.into(),
        submission.id.into(),
        submission.idempotency_key.clone().into(),
        submission.payload.clone().into(),
        submission.payload_hash.clone().into(),
        submission.submitted_by.into(),
        delivery.id.into(),
        crate::bus::CHANGES_CHANNEL.into(),
        created.to_wire()?.into(),
        submission.event_type.clone().into(),
    ];
    let (sql, values) = (&sql, &values);
    // One statement, committed on its own: a single round trip per submission.
    let stored = db
        .autocommit(|| db.clock().statement(sql, values.iter().cloned()))
        .await?;
    let Some(row) = stored.first() else {
        return Ok(None);
    };
    let at = row.try_get("", "created_at")?;
    submission.created_at = at;
    stamp(&mut delivery, at);
    Ok(Some((submission, delivery)))
}

/// Sets a new delivery's times to `at`, the time the database stored it with.
pub fn stamp(delivery: &mut webhook_delivery::Model, at: chrono::DateTime<chrono::Utc>) {
    delivery.next_attempt_at = Some(at);
    delivery.created_at = at;
    delivery.updated_at = at;
}

/// Whether `payload` could be stored as-is (kept here beside the SQL that stores it).
pub fn storable(payload: &Value) -> bool {
    !contains_nul(payload)
}

/// Whether any string or key in `value` holds U+0000, which PostgreSQL cannot store in
/// `jsonb`. Refused up front on every backend, so both behave alike.
fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, item)| key.contains('\0') || contains_nul(item)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}
