//! GraphQL for API keys: `apiKeys`, `createApiKey`, `revokeApiKey` (admin only) and
//! `currentKey` (any key, itself). Tokens are shown once, at creation; hashes never.

use async_graphql::connection::Connection;
use async_graphql::{Context, Enum, InputObject, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use entity::api_key;
use uuid::Uuid;

use super::context::{caller, parse_id, relay_page, state};
use super::endpoint::Endpoint;
use super::error::ApiResult;
use super::tenant::Tenant;
use crate::auth;
use crate::service::pagination::{Listed, PageRequest};

/// What an API key may do.
#[derive(Enum, Copy, Clone, Debug, Eq, PartialEq)]
#[graphql(remote = "auth::Role")]
pub enum Role {
    /// Everything.
    Admin,
    /// Submit to, read and replay only the endpoints in its scope: a list of endpoints, or
    /// every endpoint of its tenant (which it also creates and manages).
    Partner,
}

/// An API key as listed: never its token or the token's hash.
pub struct ApiKey(pub api_key::Model);

/// An API key. Its token was shown once, when it was created.
#[Object]
impl ApiKey {
    /// Stable identifier (also its rate-limit subject).
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    /// The label it was given.
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// What it may do.
    async fn role(&self) -> Role {
        self.0.role.into()
    }
    /// For partner keys limited to a list, the endpoints it may use (empty for admins, and
    /// for a tenant's key, whose scope is its `tenant`).
    async fn endpoints(&self, ctx: &Context<'_>) -> ApiResult<Vec<Endpoint>> {
        let scope = auth::scope_of(&self.0);
        if scope.is_empty() {
            return Ok(Vec::new());
        }
        let mut found = state(ctx)?.endpoints.load_many(&scope).await?;
        found.sort_by_key(|endpoint| scope.iter().position(|id| *id == endpoint.id));
        Ok(found.into_iter().map(Endpoint).collect())
    }
    /// For a tenant's partner key, the tenant whose endpoints it uses and manages.
    async fn tenant(&self, ctx: &Context<'_>) -> ApiResult<Option<Tenant>> {
        let Some(tenant) = self.0.tenant_id else {
            return Ok(None);
        };
        let found = state(ctx)?.tenants.load(tenant).await?;
        Ok(found.map(Tenant))
    }
    /// When it stops authenticating (a portal link's key); null: never.
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }
    /// When it was created.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    /// When it was revoked; revoked keys authenticate nothing.
    async fn revoked_at(&self) -> Option<DateTime<Utc>> {
        self.0.revoked_at
    }
    /// When it last authenticated a request, to within about a minute.
    async fn last_used_at(&self) -> Option<DateTime<Utc>> {
        self.0.last_used_at
    }
}

/// A key just created, with its token: shown here once, never again.
#[derive(SimpleObject)]
pub struct ApiKeyWithToken {
    /// The key.
    api_key: ApiKey,
    /// The bearer token (`courier_...`): store it now.
    token: String,
}

/// Input of `createApiKey`.
#[derive(InputObject)]
pub struct CreateApiKeyInput {
    /// Label, 1 to 200 characters.
    name: String,
    /// What the key may do.
    role: Role,
    /// For partner keys limited to a list: the endpoints it may use (at most 1,000).
    endpoint_ids: Option<Vec<ID>>,
    /// For a tenant's partner key (instead of `endpointIds`): the tenant whose endpoints,
    /// those created later included, it may use and manage.
    tenant_id: Option<ID>,
}

/// API key queries.
#[derive(Default)]
pub struct ApiKeyQuery;

/// API key queries.
#[Object]
impl ApiKeyQuery {
    /// The API key this request is made with, whatever its role: who is signed in (its
    /// role, tenant and expiry).
    async fn current_key(&self, ctx: &Context<'_>) -> ApiResult<ApiKey> {
        let key = state(ctx)?.api_keys.current(caller(ctx)?).await?;
        Ok(ApiKey(key))
    }

    /// Every API key, revoked ones included, oldest first (admin only).
    #[graphql(complexity = "crate::service::pagination::page_cost(first) * child_complexity")]
    async fn api_keys(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> ApiResult<Connection<String, ApiKey>> {
        let request = PageRequest::new(Listed::ApiKeys, first, after.as_deref())?;
        let page = state(ctx)?.api_keys.list(caller(ctx)?, request).await?;
        Ok(relay_page(
            Listed::ApiKeys,
            page,
            &request,
            |row| row.id.into(),
            ApiKey,
        ))
    }
}

/// API key mutations.
#[derive(Default)]
pub struct ApiKeyMutation;

/// API key mutations.
#[Object]
impl ApiKeyMutation {
    /// Creates an API key and returns its token, once (admin only).
    async fn create_api_key(
        &self,
        ctx: &Context<'_>,
        input: CreateApiKeyInput,
    ) -> ApiResult<ApiKeyWithToken> {
        let scope = input
            .endpoint_ids
            .unwrap_or_default()
            .iter()
            .map(|id| parse_id(id, "endpointIds"))
            .collect::<Result<Vec<Uuid>, _>>()?;
        let tenant = input
            .tenant_id
            .as_ref()
            .map(|id| parse_id(id, "tenantId"))
            .transpose()?;
        let limits = auth::KeyLimits {
            endpoints: &scope,
            tenant,
            expires_in: None,
        };
        let created = Box::pin(state(ctx)?.api_keys.create(
            caller(ctx)?,
            &input.name,
            input.role.into(),
            limits,
        ))
        .await?;
        Ok(ApiKeyWithToken {
            api_key: ApiKey(created.key),
            token: created.token,
        })
    }

    /// Revokes an API key (admin only): every process refuses it within a second and its
    /// open subscriptions end. Revoking a revoked key changes nothing.
    async fn revoke_api_key(&self, ctx: &Context<'_>, id: ID) -> ApiResult<ApiKey> {
        let id = parse_id(&id, "id")?;
        let key = Box::pin(state(ctx)?.api_keys.revoke(caller(ctx)?, id)).await?;
        Ok(ApiKey(key))
    }
}
