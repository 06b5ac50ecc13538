//! `api_keys`: who may call the API; only a hash of each token is kept.

use sea_orm::entity::prelude::*;

/// What an API key may do (the stored value is constrained to these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum Role {
    /// Everything.
    #[sea_orm(string_value = "admin")]
    Admin,
    /// Submit to and read only the endpoints in its scope.
    #[sea_orm(string_value = "partner")]
    Partner,
}

/// One API key.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    /// Time-ordered (v7) id; also the rate-limit subject.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Label chosen by the operator.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// For partners limited to a list: JSON array of endpoint ids the key may use.
    pub endpoint_scope: Option<Json>,
    /// For partners of a tenant: the tenant whose endpoints (all of them, including ones
    /// created later) the key may use and manage.
    pub tenant_id: Option<Uuid>,
    /// When the key stops authenticating (a portal link's); `None`: never.
    pub expires_at: Option<DateTimeUtc>,
    /// SHA-256 (hex) of the token.
    #[sea_orm(unique)]
    pub token_hash: String,
    /// When the key was created.
    pub created_at: DateTimeUtc,
    /// When the key was revoked; revoked keys authenticate nothing.
    pub revoked_at: Option<DateTimeUtc>,
    /// When the key last authenticated a request, to within about a minute.
    pub last_used_at: Option<DateTimeUtc>,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
