//! `events`: each typed event a sender published once, to be fanned out to every endpoint subscribed to its type.

use sea_orm::entity::prelude::*;

/// One published event.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "events")]
pub struct Model {
    /// Time-ordered (v7) id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The type endpoints subscribe to, e.g. `order.paid`.
    pub event_type: String,
    /// Unique per publishing API key when present; NULL keys never collide.
    pub idempotency_key: Option<String>,
    /// The published JSON, delivered as each webhook's body.
    pub payload: Json,
    /// SHA-256 (hex) of the payload's canonical form.
    pub payload_hash: String,
    /// The API key that published it.
    pub published_by: Uuid,
    /// When it was stored.
    pub created_at: DateTimeUtc,
    /// The ordering key each of its deliveries lines up by, if any.
    pub ordering_key: Option<String>,
    /// The W3C `traceparent` of the request that made it, when tracing was on.
    pub trace_context: Option<String>,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
