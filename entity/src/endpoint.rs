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
    /// `whsec_<base64>`; read at send time so a rotation applies to the next attempt.
    pub signing_secret: String,
    /// Disabled endpoints accept no submissions and get no deliveries.
    pub disabled: bool,
    /// When the endpoint was created.
    pub created_at: DateTimeUtc,
    /// When the endpoint was last changed.
    pub updated_at: DateTimeUtc,
    /// The event types `publish` delivers here, as a JSON array of strings; empty: every type.
    pub event_types: Json,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
