//! `submissions`: each payload a partner submitted, with its idempotency key and content hash.

use sea_orm::entity::prelude::*;

/// One accepted submission.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "submissions")]
pub struct Model {
    /// Time-ordered (v7) id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The endpoint the payload is for.
    pub endpoint_id: Uuid,
    /// Unique per endpoint when present; NULL keys never collide.
    pub idempotency_key: Option<String>,
    /// The submitted JSON, delivered as the webhook body.
    pub payload: Json,
    /// SHA-256 (hex) of the payload's canonical form: "same content" for idempotency.
    pub payload_hash: String,
    /// The API key that submitted it.
    pub submitted_by: Option<Uuid>,
    /// When it was stored.
    pub created_at: DateTimeUtc,
    /// The event it fans out, when `publish` made it.
    pub event_id: Option<Uuid>,
    /// Its event type: the event's, or the label `submit` was given.
    pub event_type: Option<String>,
    /// The ordering key its delivery lines up by, if any.
    pub ordering_key: Option<String>,
    /// The W3C `traceparent` of the request that made it, when tracing was on.
    pub trace_context: Option<String>,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
