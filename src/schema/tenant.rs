//! GraphQL for tenants: the `Tenant` type, `tenant`, `tenants`, `createTenant` and
//! `createPortalLink`.

use async_graphql::connection::Connection;
use async_graphql::{Context, InputObject, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::tenant;

use super::context::{caller, parse_id, relay_page, state};
use super::endpoint::{endpoint_page, Endpoint};
use super::error::ApiResult;
use crate::service::pagination::{Listed, PageRequest};

/// A customer whose endpoints are grouped together (wraps the stored row).
pub struct Tenant(pub tenant::Model);

/// A customer whose endpoints are grouped together; its partner keys use and manage them,
/// and a portal link opens the console as its portal.
#[Object]
impl Tenant {
    /// Stable identifier.
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    /// Human-readable label.
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// When it was created.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    /// Its endpoints the caller may see, oldest first.
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn endpoints(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, Endpoint>> {
        endpoint_page(ctx, Some(self.0.id), first, after).await
    }
}

/// Input of `createTenant`.
#[derive(InputObject)]
pub struct CreateTenantInput {
    /// Label, 1 to 200 characters.
    name: String,
}

/// The console signed in as a tenant, for a limited time.
#[derive(SimpleObject)]
pub struct PortalLink {
    /// The console URL, signed in with `token` (`<public base>/#token=<token>`; the
    /// fragment never reaches a server).
    url: String,
    /// A partner key of the tenant, shown only now.
    token: String,
    /// When the key stops authenticating, on every process; its subscriptions end then.
    expires_at: DateTime<Utc>,
}

/// Tenant queries.
#[derive(Default)]
pub struct TenantQuery;

/// Tenant queries.
#[Object]
impl TenantQuery {
    /// One tenant by id; null when there is none (admins, and the tenant's own keys).
    async fn tenant(&self, ctx: &Context<'_>, id: ID) -> ApiResult<Option<Tenant>> {
        let id = parse_id(&id, "id")?;
        let found = state(ctx)?.tenants.get(caller(ctx)?, id).await?;
        Ok(found.map(Tenant))
    }

    /// Every tenant, oldest first (admin only).
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn tenants(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, Tenant>> {
        let request = PageRequest::new(Listed::Tenants, first, after.as_deref())?;
        let page = state(ctx)?.tenants.list(caller(ctx)?, request).await?;
        Ok(relay_page(
            Listed::Tenants,
            page,
            &request,
            |row| row.id.into(),
            Tenant,
        ))
    }
}

/// Tenant mutations.
#[derive(Default)]
pub struct TenantMutation;

/// Tenant mutations.
#[Object]
impl TenantMutation {
    /// Creates a tenant (admin only).
    async fn create_tenant(
        &self,
        ctx: &Context<'_>,
        input: CreateTenantInput,
    ) -> ApiResult<Tenant> {
        let tenant = state(ctx)?
            .tenants
            .create(caller(ctx)?, &input.name)
            .await?;
        Ok(Tenant(tenant))
    }

    /// Mints a portal link for a tenant (admin only): a partner key of the tenant that
    /// expires after `ttlSeconds` (default 3600, at most 86400), and the console URL
    /// signed in with it.
    async fn create_portal_link(
        &self,
        ctx: &Context<'_>,
        tenant_id: ID,
        ttl_seconds: Option<i32>,
    ) -> ApiResult<PortalLink> {
        let tenant_id = parse_id(&tenant_id, "tenantId")?;
        let link = Box::pin(state(ctx)?.tenants.create_portal_link(
            caller(ctx)?,
            tenant_id,
            ttl_seconds.map(i64::from),
        ))
        .await?;
        Ok(PortalLink {
            url: link.url,
            token: link.token,
            expires_at: link.expires_at,
        })
    }
}
