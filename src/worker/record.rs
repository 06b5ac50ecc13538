//! Loading what to send, and recording what happened (race 2): every result is fenced by
//! its claim token, and every attempt is kept, numbered for the delivery's lifetime.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::delivery_attempt;
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ActiveModelTrait, ConnectionTrait, DbErr, Set, Statement};
use uuid::Uuid;

use super::claim::Claim;
use super::dispatch::AttemptOutcome;
use super::schedule::NextStep;
use crate::db::{self, Db};
use crate::events::{Events, StateChange};

/// Everything needed to send the claimed deliveries, read once per batch just before sending.
const LOAD_TARGETS: &str = "\
SELECT d.id, s.payload, e.url, e.signing_secret
FROM webhook_deliveries d
JOIN submissions s ON s.id = d.submission_id
JOIN endpoints e ON e.id = d.endpoint_id
WHERE d.id IN ({ids})";

/// Locks the delivery row so concurrent recorders of one delivery take turns.
const LOCK_DELIVERY: &str = "SELECT id FROM webhook_deliveries WHERE id = $1";

/// The attempt a claim already recorded, if any: a claim makes one attempt, so a retried
/// `record` (say, after a commit whose acknowledgement was lost) must not add a second.
const ATTEMPT_OF_CLAIM: &str =
    "SELECT number, superseded FROM delivery_attempts WHERE delivery_id = $1 AND claim_token = $2";

/// The next free lifetime attempt number, read under the delivery's row lock.
const NEXT_ATTEMPT_NUMBER: &str =
    "SELECT COALESCE(MAX(number), 0) + 1 AS next FROM delivery_attempts WHERE delivery_id = $1";

/// The fenced transition: applies only while this claim still holds the delivery.
/// Zero rows means a newer claim took over, and its state stands.
const FENCED_TRANSITION: &str = "\
UPDATE webhook_deliveries
SET state = $3,
    cycle_attempts = cycle_attempts + 1,
    next_attempt_at = $4,
    claim_token = NULL,
    claim_expires_at = NULL,
    last_error = $5,
    updated_at = $6
WHERE id = $1 AND claim_token = $2";

/// Where and what to send for one claimed delivery.
#[derive(Debug, Clone)]
pub struct Target {
    /// The endpoint URL.
    pub url: String,
    /// The endpoint's signing secret, as stored right now.
    pub secret: String,
    /// The JSON body.
    pub body: Vec<u8>,
}

/// Reads the payload, URL and secret of each claimed delivery in one query.
pub async fn load_targets(db: &Db, claims: &[Claim]) -> Result<HashMap<Uuid, Target>, DbErr> {
    if claims.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = LOAD_TARGETS.replace("{ids}", &Db::placeholders(1, claims.len()));
    let values = claims.iter().map(|claim| claim.delivery_id.into());
    let rows = db
        .conn()
        .query_all_raw(Statement::from_sql_and_values(db.backend(), &sql, values))
        .await?;
    let mut targets = HashMap::with_capacity(rows.len());
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        let payload: serde_json::Value = row.try_get("", "payload")?;
        let body = serde_json::to_vec(&payload).map_err(|err| DbErr::Json(err.to_string()))?;
        targets.insert(
            id,
            Target {
                url: row.try_get("", "url")?,
                secret: row.try_get("", "signing_secret")?,
                body,
            },
        );
    }
    Ok(targets)
}

/// What recording an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The attempt's lifetime number.
    pub number: i32,
    /// The delivery's new state, or `None` when the claim had been superseded.
    pub new_state: Option<DeliveryState>,
    /// When the next attempt is due, for a retry.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// One finished attempt, ready to record.
#[derive(Debug, Clone)]
pub struct FinishedAttempt<'a> {
    /// The claim that made it.
    pub claim: &'a Claim,
    /// What the endpoint did.
    pub outcome: &'a AttemptOutcome,
    /// What happens next, if the claim still holds.
    pub step: NextStep,
    /// When the request started.
    pub started_at: DateTime<Utc>,
    /// When the outcome was known.
    pub finished_at: DateTime<Utc>,
}

/// Records one attempt and, if its claim still holds, the delivery's transition, in one
/// transaction. The attempt is recorded either way; a superseded one is marked so.
pub async fn record(
    db: &Db,
    events: &Events,
    attempt: &FinishedAttempt<'_>,
) -> Result<Recorded, DbErr> {
    let claim = attempt.claim;
    let (new_state, next_attempt_at) = match attempt.step {
        NextStep::Delivered => (DeliveryState::Delivered, None),
        NextStep::Failed => (DeliveryState::Failed, None),
        NextStep::RetryAfter(delay) => (
            DeliveryState::Pending,
            Some(
                attempt.finished_at
                    + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX),
            ),
        ),
    };
    let backend = db.backend();
    let txn = db.begin_read_committed().await?;
    txn.execute_raw(Statement::from_sql_and_values(
        backend,
        format!("{LOCK_DELIVERY}{}", db.lock_rows()),
        [claim.delivery_id.into()],
    ))
    .await?;
    if let Some(existing) = txn
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            ATTEMPT_OF_CLAIM,
            [claim.delivery_id.into(), claim.claim_token.into()],
        ))
        .await?
    {
        let superseded: bool = existing.try_get("", "superseded")?;
        txn.commit().await?;
        return Ok(Recorded {
            number: existing.try_get("", "number")?,
            new_state: (!superseded).then_some(new_state),
            next_attempt_at: if superseded { None } else { next_attempt_at },
        });
    }
    let number: i32 = txn
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            NEXT_ATTEMPT_NUMBER,
            [claim.delivery_id.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("next attempt number".into()))?
        .try_get("", "next")?;
    let transition = txn
        .execute_raw(Statement::from_sql_and_values(
            backend,
            FENCED_TRANSITION,
            [
                claim.delivery_id.into(),
                claim.claim_token.into(),
                new_state.as_str().into(),
                next_attempt_at.into(),
                attempt.outcome.error.clone().into(),
                db::now().into(),
            ],
        ))
        .await?;
    let superseded = transition.rows_affected() == 0;
    delivery_attempt::ActiveModel {
        id: Set(Uuid::now_v7()),
        delivery_id: Set(claim.delivery_id),
        number: Set(number),
        claim_token: Set(claim.claim_token),
        started_at: Set(attempt.started_at),
        finished_at: Set(attempt.finished_at),
        status_code: Set(attempt.outcome.status.map(i32::from)),
        error: Set(attempt.outcome.error.clone()),
        duration_ms: Set(Some(
            i32::try_from(attempt.outcome.duration.as_millis()).unwrap_or(i32::MAX),
        )),
        superseded: Set(superseded),
    }
    .insert(&txn)
    .await?;
    let changes = if superseded {
        Vec::new()
    } else {
        vec![StateChange {
            delivery_id: claim.delivery_id,
            endpoint_id: claim.endpoint_id,
            previous_state: Some(DeliveryState::Processing),
            state: new_state,
            at: attempt.finished_at,
        }]
    };
    let staged = events.stage(&txn, changes).await?;
    txn.commit().await?;
    staged.committed();
    Ok(Recorded {
        number,
        new_state: (!superseded).then_some(new_state),
        next_attempt_at: if superseded { None } else { next_attempt_at },
    })
}
