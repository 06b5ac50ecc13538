//! `rate_limit_counters`: fixed-window counters shared by every Courier process.

use sea_orm::entity::prelude::*;

/// One window's count for one subject of one limiter.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "rate_limit_counters")]
pub struct Model {
    /// Which limit this counts (e.g. `submit`).
    #[sea_orm(primary_key, auto_increment = false)]
    pub limiter: String,
    /// Who is counted (e.g. an API key id).
    #[sea_orm(primary_key, auto_increment = false)]
    pub subject: String,
    /// Start of the fixed window.
    #[sea_orm(primary_key, auto_increment = false)]
    pub window_start: DateTimeUtc,
    /// Requests counted in the window, admitted or not.
    pub attempts: i64,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
