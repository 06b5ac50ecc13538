//! Submissions: the idempotent `submit` (race 3) and reading what was submitted.

pub mod group_commit;
pub mod publish;
pub mod store;

use std::sync::Arc;

use entity::webhook_delivery;
use entity::{endpoint, submission};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::Value;
use uuid::Uuid;

use crate::auth::Identity;
use crate::bus::Wakeup;
use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::service::event_types;
use crate::service::payload;
use crate::service::payload::canonical::payload_hash;
use crate::service::rate_limit::RateLimiter;
use crate::service::submissions::group_commit::SubmitBatcher;
use crate::service::submissions::store::NewRows;

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
    /// An optional event type label (`submit` ignores endpoints' type filters).
    pub event_type: Option<String>,
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
    writer: SubmitBatcher,
    metrics: Arc<Metrics>,
}

impl Submissions {
    /// Submission operations on `db`; `wakeup` is hinted after each new delivery commits.
    pub fn new(
        db: Db,
        rate_limiter: RateLimiter,
        max_payload_bytes: usize,
        wakeup: Wakeup,
        writer: SubmitBatcher,
        metrics: Arc<Metrics>,
    ) -> Self {
        Submissions {
            db,
            rate_limiter,
            max_payload_bytes,
            wakeup,
            writer,
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
    #[tracing::instrument(level = "debug", skip_all, fields(endpoint_id = %input.endpoint_id))]
    pub async fn submit(&self, caller: &Identity, input: NewSubmission) -> Result<SubmitOutcome> {
        caller.require_access(input.endpoint_id)?;
        let key = validate_key(input.idempotency_key)?;
        let event_type = input
            .event_type
            .as_deref()
            .map(event_types::validate)
            .transpose()?;
        let payload = payload::accept(input.payload, self.max_payload_bytes)?;

        if let Err(err) = self.rate_limiter.check(&caller.key_id.to_string()).await {
            self.metrics.submission("rate_limited");
            return Err(err);
        }

        let hash =
            payload_hash(&payload).map_err(|err| Error::bad_input(format!("payload: {err}")))?;
        if let Some(key) = &key {
            if let Some(existing) = self.find_by_key(input.endpoint_id, key).await? {
                return self.answer_existing(existing, &hash).await;
            }
        }

        let rows = NewRows {
            submission: submission::Model {
                id: Uuid::now_v7(),
                endpoint_id: input.endpoint_id,
                idempotency_key: key.clone(),
                payload,
                payload_hash: hash.clone(),
                submitted_by: Some(caller.key_id),
                created_at: db::now(),
                event_id: None,
                event_type,
            },
            delivery_id: Uuid::now_v7(),
        };
        match self.writer.store(rows).await {
            Ok(Some((submission, delivery))) => {
                self.metrics.submission("created");
                self.wakeup.hint();
                tracing::debug!(submission_id = %submission.id, delivery_id = %delivery.id, "submission stored");
                Ok(SubmitOutcome {
                    created: true,
                    submission,
                    delivery,
                })
            }
            Ok(None) => Err(self.why_not_stored(input.endpoint_id).await),
            Err(Error::UniqueViolation(_)) if key.is_some() => {
                let key = key.unwrap_or_default();
                let winner =
                    self.find_by_key(input.endpoint_id, &key)
                        .await?
                        .ok_or(Error::Database(sea_orm::DbErr::RecordNotFound(
                            "the submission that won the idempotency race".into(),
                        )))?;
                self.answer_existing(winner, &hash).await
            }
            Err(err) => Err(err),
        }
    }

    /// Why nothing was stored for `endpoint_id`: it is unknown, or disabled.
    async fn why_not_stored(&self, endpoint_id: Uuid) -> Error {
        match endpoint::Entity::find_by_id(endpoint_id)
            .one(self.db.conn())
            .await
        {
            Ok(Some(endpoint)) if endpoint.disabled => Error::bad_input("the endpoint is disabled"),
            Ok(_) => Error::NotFound("endpoint"),
            Err(err) => err.into(),
        }
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

    /// The submissions with these ids, with no scope check.
    pub async fn load_many(&self, ids: &[Uuid]) -> Result<Vec<submission::Model>> {
        Ok(submission::Entity::find()
            .filter(submission::Column::Id.is_in(ids.iter().copied()))
            .all(self.db.conn())
            .await?)
    }
}

/// An idempotency key is optional; when given it is 1 to 255 characters.
pub(crate) fn validate_key(key: Option<String>) -> Result<Option<String>> {
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
