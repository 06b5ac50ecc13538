//! `webhook_deliveries`: the delivery state machine of one submission, with its claim lease.

use sea_orm::entity::prelude::*;

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum DeliveryState {
    /// Waiting for `next_attempt_at`.
    #[sea_orm(string_value = "pending")]
    Pending,
    /// Claimed by a worker until `claim_expires_at`.
    #[sea_orm(string_value = "processing")]
    Processing,
    /// A 2xx answer was recorded.
    #[sea_orm(string_value = "delivered")]
    Delivered,
    /// The cycle's attempts ran out; an operator may replay it.
    #[sea_orm(string_value = "failed")]
    Failed,
}

/// One delivery (exactly one per submission).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    /// Time-ordered (v7) id; also the stable `webhook-id` header.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The submission delivered (unique).
    pub submission_id: Uuid,
    /// Denormalised from the submission for filtering and claiming.
    pub endpoint_id: Uuid,
    /// Current state.
    pub state: DeliveryState,
    /// Attempts made in the current cycle (reset by a replay).
    pub cycle_attempts: i32,
    /// When the delivery is next due (for `processing`, when its lease runs out).
    pub next_attempt_at: Option<DateTimeUtc>,
    /// The token of the claim currently allowed to record a result.
    pub claim_token: Option<Uuid>,
    /// When the current claim's lease expires.
    pub claim_expires_at: Option<DateTimeUtc>,
    /// The last attempt's error, if it failed.
    pub last_error: Option<String>,
    /// When the delivery was created.
    pub created_at: DateTimeUtc,
    /// When the delivery last changed.
    pub updated_at: DateTimeUtc,
    /// Its submission's event type, kept here too so listings by type read one index.
    pub event_type: Option<String>,
    /// Its submission's ordering key: deliveries to one endpoint with one key form a line,
    /// attempted one at a time in line order.
    pub ordering_key: Option<String>,
    /// Its place in its line (assigned under the line's row lock, so in commit order).
    pub line_seq: Option<i64>,
    /// Whether it waits behind its line's head (and so has no due time until handed the line).
    pub waiting: bool,
}

/// No relations are navigated through SeaORM; joins are explicit queries.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
