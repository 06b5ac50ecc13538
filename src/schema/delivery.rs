//! GraphQL for deliveries: the `Delivery` and `DeliveryAttempt` types, `delivery`,
//! `deliveries`, and the mutations that start a cycle again: `replayDelivery`,
//! `replayDeliveries`, `resendDelivery`, and `sendTestEvent`.

use async_graphql::connection::Connection;
use async_graphql::{Context, Enum, InputObject, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::delivery_attempt;
use entity::webhook_delivery::{self, DeliveryState as StoredState};

use super::context::{caller, loaders, missing, parse_id, relay_page, state};
use super::endpoint::Endpoint;
use super::error::ApiResult;
use super::json::Json;
use super::loaders::{ReadAhead, Selected};
use super::submission::Submission;
use crate::db::Progress;
use crate::service::deliveries::{DeliveryFilter as Filter, ReplayFilter as Replay};
use crate::service::pagination::{Listed, PageRequest};

/// Where a delivery stands.
#[derive(Enum, Copy, Clone, Debug, Eq, PartialEq)]
#[graphql(remote = "StoredState")]
pub enum DeliveryState {
    /// Waiting for its next attempt.
    Pending,
    /// Claimed by a worker; an attempt is under way.
    Processing,
    /// The endpoint answered 2xx.
    Delivered,
    /// The cycle's attempts ran out; an operator may replay it.
    Failed,
}

/// The delivery of one submission to its endpoint (wraps the stored row).
pub struct Delivery {
    row: webhook_delivery::Model,
    /// What its nested fields read (see [`ReadAhead`]).
    read_ahead: ReadAhead,
}

impl From<webhook_delivery::Model> for Delivery {
    fn from(row: webhook_delivery::Model) -> Self {
        Delivery::read_ahead(row, ReadAhead::default())
    }
}

impl Delivery {
    /// `row`, whose nested fields read what `read_ahead` primed.
    pub fn read_ahead(row: webhook_delivery::Model, read_ahead: ReadAhead) -> Self {
        Delivery { row, read_ahead }
    }
}

/// The delivery of one submission to its endpoint: its state, schedule and every attempt.
#[Object]
impl Delivery {
    /// Stable identifier; also the `webhook-id` header of every attempt.
    async fn id(&self) -> ID {
        ID(self.row.id.to_string())
    }
    /// Current state.
    async fn state(&self) -> DeliveryState {
        self.row.state.into()
    }
    /// Attempts made in the current cycle (a replay starts a new cycle).
    async fn cycle_attempts(&self) -> i32 {
        self.row.cycle_attempts
    }
    /// When the next attempt is due; null unless the delivery is pending.
    async fn next_attempt_at(&self) -> Option<DateTime<Utc>> {
        match self.row.state {
            StoredState::Pending => self.row.next_attempt_at,
            _ => None,
        }
    }
    /// Why the last attempt failed, if it did.
    async fn last_error(&self) -> Option<&str> {
        self.row.last_error.as_deref()
    }
    /// When the delivery was created.
    async fn created_at(&self) -> DateTime<Utc> {
        self.row.created_at
    }
    /// When the delivery last changed.
    async fn updated_at(&self) -> DateTime<Utc> {
        self.row.updated_at
    }
    /// The endpoint delivered to.
    async fn endpoint(&self, ctx: &Context<'_>) -> ApiResult<Endpoint> {
        let found = self
            .read_ahead
            .loaders(ctx)?
            .endpoints
            .load_one(self.row.endpoint_id)
            .await?;
        Ok(Endpoint(found.ok_or_else(|| missing("endpoint"))?))
    }
    /// The submission delivered.
    async fn submission(&self, ctx: &Context<'_>) -> ApiResult<Submission> {
        let found = self
            .read_ahead
            .loaders(ctx)?
            .submissions
            .load_one(self.row.submission_id)
            .await?;
        Ok(Submission::read_ahead(
            found.ok_or_else(|| missing("submission"))?,
            self.read_ahead.clone(),
        ))
    }
    /// Its submission's ordering key: deliveries to one endpoint with the same key are
    /// attempted one at a time, in the order their submissions committed.
    async fn ordering_key(&self) -> Option<&str> {
        self.row.ordering_key.as_deref()
    }
    /// For a delivery waiting in its ordering line, the line's head it waits behind (the
    /// earliest unsettled delivery with its key to its endpoint); null otherwise.
    async fn waiting_behind(&self, ctx: &Context<'_>) -> ApiResult<Option<Delivery>> {
        if !self.row.waiting || self.row.state != StoredState::Pending {
            return Ok(None);
        }
        let head = state(ctx)?.deliveries.waiting_behind(&self.row).await?;
        Ok(head.map(Delivery::from))
    }
    /// Every attempt, by lifetime number (numbers continue across replays).
    async fn attempts(&self, ctx: &Context<'_>) -> ApiResult<Vec<DeliveryAttempt>> {
        let attempts = self
            .read_ahead
            .loaders(ctx)?
            .attempts
            .load_one(self.row.id)
            .await?
            .unwrap_or_default();
        Ok(attempts.into_iter().map(DeliveryAttempt).collect())
    }
}

/// One HTTP attempt (wraps the stored row).
pub struct DeliveryAttempt(pub delivery_attempt::Model);

/// One HTTP attempt to deliver a webhook.
#[Object]
impl DeliveryAttempt {
    /// Lifetime number of the attempt for its delivery, from 1.
    async fn number(&self) -> i32 {
        self.0.number
    }
    /// The HTTP status the endpoint answered with, if it answered.
    async fn status_code(&self) -> Option<i32> {
        self.0.status_code
    }
    /// Why the attempt failed (non-2xx, timeout, connection error), if it did.
    async fn error(&self) -> Option<&str> {
        self.0.error.as_deref()
    }
    /// True when a newer claim had taken over the delivery before this result was recorded;
    /// the result did not change the delivery's state.
    async fn superseded(&self) -> bool {
        self.0.superseded
    }
    /// When the request started.
    async fn started_at(&self) -> DateTime<Utc> {
        self.0.started_at
    }
    /// When the outcome was known.
    async fn finished_at(&self) -> DateTime<Utc> {
        self.0.finished_at
    }
    /// How long the request took, in milliseconds.
    async fn duration_ms(&self) -> Option<i32> {
        self.0.duration_ms
    }
    /// The first 4 KiB of the body the receiver answered with, as text; null when no
    /// response arrived.
    async fn response_body(&self) -> Option<&str> {
        self.0.response_body.as_deref()
    }
    /// The receiver's response headers as an object, name to value (repeated headers
    /// joined by `, `); null when no response arrived.
    async fn response_headers(&self) -> Option<Json> {
        let text = self.0.response_headers.as_deref()?;
        serde_json::from_str(text).ok().map(Json)
    }
}

/// Which deliveries `deliveries` lists.
#[derive(InputObject, Default)]
pub struct DeliveryFilter {
    /// Only this endpoint's deliveries.
    endpoint_id: Option<ID>,
    /// Only deliveries in this state.
    state: Option<DeliveryState>,
    /// Only deliveries of submissions with this event type.
    event_type: Option<String>,
    /// Only deliveries created at or after this moment (in the years 1 to 9999).
    created_after: Option<DateTime<Utc>>,
    /// Only deliveries created before this moment (in the years 1 to 9999).
    created_before: Option<DateTime<Utc>>,
    /// Only deliveries to endpoints of this tenant (`FORBIDDEN` for a tenant the key may
    /// not read).
    tenant_id: Option<ID>,
}

/// Which `FAILED` deliveries `replayDeliveries` replays; every field narrows, none set
/// means every failed delivery the caller may see.
#[derive(InputObject, Default)]
pub struct ReplayFilter {
    /// Only this endpoint's deliveries (`NOT_FOUND` when there is no such endpoint).
    endpoint_id: Option<ID>,
    /// Only deliveries of submissions with this event type.
    event_type: Option<String>,
    /// Only deliveries that failed at or after this moment (in the years 1 to 9999).
    since: Option<DateTime<Utc>>,
    /// Only deliveries that failed at or before this moment (in the years 1 to 9999).
    until: Option<DateTime<Utc>>,
}

/// What `replayDeliveries` did.
#[derive(SimpleObject)]
pub struct ReplayResult {
    /// How many failed deliveries this call made pending (others that matched were
    /// replayed by a concurrent call, and counted there).
    replayed: i32,
}

/// One page of the deliveries `filter` selects that the caller may see, newest first.
pub async fn delivery_page(
    ctx: &Context<'_>,
    filter: Filter,
    first: Option<i32>,
    after: Option<String>,
) -> ApiResult<Connection<String, Delivery>> {
    let request = PageRequest::new(Listed::Deliveries, first, after.as_deref())?;
    let page = Box::pin(state(ctx)?.deliveries.list(caller(ctx)?, filter, request)).await?;
    Box::pin(loaders(ctx)?.prime_deliveries(&page.items, &Selected::of_delivery_nodes(ctx)))
        .await?;
    Ok(relay_page(
        Listed::Deliveries,
        page,
        &request,
        |row| crate::service::pagination::Position {
            id: row.id,
            at: Some(row.created_at),
        },
        Delivery::from,
    ))
}

/// Delivery queries.
#[derive(Default)]
pub struct DeliveryQuery;

/// Delivery queries.
#[Object]
impl DeliveryQuery {
    /// One delivery by id; null when there is none (for a partner key, `FORBIDDEN`: the
    /// answer for what is outside its scope).
    async fn delivery(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Option<Delivery>> {
        let id = parse_id(&id, "id")?;
        let found = Box::pin(state(ctx)?.deliveries.get(caller(ctx)?, id)).await?;
        Ok(found.map(Delivery::from))
    }

    /// Deliveries the caller may see, newest first, optionally by endpoint and state.
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn deliveries(
        &self,
        ctx: &Context<'_>,
        filter: Option<DeliveryFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, Delivery>> {
        let filter = filter.unwrap_or_default();
        let filter = Filter {
            endpoint_id: filter
                .endpoint_id
                .as_ref()
                .map(|id| parse_id(id, "filter.endpointId"))
                .transpose()?,
            state: filter.state.map(Into::into),
            event_type: filter.event_type,
            event_id: None,
            created_after: filter.created_after,
            created_before: filter.created_before,
            tenant_id: filter
                .tenant_id
                .as_ref()
                .map(|id| parse_id(id, "filter.tenantId"))
                .transpose()?,
        };
        delivery_page(ctx, filter, first, after).await
    }
}

/// Delivery mutations.
#[derive(Default)]
pub struct DeliveryMutation;

/// Delivery mutations.
#[Object]
impl DeliveryMutation {
    /// Replays a `FAILED` delivery: it becomes `PENDING`, due now, with a new cycle of
    /// attempts. Any other state is `DELIVERY_NOT_REPLAYABLE` (with `extensions.state`); of
    /// concurrent replays exactly one wins. Partners replay within their scope.
    async fn replay_delivery(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Delivery> {
        let id = parse_id(&id, "id")?;
        let replayed = Box::pin(state(ctx)?.deliveries.replay(caller(ctx)?, id)).await?;
        Ok(Delivery::from(replayed))
    }

    /// Replays every `FAILED` delivery the filter matches that the caller may see, at once,
    /// in batches. However many bulk and single replays race, each failed delivery is
    /// replayed by exactly one of them, and `replayed` counts this call's share.
    async fn replay_deliveries(
        &self,
        ctx: &Context<'_>,
        filter: ReplayFilter,
    ) -> ApiResult<ReplayResult> {
        let filter = Replay {
            endpoint_id: filter
                .endpoint_id
                .as_ref()
                .map(|id| parse_id(id, "filter.endpointId"))
                .transpose()?,
            event_type: filter.event_type,
            since: filter.since,
            until: filter.until,
        };
        let replayed = Box::pin(state(ctx)?.deliveries.replay_matching(
            caller(ctx)?,
            &filter,
            ctx.data_opt::<Progress>(),
        ))
        .await?;
        Ok(ReplayResult {
            replayed: i32::try_from(replayed).unwrap_or(i32::MAX),
        })
    }

    /// Sends a `DELIVERED` delivery again: a new cycle with the same `webhook-id`, every
    /// earlier attempt kept. Any other state is `DELIVERY_NOT_REPLAYABLE`.
    async fn resend_delivery(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Delivery> {
        let id = parse_id(&id, "id")?;
        let resent = Box::pin(state(ctx)?.deliveries.resend(caller(ctx)?, id)).await?;
        Ok(Delivery::from(resent))
    }

    /// Sends the endpoint a signed test webhook, `{"type": "courier.test", ...}` with event
    /// type `courier.test`, delivered, retried and recorded like any other.
    async fn send_test_event(&self, ctx: &Context<'_>, endpoint_id: ID) -> ApiResult<Delivery> {
        let endpoint_id = parse_id(&endpoint_id, "endpointId")?;
        let sent = Box::pin(
            state(ctx)?
                .submissions
                .send_test_event(caller(ctx)?, endpoint_id),
        )
        .await?;
        Ok(Delivery::from(sent.delivery))
    }
}
