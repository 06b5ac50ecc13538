//! GraphQL for events: the `Event` type, `publish`, and `event(id)`.

use async_graphql::connection::Connection;
use async_graphql::{Context, InputObject, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::event;

use super::context::{caller, parse_id, state};
use super::delivery::{delivery_page, Delivery};
use super::error::ApiResult;
use super::json::Json;
use crate::service::deliveries::DeliveryFilter;
use crate::service::submissions::publish::NewEvent;

/// A published event (wraps the stored row).
pub struct Event(pub event::Model);

/// An event published once and delivered to every endpoint subscribed to its type.
#[Object]
impl Event {
    /// Stable identifier.
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    /// Its type, e.g. `order.paid`.
    async fn event_type(&self) -> &str {
        &self.0.event_type
    }
    /// The key that makes retries of this publish safe, if one was given: shown to admins
    /// and to the key that published it (the event may reach other tenants, whose keys see
    /// null).
    async fn idempotency_key(&self, ctx: &Context<'_>) -> ApiResult<Option<&str>> {
        let caller = caller(ctx)?;
        let own = caller.role == crate::auth::Role::Admin || self.0.published_by == caller.key_id;
        Ok(self.0.idempotency_key.as_deref().filter(|_| own))
    }
    /// The published JSON, each webhook's body.
    async fn payload(&self) -> Json {
        Json(self.0.payload.clone())
    }
    /// When it was stored.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    /// Its deliveries the caller may see, one per endpoint it reached, newest first.
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn deliveries(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, Delivery>> {
        let filter = DeliveryFilter {
            event_id: Some(self.0.id),
            ..DeliveryFilter::default()
        };
        delivery_page(ctx, filter, first, after).await
    }
}

/// Input of `publish`.
#[derive(InputObject)]
pub struct PublishInput {
    /// The type endpoints subscribe to: 1 to 255 characters, no whitespace.
    event_type: String,
    /// Any JSON value, delivered as each webhook's body.
    payload: Json,
    /// Makes retrying safe, per API key: a repeat with the same key, type and content
    /// returns the first event (`created: false`) and creates no delivery; different
    /// content is `IDEMPOTENCY_CONFLICT`. 1 to 255 characters.
    idempotency_key: Option<String>,
    /// Lines each delivery up behind its endpoint's earlier deliveries with the same key:
    /// per endpoint, they are attempted one at a time, in the order their submissions
    /// committed. 1 to 255 characters, no control characters.
    ordering_key: Option<String>,
}

/// The answer to `publish`.
#[derive(SimpleObject)]
pub struct PublishResult {
    /// False when an earlier event with the same key was returned.
    created: bool,
    /// The event.
    event: Event,
}

/// Event queries.
#[derive(Default)]
pub struct EventQuery;

/// Event queries.
#[Object]
impl EventQuery {
    /// One event by id; null when there is none (for a partner key, `FORBIDDEN`: the answer
    /// for what is outside its scope).
    async fn event(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Option<Event>> {
        let id = parse_id(&id, "id")?;
        let found = state(ctx)?.fanout.get(caller(ctx)?, id).await?;
        Ok(found.map(Event))
    }
}

/// Event mutations.
#[derive(Default)]
pub struct EventMutation;

/// Event mutations.
#[Object]
impl EventMutation {
    /// Publishes an event: stores it and, in the same transaction, a submission and a
    /// `PENDING` delivery for every enabled endpoint whose `eventTypes` is empty or holds
    /// the type (for a partner key, only endpoints in its scope). No matching endpoint is
    /// not an error. Counts once against the rate limit.
    async fn publish(&self, ctx: &Context<'_>, input: PublishInput) -> ApiResult<PublishResult> {
        let input = NewEvent {
            event_type: input.event_type,
            payload: input.payload.0,
            idempotency_key: input.idempotency_key,
            ordering_key: input.ordering_key,
        };
        match Box::pin(state(ctx)?.fanout.publish(caller(ctx)?, input)).await {
            Ok(outcome) => Ok(PublishResult {
                created: outcome.created,
                event: Event(outcome.event),
            }),
            Err(err) => Err(err.into()),
        }
    }
}
