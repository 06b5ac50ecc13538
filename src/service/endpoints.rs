//! Endpoints: create, update and rotate secrets under a row lock, disable and re-enable
//! (parking and resuming their deliveries), read, and list with keyset pages.

use entity::endpoint;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use uuid::Uuid;

use crate::auth::Identity;
use crate::bus::{self, ChangeBus, Wakeup};
use crate::crypto::sealing::SecretKeys;
use crate::crypto::signing;
use crate::db::{self, Db};
use crate::destination;
use crate::error::{Error, Result};
use crate::service::access::Access;
use crate::service::pagination::{Page, PageRequest};
use crate::service::recent_health::{self, RecentHealth};
use crate::service::rotation;
use crate::service::switch::{self, DisabledReason};
use crate::service::tenants;
use crate::service::{event_types, flow};

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
    /// The event types `publish` delivers here; `None` or empty: every type.
    pub event_types: Option<Vec<String>>,
    /// Requests in flight at once; `None`: the configured default.
    pub max_in_flight: Option<i32>,
    /// Request starts per second; `None`: unlimited.
    pub rate_limit: Option<i32>,
    /// The tenant it belongs to, for good; `None`: the caller's own for a tenant's key,
    /// none for an admin.
    pub tenant_id: Option<Uuid>,
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
    /// New event types; empty: every type.
    pub event_types: Option<Vec<String>>,
    /// New cap on requests in flight; `Some(None)`: back to the default.
    pub max_in_flight: Option<Option<i32>>,
    /// New rate limit; `Some(None)`: unlimited.
    pub rate_limit: Option<Option<i32>>,
}

/// Operations on endpoints.
#[derive(Clone, Debug)]
pub struct Endpoints {
    db: Db,
    access: Access,
    bus: ChangeBus,
    wakeup: Wakeup,
    allow_private_destinations: bool,
    keys: SecretKeys,
}

impl Endpoints {
    /// Endpoint operations on `db`; private destinations are refused unless allowed,
    /// secrets are stored sealed with `keys` (as they are when it holds none), the
    /// deliveries of operational events go out on `bus`, and `wakeup` tells this
    /// process's worker when a change made work due.
    pub fn new(
        db: Db,
        access: Access,
        bus: ChangeBus,
        wakeup: Wakeup,
        allow_private_destinations: bool,
        keys: SecretKeys,
    ) -> Self {
        Endpoints {
            db,
            access,
            bus,
            wakeup,
            allow_private_destinations,
            keys,
        }
    }

    /// Creates an endpoint with a fresh signing secret: an admin's (of any tenant, or none)
    /// or a tenant's key's (of its own tenant).
    #[tracing::instrument(skip_all)]
    pub async fn create(
        &self,
        caller: &Identity,
        input: NewEndpoint,
    ) -> Result<EndpointWithSecret> {
        let tenant_id = self
            .access
            .tenant_for_new_endpoint(caller, input.tenant_id)?;
        if let Some(tenant) = tenant_id {
            if !tenants::exists(&self.db, tenant).await? {
                return Err(Error::bad_input(format!("tenant {tenant} does not exist")));
            }
        }
        let name = crate::labels::validate(&input.name)?;
        let url = destination::validate_url(&input.url, self.allow_private_destinations)?;
        let event_types = event_types::subscription(input.event_types.unwrap_or_default())?;
        let max_in_flight = validate_max_in_flight(input.max_in_flight)?;
        let rate_limit = validate_rate_limit(input.rate_limit)?;
        let secret = signing::mint_secret();
        let now = db::now();
        let id = crate::db::ids::new_id();
        let row = endpoint::ActiveModel {
            id: Set(id),
            name: Set(name),
            url: Set(url.to_string()),
            signing_secret: Set(self.keys.seal(id, &secret).map_err(Error::Secret)?),
            previous_signing_secret: Set(None),
            previous_secret_expires_at: Set(None),
            disabled: Set(false),
            disabled_reason: Set(None),
            disabled_at: Set(None),
            consecutive_failures: Set(0),
            created_at: Set(now),
            updated_at: Set(now),
            event_types: Set(event_types),
            max_in_flight: Set(max_in_flight),
            rate_limit: Set(rate_limit),
            paused_until: Set(None),
            tenant_id: Set(tenant_id),
        };
        let (db, row) = (&self.db, &row);
        // The endpoint and its turn in the claims' round robin (see `flow`) go together.
        let endpoint = db
            .transaction(|txn| async move {
                let endpoint = row.clone().insert(&*txn).await?;
                txn.execute_raw(
                    db.clock()
                        .statement(flow::INSERT_FLOW, [endpoint.id.into()]),
                )
                .await?;
                Ok(endpoint)
            })
            .await?;
        tracing::info!(endpoint_id = %endpoint.id, "endpoint created");
        Ok(EndpointWithSecret {
            endpoint,
            secret: Some(secret),
        })
    }

    /// Updates an endpoint (admins, and the key of its tenant). The row is locked for the whole
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
        self.access.require_manage(caller, id).await?;
        let name = match patch
            .name
            .as_deref()
            .map(crate::labels::validate)
            .transpose()
        {
            Ok(name) => name,
            // A name stored before the rules it breaks, sent back unchanged (the console
            // sends every field of its form), is kept as it is.
            Err(refused) => {
                let stored = endpoint::Entity::find_by_id(id)
                    .select_only()
                    .column(endpoint::Column::Name)
                    .into_tuple::<String>()
                    .one(self.db.conn())
                    .await?;
                if stored.as_deref() != patch.name.as_deref().map(str::trim) {
                    return Err(refused);
                }
                None
            }
        };
        let url = patch
            .url
            .as_deref()
            .map(|url| destination::validate_url(url, self.allow_private_destinations))
            .transpose()?;
        let event_types = patch
            .event_types
            .map(event_types::subscription)
            .transpose()?;
        let max_in_flight = patch
            .max_in_flight
            .map(validate_max_in_flight)
            .transpose()?;
        let rate_limit = patch.rate_limit.map(validate_rate_limit).transpose()?;

        // A new destination gets a new secret at once (no overlap with the old one), minted
        // and sealed before the transaction; unused if the URL turns out unchanged.
        let minted = match &url {
            Some(_) => {
                let minted = signing::mint_secret();
                let sealed = self.keys.seal(id, &minted).map_err(Error::Secret)?;
                Some((minted, sealed))
            }
            None => None,
        };
        let (db, name, url, minted, event_types) = (&self.db, &name, &url, &minted, &event_types);
        let (max_in_flight, rate_limit) = (&max_in_flight, &rate_limit);
        let disabled = patch.disabled;
        let bus = &self.bus;
        let (endpoint, secret, was_disabled, made_due, staged) = db
            .transaction(|txn| async move {
                if disabled.is_some() {
                    switch::lock_for_switch(&*txn, db.backend(), id).await?;
                }
                let Some(current) = endpoint::Entity::find_by_id(id)
                    .lock_exclusive()
                    .one(&*txn)
                    .await?
                else {
                    return Ok(None);
                };
                let now = db::now();
                let mut secret = None;
                let mut row: endpoint::ActiveModel = current.clone().into();
                if let Some(name) = name {
                    row.name = Set(name.clone());
                }
                if let (Some(url), Some((minted, sealed))) = (
                    url.as_ref()
                        .map(|url| url.to_string())
                        .filter(|url| *url != current.url),
                    minted,
                ) {
                    row.url = Set(url);
                    row.signing_secret = Set(sealed.clone());
                    row.previous_signing_secret = Set(None);
                    row.previous_secret_expires_at = Set(None);
                    secret = Some(minted.clone());
                }
                if let Some(event_types) = event_types {
                    row.event_types = Set(event_types.clone());
                }
                if let Some(max_in_flight) = max_in_flight {
                    row.max_in_flight = Set(*max_in_flight);
                }
                if let Some(rate_limit) = rate_limit {
                    row.rate_limit = Set(*rate_limit);
                }
                row.updated_at = Set(now);
                let mut endpoint = row.update(&*txn).await?;
                let switched = match disabled {
                    Some(true) => {
                        switch::disable(&*txn, db.backend(), id, DisabledReason::Manual).await?
                    }
                    Some(false) => switch::enable(&*txn, db.backend(), id).await?,
                    None => None,
                };
                if switched.is_some() {
                    endpoint = endpoint::Entity::find_by_id(id)
                        .one(&*txn)
                        .await?
                        .ok_or_else(|| {
                            sea_orm::DbErr::RecordNotFound("the endpoint just updated".into())
                        })?;
                }
                // A new cap or rate limit is felt by the next claim on every process (they
                // read it from this row); the turn is looked at afresh.
                let rate_changed = endpoint.rate_limit != current.rate_limit;
                let settings_changed =
                    rate_changed || endpoint.max_in_flight != current.max_in_flight;
                if settings_changed {
                    let clock = db.clock();
                    let statement = if rate_changed {
                        let interval = endpoint
                            .rate_limit
                            .and_then(|rate| u32::try_from(rate).ok())
                            .and_then(|rate| flow::Rate::new(rate).interval().to_std().ok());
                        let values = [endpoint.id.into(), clock.after_opt(interval)];
                        clock.statement(flow::RATE_CHANGED, values)
                    } else {
                        clock.statement(flow::CAP_CHANGED, [endpoint.id.into()])
                    };
                    txn.execute_raw(statement).await?;
                }
                // Re-enabled, or with new limits: its deliveries may be due with no state
                // change to announce them.
                let made_due = settings_changed || (current.disabled && !endpoint.disabled);
                if made_due {
                    bus::announce_due(&*txn, db.backend(), id).await?;
                }
                let staged = bus.stage(&*txn, switched.unwrap_or_default()).await?;
                Ok(Some((endpoint, secret, current.disabled, made_due, staged)))
            })
            .await?
            .ok_or(Error::NotFound("endpoint"))?;
        staged.committed();
        tracing::info!(rotated_secret = secret.is_some(), "endpoint updated");
        if made_due {
            // Its turn was woken, with no state change to announce it (a re-enabled
            // endpoint's deliveries stay `pending`): this process's worker looks at once,
            // the others when the announcement reaches them.
            self.wakeup.hint();
        }
        if endpoint.disabled != was_disabled {
            match endpoint.disabled {
                true => switch::log_disabled(
                    endpoint.id,
                    DisabledReason::Manual,
                    endpoint.consecutive_failures,
                ),
                false => switch::log_enabled(endpoint.id),
            }
        }
        Ok(EndpointWithSecret { endpoint, secret })
    }

    /// Mints a new signing secret (admins, and the key of the endpoint's tenant), returned
    /// once (see [`rotation::rotate`]).
    #[tracing::instrument(skip_all, fields(endpoint_id = %id))]
    pub async fn rotate_secret(
        &self,
        caller: &Identity,
        id: Uuid,
        grace_secs: Option<i64>,
    ) -> Result<EndpointWithSecret> {
        self.access.require_manage(caller, id).await?;
        rotation::rotate(&self.db, &self.keys, id, grace_secs).await
    }

    /// One endpoint, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<endpoint::Model>> {
        self.access.require(caller, id).await?;
        Ok(endpoint::Entity::find_by_id(id).one(self.db.conn()).await?)
    }

    /// How each of these endpoints fared over the last hour, with no scope check: for
    /// fields of rows already checked.
    pub async fn recent_health(
        &self,
        ids: &[Uuid],
    ) -> Result<std::collections::HashMap<Uuid, RecentHealth>> {
        Ok(recent_health::recent(&self.db, ids).await?)
    }

    /// The endpoints with these ids, with no scope check.
    pub async fn load_many(&self, ids: &[Uuid]) -> Result<Vec<endpoint::Model>> {
        Ok(endpoint::Entity::find()
            .filter(endpoint::Column::Id.is_in(ids.iter().copied()))
            .all(self.db.conn())
            .await?)
    }

    /// Endpoints the caller may see (of one tenant, if given), oldest first.
    pub async fn list(
        &self,
        caller: &Identity,
        tenant: Option<Uuid>,
        page: PageRequest,
    ) -> Result<Page<endpoint::Model>> {
        let mut query = endpoint::Entity::find().order_by_asc(endpoint::Column::Id);
        if let Some(visible) = Access::endpoints_condition(caller) {
            query = query.filter(visible);
        }
        if let Some(tenant) = tenant {
            query = query.filter(endpoint::Column::TenantId.eq(tenant));
        }
        if let Some(after) = page.after {
            query = query.filter(endpoint::Column::Id.gt(after));
        }
        let rows = query.limit(page.fetch_limit()).all(self.db.conn()).await?;
        Ok(Page::from_overfetch(rows, &page))
    }
}

/// `maxInFlight`: 1 to 1000, or none (the default).
fn validate_max_in_flight(value: Option<i32>) -> Result<Option<i32>> {
    within(
        value,
        flow::MIN_MAX_IN_FLIGHT..=flow::MAX_MAX_IN_FLIGHT,
        "maxInFlight",
        "",
    )
}

/// `rateLimit`: 1 to 100000 requests per second, or none (unlimited).
fn validate_rate_limit(value: Option<i32>) -> Result<Option<i32>> {
    within(
        value,
        flow::MIN_RATE_LIMIT..=flow::MAX_RATE_LIMIT,
        "rateLimit",
        " requests per second",
    )
}

/// An optional setting within `range`, or `BAD_USER_INPUT` naming `field`.
fn within(
    value: Option<i32>,
    range: std::ops::RangeInclusive<i32>,
    field: &str,
    unit: &str,
) -> Result<Option<i32>> {
    match value {
        Some(n) if !range.contains(&n) => Err(Error::bad_input(format!(
            "{field} must be {} to {}{unit}",
            range.start(),
            range.end()
        ))),
        value => Ok(value),
    }
}
