//! Storing a submission and its delivery together, with the `PENDING` event, as cheaply as
//! each backend allows: one statement on PostgreSQL, one write transaction on SQLite.

use entity::webhook_delivery::{self, DeliveryState};
use entity::{endpoint, submission};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel, Statement,
};
use serde_json::Value;
use uuid::Uuid;

use crate::db::Db;
use crate::events::{Events, StateChange};

/// PostgreSQL: the submission, its delivery and the `NOTIFY` in one statement, hence one
/// atomic autocommit. Nothing is written unless the endpoint exists and is enabled; a lost
/// idempotency race fails the whole statement on the unique constraint. The endpoint is
/// read `FOR SHARE`, so a disable waits for this commit (and then parks the new delivery),
/// or this waits for the disable and then finds the endpoint disabled: never a due delivery
/// of a disabled endpoint.
const STORE_POSTGRES: &str = "\
WITH target AS (
    SELECT id FROM endpoints WHERE id = $1 AND NOT disabled FOR SHARE
), stored_submission AS (
    INSERT INTO submissions
        (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at, event_type)
    SELECT $2, target.id, $3, $4, $5, $6, $7, $11 FROM target
    RETURNING id, endpoint_id
), stored_delivery AS (
    INSERT INTO webhook_deliveries
        (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at)
    SELECT $8, stored_submission.id, stored_submission.endpoint_id, 'pending', 0, $7, $7, $7
    FROM stored_submission
    RETURNING id
)
SELECT stored_delivery.id, pg_notify($9, $10) FROM stored_delivery";

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
pub struct Prepared {
    /// The submission row.
    pub submission: submission::Model,
    /// The delivery row: `pending`, due now.
    pub delivery: webhook_delivery::Model,
    /// `previousState: null` -> `PENDING`.
    pub created: StateChange,
}

/// Builds the rows to write for `rows`.
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
/// `Ok(None)`: the endpoint does not exist or is disabled, and nothing was written.
pub async fn store(db: &Db, events: &Events, rows: NewRows) -> Result<Stored, DbErr> {
    let Prepared {
        submission,
        delivery,
        created,
    } = prepare(rows);
    let now = submission.created_at;
    match db.backend() {
        DbBackend::Postgres => {
            let stored = db
                .conn()
                .query_one_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    STORE_POSTGRES,
                    [
                        submission.endpoint_id.into(),
                        submission.id.into(),
                        submission.idempotency_key.clone().into(),
                        submission.payload.clone().into(),
                        submission.payload_hash.clone().into(),
                        submission.submitted_by.into(),
                        now.into(),
                        delivery.id.into(),
                        crate::events::EVENTS_CHANNEL.into(),
                        created.to_wire()?.into(),
                        submission.event_type.clone().into(),
                    ],
                ))
                .await?;
            Ok(stored.map(|_| (submission, delivery)))
        }
        _ => {
            let txn = db.begin_write().await?;
            let target = endpoint::Entity::find_by_id(submission.endpoint_id)
                .one(&txn)
                .await?;
            if target.is_none_or(|endpoint| endpoint.disabled) {
                return Ok(None);
            }
            let submission = submission.into_active_model().insert(&txn).await?;
            let delivery = delivery.into_active_model().insert(&txn).await?;
            let staged = events.stage(&txn, vec![created]).await?;
            txn.commit().await?;
            staged.committed();
            Ok(Some((submission, delivery)))
        }
    }
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
