//! Submissions: the idempotent `submit` (race 3) and reading what was submitted.

use std::sync::Arc;

use entity::webhook_delivery::{self, DeliveryState};
use entity::{endpoint, submission};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};
use serde_json::Value;
use uuid::Uuid;

use crate::auth::Identity;
use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::events::{Events, StateChange};
use crate::metrics::Metrics;
use crate::service::canonical::payload_hash;
use crate::service::rate_limit::RateLimiter;
use crate::wake::Wakeup;

/// Longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// What a partner submits.
#[derive(Debug, Clone)]
pub struct NewSubmission {
    /// The endpoint to deliver to.
    pub endpoint_id: Uuid,
    /// Any JSON value; delivered as the webhook body.
    pub payload: Value,
    /// Makes retries safe: the same key with the same content answers with the first submission.
    pub idempotency_key: Option<String>,
}

/// The answer to `submit`.
#[derive(Debug, Clone)]
pub struct SubmitOutcome {
    /// False when an earlier submission with the same key and content was returned.
    pub created: bool,
    /// The submission (new, or the earlier one).
    pub submission: submission::Model,
    /// Its delivery.
    pub delivery: webhook_delivery::Model,
}

/// Submission operations.
#[derive(Clone, Debug)]
pub struct Submissions {
    db: Db,
    rate_limiter: RateLimiter,
    max_payload_bytes: usize,
    wakeup: Wakeup,
    events: Events,
    metrics: Arc<Metrics>,
}

impl Submissions {
    /// Submission operations on `db`; `wakeup` is hinted after each new delivery commits.
    pub fn new(
        db: Db,
        rate_limiter: RateLimiter,
        max_payload_bytes: usize,
        wakeup: Wakeup,
        events: Events,
        metrics: Arc<Metrics>,
    ) -> Self {
        Submissions {
            db,
            rate_limiter,
            max_payload_bytes,
            wakeup,
            events,
            metrics,
        }
    }

    /// Stores a submission and its pending delivery in one transaction, or answers
    /// with the earlier submission that holds the same idempotency key.
    ///
    /// Race 3 is settled by `UNIQUE (endpoint_id, idempotency_key)`: the lookup before
    /// the insert is only a fast path. When the insert loses on the constraint, its
    /// transaction is rolled back (submission and delivery go together) and the winner
    /// is read afresh, outside the failed transaction's snapshot, so this stays correct
    /// at REPEATABLE READ.
    #[tracing::instrument(skip_all, fields(endpoint_id = %input.endpoint_id))]
    pub async fn submit(&self, caller: &Identity, input: NewSubmission) -> Result<SubmitOutcome> {
        caller.require_access(input.endpoint_id)?;
        let key = validate_key(input.idempotency_key)?;
        if contains_nul(&input.payload) {
            return Err(Error::bad_input(
                "payload must not contain NUL characters (\\u0000)",
            ));
        }
        let size = serde_json::to_vec(&input.payload)
            .map_err(|err| Error::bad_input(format!("payload is not valid JSON: {err}")))?
            .len();
        if size > self.max_payload_bytes {
            return Err(Error::bad_input(format!(
                "payload is {size} bytes; the limit is {}",
                self.max_payload_bytes
            )));
        }

        if let Err(err) = self.rate_limiter.check(&caller.key_id.to_string()).await {
            self.metrics.submission("rate_limited");
            return Err(err);
        }

        let endpoint = endpoint::Entity::find_by_id(input.endpoint_id)
            .one(self.db.conn())
            .await?
            .ok_or(Error::NotFound("endpoint"))?;
        if endpoint.disabled {
            return Err(Error::bad_input("the endpoint is disabled"));
        }

        let hash = payload_hash(&input.payload);
        if let Some(key) = &key {
            if let Some(existing) = self.find_by_key(endpoint.id, key).await? {
                return self.answer_existing(existing, &hash).await;
            }
        }

        match self
            .insert(caller, &endpoint, input.payload, key.clone(), hash.clone())
            .await
        {
            Ok(outcome) => {
                self.metrics.submission("created");
                self.wakeup.hint();
                tracing::info!(
                    submission_id = %outcome.submission.id,
                    delivery_id = %outcome.delivery.id,
                    "submission stored"
                );
                Ok(outcome)
            }
            Err(Error::UniqueViolation(_)) if key.is_some() => {
                let key = key.unwrap_or_default();
                let winner = self
                    .find_by_key(endpoint.id, &key)
                    .await?
                    .ok_or(Error::Database(sea_orm::DbErr::RecordNotFound(
                        "the submission that won the idempotency race".into(),
                    )))?;
                self.answer_existing(winner, &hash).await
            }
            Err(err) => Err(err),
        }
    }

    /// Inserts the submission and its delivery together.
    async fn insert(
        &self,
        caller: &Identity,
        endpoint: &endpoint::Model,
        payload: Value,
        idempotency_key: Option<String>,
        payload_hash: String,
    ) -> Result<SubmitOutcome> {
        let now = db::now();
        let txn = self.db.begin_write().await?;
        let submission = submission::ActiveModel {
            id: Set(Uuid::now_v7()),
            endpoint_id: Set(endpoint.id),
            idempotency_key: Set(idempotency_key),
            payload: Set(payload),
            payload_hash: Set(payload_hash),
            submitted_by: Set(Some(caller.key_id)),
            created_at: Set(now),
        }
        .insert(&txn)
        .await?;
        let delivery = webhook_delivery::ActiveModel {
            id: Set(Uuid::now_v7()),
            submission_id: Set(submission.id),
            endpoint_id: Set(endpoint.id),
            state: Set(DeliveryState::Pending),
            cycle_attempts: Set(0),
            next_attempt_at: Set(Some(now)),
            claim_token: Set(None),
            claim_expires_at: Set(None),
            last_error: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(&txn)
        .await?;
        let created = StateChange {
            delivery_id: delivery.id,
            endpoint_id: endpoint.id,
            previous_state: None,
            state: DeliveryState::Pending,
            at: now,
        };
        let staged = self.events.stage(&txn, vec![created]).await?;
        txn.commit().await?;
        staged.committed();
        Ok(SubmitOutcome {
            created: true,
            submission,
            delivery,
        })
    }

    async fn find_by_key(&self, endpoint_id: Uuid, key: &str) -> Result<Option<submission::Model>> {
        Ok(submission::Entity::find()
            .filter(submission::Column::EndpointId.eq(endpoint_id))
            .filter(submission::Column::IdempotencyKey.eq(key))
            .one(self.db.conn())
            .await?)
    }

    /// Same content: the earlier submission, `created: false`. Different content: a conflict.
    async fn answer_existing(
        &self,
        existing: submission::Model,
        hash: &str,
    ) -> Result<SubmitOutcome> {
        if existing.payload_hash != hash {
            self.metrics.submission("conflicted");
            return Err(Error::IdempotencyConflict);
        }
        let delivery = webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::SubmissionId.eq(existing.id))
            .one(self.db.conn())
            .await?
            .ok_or(Error::NotFound("delivery"))?;
        self.metrics.submission("deduplicated");
        Ok(SubmitOutcome {
            created: false,
            submission: existing,
            delivery,
        })
    }

    /// One submission, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<submission::Model>> {
        let found = self.load(id).await?;
        if let Some(found) = &found {
            caller.require_access(found.endpoint_id)?;
        }
        Ok(found)
    }

    /// One submission by id, with no scope check: for fields of rows already checked.
    pub async fn load(&self, id: Uuid) -> Result<Option<submission::Model>> {
        Ok(submission::Entity::find_by_id(id)
            .one(self.db.conn())
            .await?)
    }
}

/// An idempotency key is optional; when given it is 1 to 255 characters.
fn validate_key(key: Option<String>) -> Result<Option<String>> {
    match key {
        None => Ok(None),
        Some(key) if key.is_empty() => Err(Error::bad_input("idempotencyKey must not be empty")),
        Some(key) if key.chars().any(char::is_control) => Err(Error::bad_input(
            "idempotencyKey must not contain control characters",
        )),
        Some(key) if key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS => Err(Error::bad_input(
            format!("idempotencyKey must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        )),
        Some(key) => Ok(Some(key)),
    }
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
