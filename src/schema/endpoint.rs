//! GraphQL for endpoints: the `Endpoint` type, its queries and its mutations.

use async_graphql::connection::Connection;
use async_graphql::{Context, InputObject, MaybeUndefined, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::endpoint;

use super::context::{caller, loaders, parse_id, relay_page, state};
use super::error::ApiResult;
use super::loaders::Selected;
use super::tenant::Tenant;
use crate::service::endpoints::{EndpointPatch, NewEndpoint};
use crate::service::event_types;
use crate::service::pagination::{Listed, PageRequest};
use crate::service::recent_health;

/// A webhook destination (wraps the stored row).
pub struct Endpoint(pub endpoint::Model);

/// A webhook destination. Its signing secret is never readable; it is returned
/// once, when minted, in `EndpointWithSecret`.
#[Object]
impl Endpoint {
    /// Stable identifier.
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    /// Human-readable label.
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// The URL webhooks are POSTed to.
    async fn url(&self) -> &str {
        &self.0.url
    }
    /// Disabled endpoints accept no submissions and receive no deliveries; their waiting
    /// deliveries are parked until the endpoint is re-enabled.
    async fn disabled(&self) -> bool {
        self.0.disabled
    }
    /// The event types `publish` delivers here, sorted; empty: every type. Courier's own
    /// operational events (`courier.*`) reach only endpoints that list them.
    async fn event_types(&self) -> Vec<String> {
        event_types::subscribed(&self.0.event_types)
    }
    /// Why the endpoint is disabled: `MANUAL` (an operator), `GONE` (it answered 410) or
    /// `FAILING` (too many consecutive failed deliveries); null while enabled.
    async fn disabled_reason(&self) -> Option<&str> {
        self.0.disabled_reason.as_deref()
    }
    /// When the endpoint was disabled; null while enabled.
    async fn disabled_at(&self) -> Option<DateTime<Utc>> {
        self.0.disabled_at
    }
    /// Deliveries that ended failed since the last one delivered.
    async fn consecutive_failures(&self) -> i32 {
        self.0.consecutive_failures
    }
    /// Requests in flight to it at once, across every Courier process: its own cap, or
    /// `COURIER_ENDPOINT_MAX_IN_FLIGHT` when it sets none.
    async fn max_in_flight(&self, ctx: &Context<'_>) -> ApiResult<i32> {
        let default = state(ctx)?.config.endpoint_max_in_flight;
        Ok(self
            .0
            .max_in_flight
            .unwrap_or_else(|| i32::try_from(default).unwrap_or(i32::MAX)))
    }
    /// Request starts per second across every Courier process; null: unlimited.
    async fn rate_limit(&self) -> Option<i32> {
        self.0.rate_limit
    }
    /// While the endpoint asked to be left alone (a `429` or `503` with `Retry-After`, at
    /// most an hour): when its deliveries resume. Null when it is not paused.
    async fn paused_until(&self, ctx: &Context<'_>) -> ApiResult<Option<DateTime<Utc>>> {
        still_ahead(ctx, self.0.paused_until).await
    }
    /// While a rotated-out secret still signs beside the current one: when it stops.
    async fn previous_secret_expires_at(
        &self,
        ctx: &Context<'_>,
    ) -> ApiResult<Option<DateTime<Utc>>> {
        still_ahead(ctx, self.0.previous_secret_expires_at).await
    }
    /// When the endpoint was created.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    /// The tenant it belongs to (fixed at creation), for admins and that tenant's keys;
    /// null for none, and for a key limited to a list of endpoints.
    async fn tenant(&self, ctx: &Context<'_>) -> ApiResult<Option<Tenant>> {
        let (app, caller) = (state(ctx)?, caller(ctx)?);
        let Some(tenant) = self
            .0
            .tenant_id
            .filter(|tenant| app.access.may_read_tenant(caller, *tenant))
        else {
            return Ok(None);
        };
        let found = app.tenants.load(tenant).await?;
        Ok(found.map(Tenant))
    }
    /// When the endpoint last changed.
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
    /// How it fared over the last hour: success rate and latency percentiles, from
    /// per-minute sums (never a scan of history).
    async fn health(&self, ctx: &Context<'_>) -> ApiResult<EndpointHealth> {
        let health = loaders(ctx)?
            .health
            .load_one(self.0.id)
            .await?
            .unwrap_or_default();
        Ok(EndpointHealth {
            window_seconds: i32::try_from(recent_health::WINDOW.num_seconds()).unwrap_or(i32::MAX),
            attempts: health.attempts,
            succeeded: health.succeeded,
            success_rate: health.success_rate(),
            latency_p50_ms: health.latency_ms(0.50),
            latency_p90_ms: health.latency_ms(0.90),
            latency_p99_ms: health.latency_ms(0.99),
        })
    }
    /// How many of its deliveries are in each state, now.
    async fn delivery_counts(&self, ctx: &Context<'_>) -> ApiResult<DeliveryCounts> {
        let counts = loaders(ctx)?
            .counts
            .load_one(self.0.id)
            .await?
            .unwrap_or_default();
        Ok(DeliveryCounts {
            pending: counts.pending,
            processing: counts.processing,
            delivered: counts.delivered,
            failed: counts.failed,
            total: counts.pending + counts.processing + counts.delivered + counts.failed,
        })
    }
}

/// How an endpoint fared over the last hour: every attempt recorded, whatever its
/// delivery became.
#[derive(SimpleObject)]
pub struct EndpointHealth {
    /// The window, in seconds (3600).
    window_seconds: i32,
    /// Attempts recorded in it.
    attempts: i64,
    /// Of those, answered 2xx.
    succeeded: i64,
    /// `succeeded / attempts`, 0 to 1; null without attempts.
    success_rate: Option<f64>,
    /// Latency percentiles in milliseconds, as the upper bound of the histogram bucket they
    /// fall in (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000; past that, the slowest
    /// attempt); null without attempts.
    latency_p50_ms: Option<i64>,
    /// See `latencyP50Ms`.
    latency_p90_ms: Option<i64>,
    /// See `latencyP50Ms`.
    latency_p99_ms: Option<i64>,
}

/// An endpoint's deliveries by state.
#[derive(SimpleObject)]
pub struct DeliveryCounts {
    /// Waiting for an attempt.
    pending: i64,
    /// Being attempted.
    processing: i64,
    /// Accepted by the endpoint.
    delivered: i64,
    /// Out of attempts (replayable).
    failed: i64,
    /// All of them.
    total: i64,
}

/// An endpoint with its signing secret, present only when this operation minted it.
#[derive(SimpleObject)]
pub struct EndpointWithSecret {
    /// The endpoint as stored.
    endpoint: Endpoint,
    /// `whsec_...`: shown once; store it to verify signatures.
    secret: Option<String>,
}

impl From<crate::service::endpoints::EndpointWithSecret> for EndpointWithSecret {
    fn from(value: crate::service::endpoints::EndpointWithSecret) -> Self {
        EndpointWithSecret {
            endpoint: Endpoint(value.endpoint),
            secret: value.secret,
        }
    }
}

/// Input of `createEndpoint`.
#[derive(InputObject)]
pub struct CreateEndpointInput {
    /// Label, 1 to 200 characters.
    name: String,
    /// `http` or `https` URL with a host.
    url: String,
    /// The event types `publish` delivers here (each 1 to 255 characters, no whitespace);
    /// omitted, null or empty: every type.
    event_types: Option<Vec<String>>,
    /// Requests in flight to it at once across every process, 1 to 1000; omitted or null:
    /// `COURIER_ENDPOINT_MAX_IN_FLIGHT`.
    max_in_flight: Option<i32>,
    /// Request starts per second across every process, 1 to 100000; omitted or null: unlimited.
    rate_limit: Option<i32>,
    /// The tenant it belongs to, for good. An admin may name any tenant or none; a tenant's
    /// key creates endpoints of its own tenant (omitted: its own).
    tenant_id: Option<ID>,
}

/// Input of `updateEndpoint`; omitted fields stay as they are.
#[derive(InputObject)]
pub struct UpdateEndpointInput {
    /// New label.
    name: Option<String>,
    /// New URL; a different URL mints a new signing secret.
    url: Option<String>,
    /// Disable (reason `MANUAL`) or re-enable the endpoint; re-enabling clears the reason
    /// and resumes its waiting deliveries.
    disabled: Option<bool>,
    /// New event types; omitted or null: unchanged; empty: every type.
    event_types: Option<Vec<String>>,
    /// New cap on requests in flight, 1 to 1000; omitted: unchanged; null: back to the default.
    max_in_flight: MaybeUndefined<i32>,
    /// New rate limit in requests per second, 1 to 100000; omitted: unchanged; null: unlimited.
    rate_limit: MaybeUndefined<i32>,
}

/// An optional setting: omitted leaves it, null resets it, a value sets it.
fn settable(value: MaybeUndefined<i32>) -> Option<Option<i32>> {
    match value {
        MaybeUndefined::Undefined => None,
        MaybeUndefined::Null => Some(None),
        MaybeUndefined::Value(value) => Some(Some(value)),
    }
}

/// One page of the endpoints the caller may see (of one tenant, if given), oldest first,
/// with their counts loaded in one statement when the query asks for them.
pub async fn endpoint_page(
    ctx: &Context<'_>,
    tenant: Option<uuid::Uuid>,
    first: Option<i32>,
    after: Option<String>,
) -> ApiResult<Connection<String, Endpoint>> {
    let request = PageRequest::new(Listed::Endpoints, first, after.as_deref())?;
    let page = state(ctx)?
        .endpoints
        .list(caller(ctx)?, tenant, request)
        .await?;
    if Selected::counts_of_endpoint_nodes(ctx) {
        let ids = page.items.iter().map(|row| row.id);
        loaders(ctx)?.counts.load_many(ids).await?;
    }
    Ok(relay_page(
        Listed::Endpoints,
        page,
        &request,
        |row| row.id.into(),
        Endpoint,
    ))
}

/// Endpoint queries.
#[derive(Default)]
pub struct EndpointQuery;

/// Endpoint queries.
#[Object]
impl EndpointQuery {
    /// One endpoint by id; null when there is none.
    async fn endpoint(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Option<Endpoint>> {
        let id = parse_id(&id, "id")?;
        let found = state(ctx)?.endpoints.get(caller(ctx)?, id).await?;
        Ok(found.map(Endpoint))
    }

    /// The endpoints the caller may see, oldest first.
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn endpoints(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, Endpoint>> {
        endpoint_page(ctx, None, first, after).await
    }
}

/// Endpoint mutations.
#[derive(Default)]
pub struct EndpointMutation;

/// Endpoint mutations.
#[Object]
impl EndpointMutation {
    /// Creates an endpoint and mints its signing secret (admins; a tenant's key for its own
    /// tenant).
    async fn create_endpoint(
        &self,
        ctx: &Context<'_>,
        input: CreateEndpointInput,
    ) -> ApiResult<EndpointWithSecret> {
        let tenant_id = input
            .tenant_id
            .as_ref()
            .map(|id| parse_id(id, "tenantId"))
            .transpose()?;
        let input = NewEndpoint {
            tenant_id,
            name: input.name,
            url: input.url,
            event_types: input.event_types,
            max_in_flight: input.max_in_flight,
            rate_limit: input.rate_limit,
        };
        let created = Box::pin(state(ctx)?.endpoints.create(caller(ctx)?, input)).await?;
        Ok(created.into())
    }

    /// Changes an endpoint (admins; a tenant's key for its tenant's endpoints). A new URL mints a new secret, returned here once.
    async fn update_endpoint(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateEndpointInput,
    ) -> ApiResult<EndpointWithSecret> {
        let id = parse_id(&id, "id")?;
        let patch = EndpointPatch {
            name: input.name,
            url: input.url,
            disabled: input.disabled,
            event_types: input.event_types,
            max_in_flight: settable(input.max_in_flight),
            rate_limit: settable(input.rate_limit),
        };
        let updated = Box::pin(state(ctx)?.endpoints.update(caller(ctx)?, id, patch)).await?;
        Ok(updated.into())
    }

    /// Mints a new signing secret, returned here once (admins; a tenant's key for its
    /// tenant's endpoints). For `graceSeconds`
    /// (default 86400; 0 for none) every webhook carries both signatures,
    /// `v1,<new> v1,<old>`, so receivers holding either secret verify; then only the new one.
    async fn rotate_endpoint_secret(
        &self,
        ctx: &Context<'_>,
        id: ID,
        grace_seconds: Option<i32>,
    ) -> ApiResult<EndpointWithSecret> {
        let id = parse_id(&id, "id")?;
        let rotated = Box::pin(state(ctx)?.endpoints.rotate_secret(
            caller(ctx)?,
            id,
            grace_seconds.map(i64::from),
        ))
        .await?;
        Ok(rotated.into())
    }
}

/// `moment` while it is still ahead by the database's clock (the one that decides when a
/// pause or a grace period ends, for every process); null once it has passed. Asks the
/// database only when there is a moment to judge.
async fn still_ahead(
    ctx: &Context<'_>,
    moment: Option<DateTime<Utc>>,
) -> ApiResult<Option<DateTime<Utc>>> {
    let Some(moment) = moment else {
        return Ok(None);
    };
    let ahead = state(ctx)?
        .db
        .is_ahead(moment)
        .await
        .map_err(crate::error::Error::from)?;
    Ok(ahead.then_some(moment))
}
