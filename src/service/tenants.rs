//! Tenants: creating and reading the customers endpoints are grouped by, and portal links
//! (a short-lived key of the tenant, and the console URL signed in with it).

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::tenant;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::auth::{self, Identity, KeyLimits, Role};
use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::service::access::Access;
use crate::service::pagination::{Page, PageRequest};

/// A portal link's life when none is asked for: an hour.
pub const DEFAULT_PORTAL_TTL_SECS: i64 = 3_600;

/// The longest life a portal link may have: a day.
pub const MAX_PORTAL_TTL_SECS: i64 = 86_400;

/// A portal link just minted.
#[derive(Debug, Clone)]
pub struct PortalLink {
    /// The console, signed in with the key (`<public base>/#token=<token>`).
    pub url: String,
    /// The tenant's key, shown only now.
    pub token: String,
    /// When the key stops authenticating, on every process.
    pub expires_at: DateTime<Utc>,
}

/// Tenant operations.
#[derive(Clone, Debug)]
pub struct Tenants {
    db: Db,
    access: Access,
    /// Where the console is reached from outside, without a trailing slash.
    public_url: String,
}

impl Tenants {
    /// Tenant operations on `db`; portal links point at `public_url`.
    pub fn new(db: Db, access: Access, public_url: &str) -> Self {
        Tenants {
            db,
            access,
            public_url: public_url.trim_end_matches('/').to_owned(),
        }
    }

    /// Creates a tenant (admin only).
    #[tracing::instrument(skip_all)]
    pub async fn create(&self, caller: &Identity, name: &str) -> Result<tenant::Model> {
        caller.require_admin()?;
        create(&self.db, name).await
    }

    /// One tenant, if it exists: admins read any, a tenant's key its own.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<tenant::Model>> {
        self.access.require_tenant(caller, id)?;
        self.load(id).await
    }

    /// One tenant by id, with no scope check: for fields of rows already checked.
    pub async fn load(&self, id: Uuid) -> Result<Option<tenant::Model>> {
        Ok(tenant::Entity::find_by_id(id).one(self.db.conn()).await?)
    }

    /// Every tenant, oldest first (admin only).
    pub async fn list(&self, caller: &Identity, page: PageRequest) -> Result<Page<tenant::Model>> {
        caller.require_admin()?;
        list(&self.db, page).await
    }

    /// Mints a portal link for the tenant (admin only): a partner key of the tenant that
    /// expires `ttl_secs` from now by the database's clock (default an hour, at most a day).
    #[tracing::instrument(skip_all, fields(tenant_id = %tenant_id))]
    pub async fn create_portal_link(
        &self,
        caller: &Identity,
        tenant_id: Uuid,
        ttl_secs: Option<i64>,
    ) -> Result<PortalLink> {
        caller.require_admin()?;
        let ttl_secs = ttl_secs.unwrap_or(DEFAULT_PORTAL_TTL_SECS);
        if !(1..=MAX_PORTAL_TTL_SECS).contains(&ttl_secs) {
            return Err(Error::bad_input(format!(
                "ttlSeconds must be 1 to {MAX_PORTAL_TTL_SECS}"
            )));
        }
        let tenant = self
            .load(tenant_id)
            .await?
            .ok_or(Error::NotFound("tenant"))?;
        let created = auth::create_api_key(
            &self.db,
            &crate::labels::fitted(&format!("portal link for {}", tenant.name)),
            Role::Partner,
            KeyLimits {
                endpoints: &[],
                tenant: Some(tenant.id),
                expires_in: Some(Duration::from_secs(ttl_secs.unsigned_abs())),
            },
        )
        .await?;
        let expires_at = created.key.expires_at.ok_or_else(|| {
            Error::Database(sea_orm::DbErr::RecordNotFound(
                "the expiry of the key just created".into(),
            ))
        })?;
        tracing::info!(api_key_id = %created.id, ttl_secs, "portal link created");
        Ok(PortalLink {
            url: format!("{}/#token={}", self.public_url, created.token),
            token: created.token,
            expires_at,
        })
    }
}

/// Creates a tenant named `name` (for the API and `courier tenant create`).
pub async fn create(db: &Db, name: &str) -> Result<tenant::Model> {
    let name = crate::labels::validate(name)?;
    let tenant = tenant::ActiveModel {
        id: Set(crate::db::ids::new_id()),
        name: Set(name),
        created_at: Set(db::now()),
    }
    .insert(db.conn())
    .await?;
    tracing::info!(tenant_id = %tenant.id, "tenant created");
    Ok(tenant)
}

/// Every tenant, oldest first, with no caller check (for `courier tenant list`).
pub async fn list(db: &Db, page: PageRequest) -> Result<Page<tenant::Model>> {
    let mut query = tenant::Entity::find().order_by_asc(tenant::Column::Id);
    if let Some(after) = page.after {
        query = query.filter(tenant::Column::Id.gt(after));
    }
    let rows = query.limit(page.fetch_limit()).all(db.conn()).await?;
    Ok(Page::from_overfetch(rows, &page))
}

/// Whether a tenant with this id exists.
pub async fn exists(db: &Db, id: Uuid) -> Result<bool> {
    Ok(tenant::Entity::find_by_id(id)
        .one(db.conn())
        .await?
        .is_some())
}
