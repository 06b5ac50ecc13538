//! API keys: minting and hashing tokens, looking them up, and what each role and scope allows.

pub mod cache;
pub mod revocation;
pub mod usage;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use entity::api_key;
use rand::RngCore as _;
use sea_orm::sea_query::Expr;
use sea_orm::ExprTrait as _;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter,
    QuerySelect, Set, Statement, Value,
};
use sha2::{Digest, Sha256};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::bus::{self, KEYS_CHANNEL};
use crate::db::{self, Db};
use crate::error::{Error, Result};

/// Every token starts with this, so leaked tokens are easy to recognise and scan for.
const TOKEN_PREFIX: &str = "courier_";

/// Most endpoints a partner key's list may name (`endpointIds`); a tenant's key reaches
/// any number of endpoints.
pub const MAX_KEY_ENDPOINTS: usize = 1_000;

pub use entity::api_key::Role;

/// The authenticated caller of one request or WebSocket connection. What it may reach is
/// decided in one place, [`crate::service::access`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The API key's id (also the rate-limit subject).
    pub key_id: Uuid,
    /// What the key may do.
    pub role: Role,
    /// For partners limited to a list, the endpoints the key may use.
    pub scope: Vec<Uuid>,
    /// For a tenant's partner key, the tenant whose endpoints it may use and manage.
    pub tenant: Option<Uuid>,
    /// When the key stops authenticating (a portal link's), by the database's clock.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Identity {
    /// Refuses anyone but an admin.
    pub fn require_admin(&self) -> Result<()> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Partner => Err(Error::Forbidden("this operation requires an admin key")),
        }
    }
}

/// What a new key is limited to, besides its role.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyLimits<'a> {
    /// A partner key's list of endpoints.
    pub endpoints: &'a [Uuid],
    /// A partner key's tenant (instead of a list).
    pub tenant: Option<Uuid>,
    /// How long the key lives, by the database's clock; `None`: until revoked.
    pub expires_in: Option<Duration>,
}

impl KeyLimits<'_> {
    /// The endpoints of a key of `role` with these limits, each once (an endpoint named
    /// twice is one endpoint of its scope, stored and listed once), if the limits suit the
    /// role: a partner key is limited to a tenant or to a list of at most
    /// [`MAX_KEY_ENDPOINTS`] endpoints (repeats counted), not both; an admin key to neither (`BAD_USER_INPUT` otherwise). Checks
    /// nothing in the database (that the endpoints and the tenant exist).
    pub fn scope(&self, role: Role) -> Result<Vec<Uuid>> {
        let mut named = std::collections::HashSet::new();
        let scope: Vec<Uuid> = self
            .endpoints
            .iter()
            .copied()
            .filter(|id| named.insert(*id))
            .collect();
        match (role, self.tenant) {
            (Role::Partner, Some(_)) if !scope.is_empty() => {
                return Err(Error::bad_input(
                    "a partner key is limited to a tenant or to endpoints, not both",
                ));
            }
            (Role::Admin, _) if !scope.is_empty() || self.tenant.is_some() => {
                return Err(Error::bad_input(
                    "an admin key is not limited to endpoints or a tenant",
                ));
            }
            _ => {}
        }
        // The list as given, repeats included: a list of the same id a million times is
        // as long to read as a million ids.
        if self.endpoints.len() > MAX_KEY_ENDPOINTS {
            return Err(Error::bad_input(format!(
                "the key's list names {} endpoints; it holds at most {MAX_KEY_ENDPOINTS} \
                 (a tenant's key reaches any number)",
                self.endpoints.len()
            )));
        }
        Ok(scope)
    }
}

/// Sets a new key's expiry from the database's clock (`$2` bound by [`db::Clock::after`]).
const SET_EXPIRY: &str = "UPDATE api_keys SET expires_at = {after($2)} WHERE id = $1";

/// A key just created: its id and the token, which is never stored and never shown again.
#[derive(Debug)]
pub struct NewApiKey {
    /// The key's id.
    pub id: Uuid,
    /// The bearer token.
    pub token: String,
    /// The key as stored.
    pub key: api_key::Model,
}

/// Creates an API key and returns its token. A partner key is limited either to a list
/// of endpoints (each must exist; an empty list reaches no endpoint until the key is
/// replaced) or to a tenant (which must exist); an admin key to neither.
pub async fn create_api_key(
    db: &Db,
    name: &str,
    role: Role,
    limits: KeyLimits<'_>,
) -> Result<NewApiKey> {
    let name = crate::labels::validate(name)?;
    let name = name.as_str();
    let scope = limits.scope(role)?;
    if let Some(tenant) = limits.tenant {
        if entity::tenant::Entity::find_by_id(tenant)
            .one(db.conn())
            .await?
            .is_none()
        {
            return Err(Error::bad_input(format!("tenant {tenant} does not exist")));
        }
    }
    let found: std::collections::HashSet<Uuid> = entity::endpoint::Entity::find()
        .select_only()
        .column(entity::endpoint::Column::Id)
        .filter(entity::endpoint::Column::Id.is_in(scope.iter().copied()))
        .into_tuple()
        .all(db.conn())
        .await?
        .into_iter()
        .collect();
    if let Some(missing) = scope.iter().find(|id| !found.contains(id)) {
        return Err(Error::bad_input(format!(
            "endpoint {missing} does not exist"
        )));
    }

    let token = mint_token();
    let id = crate::db::ids::new_id();
    let scope_json = (role == Role::Partner && limits.tenant.is_none())
        .then(|| serde_json::Value::Array(scope.iter().map(|id| id.to_string().into()).collect()));
    let row = api_key::ActiveModel {
        id: Set(id),
        name: Set(name.to_owned()),
        role: Set(role),
        endpoint_scope: Set(scope_json),
        tenant_id: Set(limits.tenant),
        expires_at: Set(None),
        token_hash: Set(hash_token(&token)),
        created_at: Set(db::now()),
        revoked_at: Set(None),
        last_used_at: Set(None),
    };
    let (row, expires_in) = (&row, limits.expires_in);
    let key = db
        .transaction(|txn| async move {
            let inserted = row.clone().insert(&*txn).await?;
            let Some(expires_in) = expires_in else {
                return Ok(inserted);
            };
            txn.execute_raw(
                db.clock()
                    .statement(SET_EXPIRY, [id.into(), db.clock().after(expires_in)]),
            )
            .await?;
            api_key::Entity::find_by_id(id)
                .one(&*txn)
                .await?
                .ok_or_else(|| sea_orm::DbErr::RecordNotFound("the key just created".into()))
        })
        .await?;
    Ok(NewApiKey { id, token, key })
}

/// What [`revoke_api_key`] found: the key as stored afterwards either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// This call revoked the key.
    Revoked(api_key::Model),
    /// The key had been revoked before (by another call, process or operator); unchanged.
    AlreadyRevoked(api_key::Model),
}

impl RevokeOutcome {
    /// The key as stored, with its `revoked_at`.
    pub fn key(&self) -> &api_key::Model {
        match self {
            RevokeOutcome::Revoked(key) | RevokeOutcome::AlreadyRevoked(key) => key,
        }
    }
}

/// Revokes an API key: it authenticates nothing from now on, and every process drops it
/// from its cache and ends its sessions within a second (see [`crate::auth::revocation`]).
/// Two racing revocations are settled by the conditional UPDATE: one revokes, the other
/// finds it revoked, and `revoked_at` keeps the first time.
#[tracing::instrument(skip(db))]
pub async fn revoke_api_key(db: &Db, id: Uuid) -> Result<RevokeOutcome> {
    let (revoked, key) = db
        .transaction(|txn| async move {
            let revoked = api_key::Entity::update_many()
                .col_expr(api_key::Column::RevokedAt, Expr::value(db::now()))
                .filter(api_key::Column::Id.eq(id))
                .filter(api_key::Column::RevokedAt.is_null())
                .exec(&*txn)
                .await?
                .rows_affected
                == 1;
            if revoked && db.backend() == DbBackend::Postgres {
                // Sent on commit only; every process's listener hears it and checks at once.
                txn.execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    format!("SELECT {}", bus::notify(KEYS_CHANNEL, "$1")),
                    [id.to_string().into()],
                ))
                .await?;
            }
            let key = api_key::Entity::find_by_id(id).one(&*txn).await?;
            Ok((revoked, key))
        })
        .await?;
    match key {
        None => Err(Error::NotFound("API key")),
        Some(key) if revoked => {
            tracing::info!("API key revoked");
            Ok(RevokeOutcome::Revoked(key))
        }
        Some(key) => Ok(RevokeOutcome::AlreadyRevoked(key)),
    }
}

// Which of the keys in use are revoked, expired or gone (the revocation watcher's poll).
// PostgreSQL binds the ids as one uuid array, SQLite (which stores uuids as 16-byte blobs) as
// one JSON array of hex strings, so each backend prepares one statement whatever the number
// of keys.
const REVOKED_AMONG_POSTGRES: &str = "SELECT in_use.id FROM unnest($1::uuid[]) AS in_use (id) \
     LEFT JOIN api_keys k ON k.id = in_use.id \
     WHERE k.id IS NULL OR k.revoked_at IS NOT NULL OR k.expires_at <= statement_timestamp()";
const REVOKED_AMONG_SQLITE: &str = "SELECT in_use.id FROM \
     (SELECT unhex(value) AS id FROM json_each($1)) AS in_use \
     LEFT JOIN api_keys k ON k.id = in_use.id \
     WHERE k.id IS NULL OR k.revoked_at IS NOT NULL \
     OR (k.expires_at IS NOT NULL AND k.expires_at <= $2)";

/// The keys among `ids` that have been revoked, by whatever means, or have expired, or no
/// longer exist (deleted by retention once long expired, or by hand).
pub async fn revoked_among(db: &Db, ids: &[Uuid]) -> Result<Vec<Uuid>> {
    let statement = match db.backend() {
        DbBackend::Postgres => Statement::from_sql_and_values(
            DbBackend::Postgres,
            REVOKED_AMONG_POSTGRES,
            [Value::from(ids.to_vec())],
        ),
        backend => Statement::from_sql_and_values(
            backend,
            REVOKED_AMONG_SQLITE,
            [crate::db::sql::sqlite_ids(ids), db::now().into()],
        ),
    };
    let rows = db.conn().query_all_raw(statement).await?;
    rows.iter()
        .map(|row| row.try_get::<Uuid>("", "id").map_err(Error::from))
        .collect()
}

/// Resolves an `Authorization` header value (`Bearer <token>`) to the caller.
pub async fn authenticate(db: &Db, authorization: Option<&str>) -> Result<Identity> {
    let token = authorization
        .and_then(bearer_token)
        .ok_or(Error::Unauthenticated)?;
    authenticate_hash(db, &hash_token(token)).await
}

/// Resolves a token hash to the caller of a live key: not revoked, not expired (by the
/// database's clock).
pub async fn authenticate_hash(db: &Db, token_hash: &str) -> Result<Identity> {
    let unexpired = match db.backend() {
        DbBackend::Postgres => {
            Expr::cust("(expires_at IS NULL OR expires_at > statement_timestamp())")
        }
        _ => api_key::Column::ExpiresAt
            .is_null()
            .or(api_key::Column::ExpiresAt.gt(db::now())),
    };
    let key = api_key::Entity::find()
        .filter(api_key::Column::TokenHash.eq(token_hash))
        .filter(api_key::Column::RevokedAt.is_null())
        .filter(unexpired)
        .one(db.conn())
        .await?
        .ok_or(Error::Unauthenticated)?;
    Ok(identity_of(key))
}

fn identity_of(key: api_key::Model) -> Identity {
    Identity {
        key_id: key.id,
        role: key.role,
        scope: scope_of(&key),
        tenant: key.tenant_id,
        expires_at: key.expires_at,
    }
}

/// The endpoints a key is limited to (empty for admins).
pub fn scope_of(key: &api_key::Model) -> Vec<Uuid> {
    key.endpoint_scope
        .as_ref()
        .and_then(|value| value.as_array())
        .map(|ids| {
            ids.iter()
                .filter_map(|id| id.as_str().and_then(|s| Uuid::parse_str(s).ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Extracts the token from `Bearer <token>` (scheme matched case-insensitively).
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// 32 random bytes, URL-safe base64, behind a recognisable prefix.
fn mint_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// SHA-256 of the token, hex. Tokens carry 256 bits of entropy, so a fast hash is enough.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_requires_a_token() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn tokens_are_random_and_hashes_are_stable_hex() {
        let a = mint_token();
        let b = mint_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(
            hash_token("courier_test"),
            "dfd54c08cc251013e97da6c77b68884009b5f0ed2b71cfebb0290ea2f5518d4f",
            "the hex SHA-256 of the token, as stored"
        );
        assert_eq!(hash_token(&a).len(), 64);
        assert_ne!(hash_token(&a), hash_token(&b));
    }
}
