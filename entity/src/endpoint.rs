//! `endpoints`: where a partner's webhooks go, and the secret they are signed with.

use sea_orm::entity::prelude::*;

/// One webhook destination.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "endpoints")]
pub struct Model {
    /// Time-ordered (v7) id, so keyset pages follow creation order.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Human-readable label.
    pub name: String,
    /// The webhook URL deliveries are POSTed to.
    pub url: String,
    /// `whsec_<base64>`, sealed when an encryption key is configured; read at send time so
    /// a rotation applies to the next attempt.
    pub signing_secret: String,
    /// The secret a rotation replaced, still signing (beside the new one) until
    /// `previous_secret_expires_at`; sealed like `signing_secret`.
    pub previous_signing_secret: Option<String>,
    /// When the previous secret stops signing.
    pub previous_secret_expires_at: Option<DateTimeUtc>,
    /// Disabled endpoints accept no submissions and get no deliveries.
    pub disabled: bool,
    /// Why it is disabled (`MANUAL`, `GONE`, `FAILING`); NULL while enabled.
    pub disabled_reason: Option<String>,
    /// When it was disabled; NULL while enabled.
    pub disabled_at: Option<DateTimeUtc>,
    /// Deliveries that ended `failed` since the last one delivered.
    pub consecutive_failures: i32,
    /// When the endpoint was created.
    pub created_at: DateTimeUtc,
    /// When the endpoint was last changed.
    pub updated_at: DateTimeUtc,
    /// The event types `publish` delivers here, as a JSON array of strings; empty: every type.
    pub event_types: Json,
    /// Requests in flight to it at once, across every process; NULL: the configured default.
    pub max_in_flight: Option<i32>,
    /// Request starts per second, across every process; NULL: unlimited.
    pub rate_limit: Option<i32>,
    /// Until when a `429`/`503` with `Retry-After` holds every delivery back (database time).
    pub paused_until: Option<DateTimeUtc>,
    /// The tenant it belongs to, fixed at creation; `None`: no tenant (admins' only).
    pub tenant_id: Option<Uuid>,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
