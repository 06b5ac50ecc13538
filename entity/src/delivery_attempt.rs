//! `delivery_attempts`: every HTTP attempt ever made for a delivery, numbered for its lifetime.

use sea_orm::entity::prelude::*;

/// One recorded attempt.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "delivery_attempts")]
pub struct Model {
    /// Time-ordered (v7) id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The delivery attempted.
    pub delivery_id: Uuid,
    /// Lifetime number, unique per delivery, continuing across replays.
    pub number: i32,
    /// The claim that made the attempt.
    pub claim_token: Uuid,
    /// When the request started.
    pub started_at: DateTimeUtc,
    /// When the outcome was known.
    pub finished_at: DateTimeUtc,
    /// The HTTP status, when a response arrived.
    pub status_code: Option<i32>,
    /// Why the attempt failed, when it did.
    pub error: Option<String>,
    /// Wall time of the request in milliseconds.
    pub duration_ms: Option<i32>,
    /// True when a newer claim had taken the delivery before this result was recorded.
    pub superseded: bool,
    /// The first 4 KiB of what the receiver answered, as text; NULL without a response.
    pub response_body: Option<String>,
    /// The receiver's response headers as a JSON object text; NULL without a response.
    pub response_headers: Option<String>,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
