//! Who may see, use and manage which endpoint: the one place a caller's scope is decided,
//! for every operation, listing and subscription. Admins reach everything; a partner key
//! limited to a list reaches those endpoints; a tenant's key reaches every endpoint of its
//! tenant, including ones created after the key, and may manage them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use entity::endpoint;
use sea_orm::sea_query::SimpleExpr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect, QueryTrait};
use uuid::Uuid;

use crate::auth::{Identity, Role};
use crate::db::Db;
use crate::error::{Error, Result};

/// Endpoints whose tenant is remembered at most; past this the memory starts over.
const MAX_REMEMBERED: usize = 100_000;

/// Refused: outside the key's scope (the same answer whether or not the endpoint exists).
const OUTSIDE: Error = Error::Forbidden("this endpoint is outside the API key's scope");

/// What a caller's listings are limited to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible<'a> {
    /// Everything (admins).
    Everything,
    /// These endpoints (a partner key limited to a list).
    Endpoints(&'a [Uuid]),
    /// Every endpoint of this tenant (a tenant's key).
    Tenant(Uuid),
}

impl Identity {
    /// What the caller's listings are limited to.
    pub fn visible(&self) -> Visible<'_> {
        match (self.role, self.tenant) {
            (Role::Admin, _) => Visible::Everything,
            (Role::Partner, Some(tenant)) => Visible::Tenant(tenant),
            (Role::Partner, None) => Visible::Endpoints(&self.scope),
        }
    }
}

/// Scope decisions, with the tenant of each endpoint remembered: an endpoint never changes
/// tenant and is never deleted, so what was read once stays true.
#[derive(Clone, Debug, Default)]
pub struct Access {
    db: Option<Db>,
    tenants: Arc<Mutex<HashMap<Uuid, Option<Uuid>>>>,
}

impl Access {
    /// Scope decisions reading endpoints' tenants from `db`.
    pub fn new(db: Db) -> Self {
        Access {
            db: Some(db),
            tenants: Arc::default(),
        }
    }

    /// Whether the caller may see and use the endpoint `endpoint_id` (false if it does not
    /// exist).
    pub async fn allows(&self, caller: &Identity, endpoint_id: Uuid) -> Result<bool> {
        Ok(match caller.visible() {
            Visible::Everything => true,
            Visible::Endpoints(scope) => scope.contains(&endpoint_id),
            Visible::Tenant(tenant) => {
                allowed_from_memory(tenant, self.remembered(endpoint_id))
                    || self.read_tenant(endpoint_id).await? == Some(Some(tenant))
            }
        })
    }

    /// [`Access::allows`] for a subscription's stream of changes, trusting memory both ways:
    /// an endpoint's remembered tenant decides, and one not yet remembered is read once.
    /// Nothing is answered per change, so no timing is there to hide, while a tenant's feed
    /// beside a busy neighbour would otherwise read the database for each of its changes.
    pub async fn allows_streamed(&self, caller: &Identity, endpoint_id: Uuid) -> Result<bool> {
        match caller.visible() {
            Visible::Tenant(_) => Ok(match self.tenant_of(endpoint_id).await? {
                Some(tenant) => rule(caller, endpoint_id, tenant),
                None => false,
            }),
            _ => self.allows(caller, endpoint_id).await,
        }
    }

    /// Whether what is remembered leaves it open that the caller may see the endpoint
    /// `endpoint_id`: false only when it is known outside the caller's scope (a cheap
    /// first cut, with no read, before [`Access::allows_streamed`] decides).
    pub fn may_allow(&self, caller: &Identity, endpoint_id: Uuid) -> bool {
        match caller.visible() {
            Visible::Tenant(_) => self
                .remembered(endpoint_id)
                .is_none_or(|tenant| rule(caller, endpoint_id, tenant)),
            _ => rule(caller, endpoint_id, None),
        }
    }

    /// Whether the caller may see and use the endpoint `endpoint_id` of tenant `tenant`,
    /// read with it.
    pub fn allows_known(&self, caller: &Identity, endpoint_id: Uuid, tenant: Option<Uuid>) -> bool {
        self.remember(endpoint_id, tenant);
        rule(caller, endpoint_id, tenant)
    }

    /// Refuses an endpoint outside the caller's scope (`FORBIDDEN`).
    pub async fn require(&self, caller: &Identity, endpoint_id: Uuid) -> Result<()> {
        if self.allows(caller, endpoint_id).await? {
            Ok(())
        } else {
            Err(OUTSIDE)
        }
    }

    /// [`Access::require`], and for an admin, `NOT_FOUND` unless the endpoint exists (for a
    /// key with a scope, one that does not exist is outside it, as in `require`).
    pub async fn require_existing(&self, caller: &Identity, endpoint_id: Uuid) -> Result<()> {
        match caller.visible() {
            Visible::Everything => match self.tenant_of(endpoint_id).await? {
                Some(_) => Ok(()),
                None => Err(Error::NotFound("endpoint")),
            },
            _ => self.require(caller, endpoint_id).await,
        }
    }

    /// A row looked up by id, shown only within the caller's scope (by `endpoint_of`, the
    /// endpoint it belongs to): outside it `FORBIDDEN`, and for a key with a scope, nothing
    /// found is `FORBIDDEN` too, so such a key cannot tell whether something outside its
    /// scope exists, not by the answer nor by its time (for a tenant's key, nothing found
    /// costs the read of an endpoint's tenant that a row of another tenant costs). Admins
    /// get `None` for what does not exist.
    pub async fn reveal<T>(
        &self,
        caller: &Identity,
        found: Option<T>,
        endpoint_of: impl FnOnce(&T) -> Uuid,
    ) -> Result<Option<T>> {
        match found {
            Some(found) => {
                self.require(caller, endpoint_of(&found)).await?;
                Ok(Some(found))
            }
            None => {
                if let Visible::Tenant(_) = caller.visible() {
                    self.read_tenant(Uuid::nil()).await?;
                }
                Self::nothing_found(caller).map(|()| None)
            }
        }
    }

    /// Nothing has the id the caller asked for: fine for an admin (null, or `NOT_FOUND`),
    /// `FORBIDDEN` for a key with a scope (the answer it gets for what is outside it).
    pub fn nothing_found(caller: &Identity) -> Result<()> {
        match caller.visible() {
            Visible::Everything => Ok(()),
            _ => Err(OUTSIDE),
        }
    }

    /// Refuses unless the caller may change the endpoint (its settings, secret, disabled
    /// state): admins, and the key of the endpoint's tenant.
    pub async fn require_manage(&self, caller: &Identity, endpoint_id: Uuid) -> Result<()> {
        match caller.visible() {
            Visible::Everything => Ok(()),
            Visible::Endpoints(_) => Err(Error::Forbidden(
                "managing endpoints needs an admin key or a tenant's key",
            )),
            Visible::Tenant(_) => self.require(caller, endpoint_id).await,
        }
    }

    /// The tenant a new endpoint gets when the caller creates it asking for `requested`:
    /// an admin any (or none), a tenant's key its own tenant only; a key limited to a list
    /// of endpoints creates none.
    pub fn tenant_for_new_endpoint(
        &self,
        caller: &Identity,
        requested: Option<Uuid>,
    ) -> Result<Option<Uuid>> {
        match (caller.visible(), requested) {
            (Visible::Everything, requested) => Ok(requested),
            (Visible::Tenant(own), None) => Ok(Some(own)),
            (Visible::Tenant(own), Some(requested)) if requested == own => Ok(Some(own)),
            (Visible::Tenant(_), Some(_)) => Err(Error::Forbidden(
                "a tenant's key creates endpoints of its own tenant only",
            )),
            (Visible::Endpoints(_), _) => Err(Error::Forbidden(
                "creating endpoints needs an admin key or a tenant's key",
            )),
        }
    }

    /// Refuses unless the caller may read the tenant `tenant_id`: admins, and the tenant's
    /// own keys.
    pub fn require_tenant(&self, caller: &Identity, tenant_id: Uuid) -> Result<()> {
        match caller.visible() {
            Visible::Everything => Ok(()),
            Visible::Tenant(own) if own == tenant_id => Ok(()),
            _ => Err(Error::Forbidden(
                "this tenant is outside the API key's scope",
            )),
        }
    }

    /// Whether the caller may read the tenant `tenant_id` (see [`Access::require_tenant`]).
    pub fn may_read_tenant(&self, caller: &Identity, tenant_id: Uuid) -> bool {
        self.require_tenant(caller, tenant_id).is_ok()
    }

    /// The condition limiting `column` (which holds endpoint ids) to the caller's scope;
    /// `None` for admins.
    pub fn endpoint_condition(caller: &Identity, column: impl ColumnTrait) -> Option<SimpleExpr> {
        match caller.visible() {
            Visible::Everything => None,
            Visible::Endpoints(scope) => Some(column.is_in(scope.iter().copied())),
            Visible::Tenant(tenant) => Some(in_tenant(column, tenant)),
        }
    }

    /// The caller's scope as a condition on the `endpoints` table itself (by id or by
    /// tenant), or `None` for an admin, who sees every endpoint.
    pub fn endpoints_condition(caller: &Identity) -> Option<SimpleExpr> {
        match caller.visible() {
            Visible::Everything => None,
            Visible::Endpoints(scope) => Some(endpoint::Column::Id.is_in(scope.iter().copied())),
            Visible::Tenant(tenant) => Some(endpoint::Column::TenantId.eq(tenant)),
        }
    }

    /// The tenant of an endpoint: `None` if there is no such endpoint, `Some(None)` for
    /// one without a tenant.
    async fn tenant_of(&self, endpoint_id: Uuid) -> Result<Option<Option<Uuid>>> {
        match self.remembered(endpoint_id) {
            Some(known) => Ok(Some(known)),
            None => self.read_tenant(endpoint_id).await,
        }
    }

    /// The tenant of an endpoint as remembered: `None` if it is not (yet) remembered.
    fn remembered(&self, endpoint_id: Uuid) -> Option<Option<Uuid>> {
        self.tenants
            .lock()
            .ok()
            .and_then(|tenants| tenants.get(&endpoint_id).copied())
    }

    /// [`Access::tenant_of`], read from the database (and remembered when found).
    async fn read_tenant(&self, endpoint_id: Uuid) -> Result<Option<Option<Uuid>>> {
        let Some(db) = &self.db else {
            return Ok(None);
        };
        let found: Option<Option<Uuid>> = endpoint::Entity::find_by_id(endpoint_id)
            .select_only()
            .column(endpoint::Column::TenantId)
            .into_tuple()
            .one(db.conn())
            .await?;
        if let Some(tenant) = found {
            self.remember(endpoint_id, tenant);
        }
        Ok(found)
    }

    fn remember(&self, endpoint_id: Uuid, tenant: Option<Uuid>) {
        if let Ok(mut tenants) = self.tenants.lock() {
            if tenants.len() >= MAX_REMEMBERED {
                tenants.clear();
            }
            tenants.insert(endpoint_id, tenant);
        }
    }
}

/// The condition that `column` (which holds endpoint ids) names an endpoint of `tenant`.
pub fn in_tenant(column: impl ColumnTrait, tenant: Uuid) -> SimpleExpr {
    column.in_subquery(
        endpoint::Entity::find()
            .select_only()
            .column(endpoint::Column::Id)
            .filter(endpoint::Column::TenantId.eq(tenant))
            .into_query(),
    )
}

/// Whether memory alone allows a tenant's key an endpoint: only one remembered as the
/// tenant's own. Every other answer (another tenant's endpoint, one without a tenant, one
/// not remembered) is read from the database, so that a refusal takes as long whether the
/// endpoint exists, and may be remembered, or does not: its time tells nothing either.
fn allowed_from_memory(tenant: Uuid, remembered: Option<Option<Uuid>>) -> bool {
    remembered == Some(Some(tenant))
}

/// The scope rule on an endpoint whose tenant is known.
fn rule(caller: &Identity, endpoint_id: Uuid, tenant: Option<Uuid>) -> bool {
    match caller.visible() {
        Visible::Everything => true,
        Visible::Endpoints(scope) => scope.contains(&endpoint_id),
        Visible::Tenant(own) => tenant == Some(own),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(role: Role, tenant: Option<Uuid>, scope: Vec<Uuid>) -> Identity {
        Identity {
            key_id: Uuid::now_v7(),
            role,
            scope,
            tenant,
            expires_at: None,
        }
    }

    #[test]
    fn each_kind_of_key_reaches_its_own_scope() {
        let (tenant, other) = (Uuid::now_v7(), Uuid::now_v7());
        let endpoint = Uuid::now_v7();
        let admin = key(Role::Admin, None, vec![]);
        let listed = key(Role::Partner, None, vec![endpoint]);
        let tenants = key(Role::Partner, Some(tenant), vec![]);
        assert!(rule(&admin, endpoint, None));
        assert!(rule(&listed, endpoint, Some(other)));
        assert!(!rule(&listed, Uuid::now_v7(), Some(tenant)));
        assert!(rule(&tenants, Uuid::now_v7(), Some(tenant)));
        assert!(!rule(&tenants, endpoint, Some(other)));
        assert!(!rule(&tenants, endpoint, None));
    }

    #[test]
    fn only_a_tenants_own_remembered_endpoint_is_decided_from_memory() {
        let (tenant, other) = (Uuid::now_v7(), Uuid::now_v7());
        assert!(allowed_from_memory(tenant, Some(Some(tenant))));
        // Another tenant's, an untenanted and an unknown endpoint all go to the database.
        assert!(!allowed_from_memory(tenant, Some(Some(other))));
        assert!(!allowed_from_memory(tenant, Some(None)));
        assert!(!allowed_from_memory(tenant, None));
    }

    #[test]
    fn only_an_endpoint_known_outside_the_scope_is_cut_without_a_read() {
        let access = Access::default();
        let (tenant, other) = (Uuid::now_v7(), Uuid::now_v7());
        let (own, foreign, untenanted, unknown) = (
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
        );
        let tenants = key(Role::Partner, Some(tenant), vec![]);
        let admin = key(Role::Admin, None, vec![]);
        access.allows_known(&tenants, own, Some(tenant));
        access.allows_known(&tenants, foreign, Some(other));
        access.allows_known(&tenants, untenanted, None);
        assert!(access.may_allow(&tenants, own));
        assert!(access.may_allow(&tenants, unknown), "left to the read");
        assert!(!access.may_allow(&tenants, foreign));
        assert!(!access.may_allow(&tenants, untenanted));
        assert!(access.may_allow(&admin, foreign));
        let listed = key(Role::Partner, None, vec![own]);
        assert!(access.may_allow(&listed, own) && !access.may_allow(&listed, foreign));
    }

    #[test]
    fn new_endpoints_get_the_tenant_the_key_may_give() {
        let access = Access::default();
        let (tenant, other) = (Uuid::now_v7(), Uuid::now_v7());
        let admin = key(Role::Admin, None, vec![]);
        let tenants = key(Role::Partner, Some(tenant), vec![]);
        let listed = key(Role::Partner, None, vec![Uuid::now_v7()]);
        assert_eq!(
            access.tenant_for_new_endpoint(&admin, None).ok(),
            Some(None)
        );
        assert_eq!(
            access.tenant_for_new_endpoint(&admin, Some(other)).ok(),
            Some(Some(other))
        );
        assert_eq!(
            access.tenant_for_new_endpoint(&tenants, None).ok(),
            Some(Some(tenant))
        );
        assert!(access
            .tenant_for_new_endpoint(&tenants, Some(other))
            .is_err());
        assert!(access.tenant_for_new_endpoint(&listed, None).is_err());
    }
}
