//! API keys for administrators: creating, listing with keyset pages, and revoking; and any
//! key's own record. Tokens and their hashes never leave this layer except a new token, once.

use entity::api_key;
use sea_orm::ActiveEnum as _;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use std::sync::Arc;

use crate::auth::cache::KeyCache;
use crate::auth::revocation::Revocations;
use crate::auth::{self, Identity, KeyLimits, NewApiKey, RevokeOutcome, Role};
use crate::db::Db;
use crate::error::{Error, Result};
use crate::service::pagination::{Page, PageRequest};

/// API key operations (admin only, but for a key reading itself).
#[derive(Clone, Debug)]
pub struct ApiKeys {
    db: Db,
    keys: Arc<KeyCache>,
    revocations: Revocations,
}

impl ApiKeys {
    /// API key operations on `db`; a key this process revokes leaves its cache `keys` and
    /// ends its sessions (`revocations`) at once.
    pub fn new(db: Db, keys: Arc<KeyCache>, revocations: Revocations) -> Self {
        ApiKeys {
            db,
            keys,
            revocations,
        }
    }

    /// Creates a key; its token is in the result and nowhere else.
    #[tracing::instrument(skip_all)]
    pub async fn create(
        &self,
        caller: &Identity,
        name: &str,
        role: Role,
        limits: KeyLimits<'_>,
    ) -> Result<NewApiKey> {
        caller.require_admin()?;
        let created = auth::create_api_key(&self.db, name, role, limits).await?;
        tracing::info!(api_key_id = %created.id, role = %role.to_value(), "API key created");
        Ok(created)
    }

    /// Revokes a key: on this process at once, on every other within a second (see
    /// [`auth::revoke_api_key`]); the key as stored either way.
    pub async fn revoke(&self, caller: &Identity, id: Uuid) -> Result<api_key::Model> {
        caller.require_admin()?;
        let outcome = auth::revoke_api_key(&self.db, id).await?;
        // Revoked just now or before (by another process, the CLI, plain SQL): either
        // way this process refuses it from now on.
        self.revocations.revoked_here(&self.keys, id);
        Ok(match outcome {
            RevokeOutcome::Revoked(key) | RevokeOutcome::AlreadyRevoked(key) => key,
        })
    }

    /// The caller's own key, whatever its role.
    pub async fn current(&self, caller: &Identity) -> Result<api_key::Model> {
        api_key::Entity::find_by_id(caller.key_id)
            .one(self.db.conn())
            .await?
            .ok_or(Error::Unauthenticated)
    }

    /// Every key, revoked ones included, oldest first.
    pub async fn list(&self, caller: &Identity, page: PageRequest) -> Result<Page<api_key::Model>> {
        caller.require_admin()?;
        list(&self.db, page).await
    }
}

/// Every key, oldest first, with no caller check (for `courier api-key list`).
pub async fn list(db: &Db, page: PageRequest) -> Result<Page<api_key::Model>> {
    let mut query = api_key::Entity::find().order_by_asc(api_key::Column::Id);
    if let Some(after) = page.after {
        query = query.filter(api_key::Column::Id.gt(after));
    }
    let rows = query.limit(page.fetch_limit()).all(db.conn()).await?;
    Ok(Page::from_overfetch(rows, &page))
}
