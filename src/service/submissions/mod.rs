//! Submissions: the idempotent `submit` (race 3) and reading what was submitted.

mod claim_in_store;
pub mod claiming;
pub mod group_commit;
pub mod intake;
pub mod publish;
pub mod store;

use entity::submission;
use entity::webhook_delivery;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::Value;
use uuid::Uuid;

use self::group_commit::GroupCommit;
use self::intake::{Intake, PayloadFrom};
use self::store::{NewRows, Stored};
use crate::auth::Identity;
use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::metrics::SubmissionOutcome;
use crate::service::access::Access;
use crate::service::{event_types, lines, operational};
use crate::telemetry;

pub use self::intake::MAX_IDEMPOTENCY_KEY_CHARS;

/// The event type (and the payload's `type`) of a test webhook.
pub const TEST_EVENT_TYPE: &str = "courier.test";

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
    /// Lines the delivery up behind the endpoint's earlier ones with the same key.
    pub ordering_key: Option<String>,
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
    access: Access,
    intake: Intake,
    group_commit: GroupCommit,
}

impl Submissions {
    /// Submission operations on `db`, through `intake`, stored by `group_commit`.
    pub fn new(db: Db, access: Access, intake: Intake, group_commit: GroupCommit) -> Self {
        Submissions {
            db,
            access,
            intake,
            group_commit,
        }
    }

    /// Stores a submission and its pending delivery together, or answers with the earlier
    /// submission that holds the same idempotency key.
    ///
    /// Race 3 is settled by `UNIQUE (endpoint_id, idempotency_key)`: the lookup before
    /// the write is only a fast path. A write that loses on the constraint writes nothing
    /// and reports [`Stored::KeyTaken`]; the winner is then read afresh, in a statement of
    /// its own, which sees it committed.
    #[tracing::instrument(level = "debug", skip_all, fields(endpoint_id = %input.endpoint_id))]
    pub async fn submit(&self, caller: &Identity, input: NewSubmission) -> Result<SubmitOutcome> {
        if input
            .event_type
            .as_deref()
            .is_some_and(operational::is_reserved)
        {
            return Err(Error::bad_input(format!(
                "event types beginning with `{}` are Courier's own",
                operational::RESERVED_PREFIX
            )));
        }
        self.store_submission(caller, input, PayloadFrom::Caller)
            .await
    }

    /// [`Submissions::submit`] without the reserved-type check: for Courier's own test
    /// webhooks too.
    async fn store_submission(
        &self,
        caller: &Identity,
        input: NewSubmission,
        from: PayloadFrom,
    ) -> Result<SubmitOutcome> {
        self.access.require(caller, input.endpoint_id).await?;
        let event_type = input
            .event_type
            .as_deref()
            .map(event_types::validate)
            .transpose()?;
        let ordering_key = input
            .ordering_key
            .as_deref()
            .map(lines::validate)
            .transpose()?;
        let accepted = self
            .intake
            .accept(caller, input.idempotency_key, input.payload, from)
            .await?;
        if let Some(key) = &accepted.key {
            if let Some(existing) = self.find_by_key(input.endpoint_id, key).await? {
                return self
                    .answer_existing(existing, &accepted.hash, &ordering_key)
                    .await;
            }
        }
        lines::refuse_reserved(ordering_key.as_deref())?;

        let rows = NewRows {
            submission: submission::Model {
                id: crate::db::ids::new_id(),
                endpoint_id: input.endpoint_id,
                idempotency_key: accepted.key.clone(),
                payload: accepted.payload,
                payload_hash: accepted.hash.clone(),
                submitted_by: Some(caller.key_id),
                created_at: db::now(),
                event_id: None,
                event_type,
                ordering_key: ordering_key.clone(),
                trace_context: telemetry::context::current_trace_context(),
            },
            delivery_id: crate::db::ids::new_id(),
        };
        match self.group_commit.store(rows).await? {
            Stored::Created(submission, delivery, claimed_at_submit) => {
                // A delivery the submission claimed is with the worker already.
                let to_wake = if claimed_at_submit { 0 } else { 1 };
                self.intake.stored(SubmissionOutcome::Created, to_wake);
                tracing::debug!(submission_id = %submission.id, delivery_id = %delivery.id, "submission stored");
                Ok(SubmitOutcome {
                    created: true,
                    submission: *submission,
                    delivery: *delivery,
                })
            }
            Stored::KeyTaken => {
                let key = accepted.key.unwrap_or_default();
                let winner =
                    self.find_by_key(input.endpoint_id, &key)
                        .await?
                        .ok_or(Error::Database(sea_orm::DbErr::RecordNotFound(
                            "the submission that won the idempotency race".into(),
                        )))?;
                self.answer_existing(winner, &accepted.hash, &ordering_key)
                    .await
            }
            Stored::EndpointDisabled => Err(Error::bad_input("the endpoint is disabled")),
            Stored::EndpointMissing => Err(Error::NotFound("endpoint")),
        }
    }

    /// Submits a test webhook to `endpoint_id`, as the caller: `{"type": "courier.test",
    /// "endpointId", "sentAt", "message"}` with event type [`TEST_EVENT_TYPE`], delivered,
    /// retried and recorded like any other submission (and counted by the rate limit).
    pub async fn send_test_event(
        &self,
        caller: &Identity,
        endpoint_id: Uuid,
    ) -> Result<SubmitOutcome> {
        let payload = serde_json::json!({
            "type": TEST_EVENT_TYPE,
            "endpointId": endpoint_id,
            "sentAt": db::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "message": "A test webhook from Courier: if its signature verifies, this endpoint is set up.",
        });
        let input = NewSubmission {
            endpoint_id,
            payload,
            idempotency_key: None,
            event_type: Some(TEST_EVENT_TYPE.to_owned()),
            ordering_key: None,
        };
        self.store_submission(caller, input, PayloadFrom::Courier)
            .await
    }

    async fn find_by_key(&self, endpoint_id: Uuid, key: &str) -> Result<Option<submission::Model>> {
        Ok(submission::Entity::find()
            .filter(submission::Column::EndpointId.eq(endpoint_id))
            .filter(submission::Column::IdempotencyKey.eq(key))
            .one(self.db.conn())
            .await?)
    }

    /// Same content and ordering key: the earlier submission, `created: false`. Otherwise a
    /// conflict.
    async fn answer_existing(
        &self,
        existing: submission::Model,
        hash: &str,
        ordering_key: &Option<String>,
    ) -> Result<SubmitOutcome> {
        self.intake
            .repeat(existing.payload_hash == hash && existing.ordering_key == *ordering_key)?;
        let delivery = webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::SubmissionId.eq(existing.id))
            .one(self.db.conn())
            .await?
            .ok_or(Error::NotFound("delivery"))?;
        Ok(SubmitOutcome {
            created: false,
            submission: existing,
            delivery,
        })
    }

    /// One submission, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<submission::Model>> {
        let found = self.load(id).await?;
        self.access
            .reveal(caller, found, |found| found.endpoint_id)
            .await
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
