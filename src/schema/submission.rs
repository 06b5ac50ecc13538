//! GraphQL for submissions: the `Submission` type, `submit`, and `submission(id)`.

use async_graphql::{Context, InputObject, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::{event, submission};

use super::context::{caller, missing, parse_id, state};
use super::delivery::Delivery;
use super::endpoint::Endpoint;
use super::error::ApiResult;
use super::event::Event;
use super::json::Json;
use super::loaders::ReadAhead;
use crate::service::submissions::NewSubmission;

/// A stored submission (wraps the stored row).
pub struct Submission {
    row: submission::Model,
    /// What its nested fields read (see [`ReadAhead`]).
    read_ahead: ReadAhead,
}

impl From<submission::Model> for Submission {
    fn from(row: submission::Model) -> Self {
        Submission::read_ahead(row, ReadAhead::default())
    }
}

impl Submission {
    /// `row`, whose nested fields read what `read_ahead` primed.
    pub fn read_ahead(row: submission::Model, read_ahead: ReadAhead) -> Self {
        Submission { row, read_ahead }
    }

    /// The event `publish` stored it with (its payload stored once there), if it has one.
    async fn published(&self, ctx: &Context<'_>) -> ApiResult<Option<event::Model>> {
        let Some(event_id) = self.row.event_id else {
            return Ok(None);
        };
        let found = self
            .read_ahead
            .loaders(ctx)?
            .events
            .load_one(event_id)
            .await?;
        Ok(Some(found.ok_or_else(|| missing("event"))?))
    }
}

/// A payload a partner submitted for an endpoint.
#[Object]
impl Submission {
    /// Stable identifier.
    async fn id(&self) -> ID {
        ID(self.row.id.to_string())
    }
    /// The endpoint it is for.
    async fn endpoint(&self, ctx: &Context<'_>) -> ApiResult<Endpoint> {
        let found = self
            .read_ahead
            .loaders(ctx)?
            .endpoints
            .load_one(self.row.endpoint_id)
            .await?;
        Ok(Endpoint(found.ok_or_else(|| missing("endpoint"))?))
    }
    /// The key that makes retries of this submission safe, if one was given.
    async fn idempotency_key(&self) -> Option<&str> {
        self.row.idempotency_key.as_deref()
    }
    /// The submitted JSON, delivered as the webhook body (a published event's payload,
    /// stored once on the event).
    async fn payload(&self, ctx: &Context<'_>) -> ApiResult<Json> {
        Ok(Json(match self.published(ctx).await? {
            Some(event) => event.payload,
            None => self.row.payload.clone(),
        }))
    }
    /// Its delivery.
    async fn delivery(&self, ctx: &Context<'_>) -> ApiResult<Delivery> {
        let found = self
            .read_ahead
            .loaders(ctx)?
            .deliveries_by_submission
            .load_one(self.row.id)
            .await?;
        Ok(Delivery::read_ahead(
            found.ok_or_else(|| missing("delivery"))?,
            self.read_ahead.clone(),
        ))
    }
    /// When it was stored.
    async fn created_at(&self) -> DateTime<Utc> {
        self.row.created_at
    }
    /// Its event type: the published event's, or the label given to `submit`.
    async fn event_type(&self) -> Option<&str> {
        self.row.event_type.as_deref()
    }
    /// Its ordering key, if it was given one.
    async fn ordering_key(&self) -> Option<&str> {
        self.row.ordering_key.as_deref()
    }
    /// The event it delivers, when `publish` made it.
    async fn event(&self, ctx: &Context<'_>) -> ApiResult<Option<Event>> {
        Ok(self.published(ctx).await?.map(Event))
    }
}

/// Input of `submit`.
#[derive(InputObject)]
pub struct SubmitInput {
    /// The endpoint to deliver to.
    endpoint_id: ID,
    /// Any JSON value, delivered as the webhook body.
    payload: Json,
    /// Makes retrying safe: a repeat with the same key and the same content returns the
    /// first submission (`created: false`); different content is `IDEMPOTENCY_CONFLICT`.
    /// 1 to 255 characters.
    idempotency_key: Option<String>,
    /// An optional event type label, stored and shown with the submission. `submit` always
    /// delivers to the endpoint named, whatever event types it subscribes to.
    event_type: Option<String>,
    /// Lines this delivery up behind the endpoint's earlier deliveries with the same key:
    /// they are attempted one at a time, in the order their submissions committed. 1 to 255
    /// characters, no control characters.
    ordering_key: Option<String>,
}

/// The answer to `submit`.
#[derive(SimpleObject)]
pub struct SubmitResult {
    /// False when an earlier submission with the same key was returned.
    created: bool,
    /// The submission.
    submission: Submission,
    /// Its delivery.
    delivery: Delivery,
}

/// Submission queries.
#[derive(Default)]
pub struct SubmissionQuery;

/// Submission queries.
#[Object]
impl SubmissionQuery {
    /// One submission by id; null when there is none (for a partner key, `FORBIDDEN`: the
    /// answer for what is outside its scope).
    async fn submission(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Option<Submission>> {
        let id = parse_id(&id, "id")?;
        let found = state(ctx)?.submissions.get(caller(ctx)?, id).await?;
        Ok(found.map(Submission::from))
    }
}

/// Submission mutations.
#[derive(Default)]
pub struct SubmissionMutation;

/// Submission mutations.
#[Object]
impl SubmissionMutation {
    /// Stores a payload for an endpoint and schedules its delivery. Safe to retry with an
    /// idempotency key. Over the rate limit: `RATE_LIMITED` with `retryAfter` and a
    /// `Retry-After` header.
    async fn submit(&self, ctx: &Context<'_>, input: SubmitInput) -> ApiResult<SubmitResult> {
        let endpoint_id = parse_id(&input.endpoint_id, "endpointId")?;
        let input = NewSubmission {
            endpoint_id,
            payload: input.payload.0,
            idempotency_key: input.idempotency_key,
            event_type: input.event_type,
            ordering_key: input.ordering_key,
        };
        match Box::pin(state(ctx)?.submissions.submit(caller(ctx)?, input)).await {
            Ok(outcome) => Ok(SubmitResult {
                created: outcome.created,
                submission: Submission::from(outcome.submission),
                delivery: Delivery::from(outcome.delivery),
            }),
            Err(err) => Err(err.into()),
        }
    }
}
