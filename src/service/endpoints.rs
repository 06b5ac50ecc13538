//! Endpoints: create, update under a row lock, read, and list with keyset pages.

use entity::endpoint;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use uuid::Uuid;

use crate::auth::Identity;
use crate::db::{self, Db};
use crate::destination;
use crate::error::{Error, Result};
use crate::service::pagination::{Page, PageRequest};
use crate::signing;

/// Disabling an endpoint parks its pending deliveries: no due time, so they leave the
/// claim index instead of being scanned past by every claim until the endpoint returns.
/// Runs while the endpoint row is locked, so no submission can add a due row meanwhile
/// (see [`crate::service::parking`]).
const PARK: &str = "UPDATE webhook_deliveries SET next_attempt_at = NULL, updated_at = {now} \
     WHERE endpoint_id = $1 AND state = 'pending'";

/// Re-enabling makes parked deliveries due at once, on the database's clock.
const UNPARK: &str = "UPDATE webhook_deliveries SET next_attempt_at = {now}, updated_at = {now} \
     WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NULL";

/// Longest endpoint name.
const MAX_NAME_CHARS: usize = 200;

/// An endpoint as stored, with its secret when one was just minted.
#[derive(Debug, Clone)]
pub struct EndpointWithSecret {
    /// The endpoint as committed.
    pub endpoint: endpoint::Model,
    /// The signing secret, only when this operation minted it.
    pub secret: Option<String>,
}

/// Fields of `createEndpoint`.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    /// Label.
    pub name: String,
    /// Webhook URL.
    pub url: String,
}

/// Fields of `updateEndpoint`; `None` leaves a field unchanged.
#[derive(Debug, Clone, Default)]
pub struct EndpointPatch {
    /// New label.
    pub name: Option<String>,
    /// New URL; a different URL mints a new secret.
    pub url: Option<String>,
    /// Disable or re-enable.
    pub disabled: Option<bool>,
}

/// Operations on endpoints.
#[derive(Clone, Debug)]
pub struct Endpoints {
    db: Db,
    allow_private_destinations: bool,
}

impl Endpoints {
    /// Endpoint operations on `db`; private destinations are refused unless allowed.
    pub fn new(db: Db, allow_private_destinations: bool) -> Self {
        Endpoints {
            db,
            allow_private_destinations,
        }
    }

    /// Creates an endpoint with a fresh signing secret (admin only).
    #[tracing::instrument(skip_all)]
    pub async fn create(
        &self,
        caller: &Identity,
        input: NewEndpoint,
    ) -> Result<EndpointWithSecret> {
        caller.require_admin()?;
        let name = validate_name(&input.name)?;
        let url = destination::validate_url(&input.url, self.allow_private_destinations)?;
        let secret = signing::mint_secret();
        let now = db::now();
        let endpoint = endpoint::ActiveModel {
            id: Set(Uuid::now_v7()),
            name: Set(name),
            url: Set(url.to_string()),
            signing_secret: Set(secret.clone()),
            disabled: Set(false),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.db.conn())
        .await?;
        tracing::info!(endpoint_id = %endpoint.id, "endpoint created");
        Ok(EndpointWithSecret {
            endpoint,
            secret: Some(secret),
        })
    }

    /// Updates an endpoint (admin only). The row is locked for the whole
    /// transaction (`FOR UPDATE` on PostgreSQL, the write lock on SQLite), so
    /// concurrent updates are serialised and each caller gets back exactly the
    /// row it committed; a URL change mints a new secret, returned only here.
    #[tracing::instrument(skip_all, fields(endpoint_id = %id))]
    pub async fn update(
        &self,
        caller: &Identity,
        id: Uuid,
        patch: EndpointPatch,
    ) -> Result<EndpointWithSecret> {
        caller.require_admin()?;
        let name = patch.name.as_deref().map(validate_name).transpose()?;
        let url = patch
            .url
            .as_deref()
            .map(|url| destination::validate_url(url, self.allow_private_destinations))
            .transpose()?;

        let (db, name, url, disabled) = (&self.db, &name, &url, patch.disabled);
        let (endpoint, secret) = db
            .transaction(|txn| async move {
                let Some(current) = endpoint::Entity::find_by_id(id)
                    .lock_exclusive()
                    .one(&*txn)
                    .await?
                else {
                    return Ok(None);
                };
                let mut secret = None;
                let mut row: endpoint::ActiveModel = current.clone().into();
                if let Some(name) = name {
                    row.name = Set(name.clone());
                }
                if let Some(url) = url
                    .as_ref()
                    .map(|url| url.to_string())
                    .filter(|url| *url != current.url)
                {
                    let minted = signing::mint_secret();
                    row.url = Set(url);
                    row.signing_secret = Set(minted.clone());
                    secret = Some(minted);
                }
                if let Some(disabled) = disabled {
                    row.disabled = Set(disabled);
                }
                row.updated_at = Set(db::now());
                let endpoint = row.update(&*txn).await?;
                if endpoint.disabled != current.disabled {
                    let sql = if endpoint.disabled { PARK } else { UNPARK };
                    txn.execute_raw(db.clock().statement(sql, [endpoint.id.into()]))
                        .await?;
                }
                Ok(Some((endpoint, secret)))
            })
            .await?
            .ok_or(Error::NotFound("endpoint"))?;
        tracing::info!(rotated_secret = secret.is_some(), "endpoint updated");
        Ok(EndpointWithSecret { endpoint, secret })
    }

    /// One endpoint, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<endpoint::Model>> {
        caller.require_access(id)?;
        Ok(endpoint::Entity::find_by_id(id).one(self.db.conn()).await?)
    }

    /// The endpoints with these ids, with no scope check.
    pub async fn load_many(&self, ids: &[Uuid]) -> Result<Vec<endpoint::Model>> {
        Ok(endpoint::Entity::find()
            .filter(endpoint::Column::Id.is_in(ids.iter().copied()))
            .all(self.db.conn())
            .await?)
    }

    /// Endpoints the caller may see, oldest first.
    pub async fn list(
        &self,
        caller: &Identity,
        page: PageRequest,
    ) -> Result<Page<endpoint::Model>> {
        let mut query = endpoint::Entity::find().order_by_asc(endpoint::Column::Id);
        if let Some(scope) = caller.visible_endpoints() {
            query = query.filter(endpoint::Column::Id.is_in(scope.iter().copied()));
        }
        if let Some(after) = page.after {
            query = query.filter(endpoint::Column::Id.gt(after));
        }
        let rows = query.limit(page.fetch_limit()).all(self.db.conn()).await?;
        Ok(Page::from_overfetch(rows, &page))
    }
}

fn validate_name(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(Error::bad_input(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::bad_input("name must not contain control characters"));
    }
    Ok(name.to_owned())
}
