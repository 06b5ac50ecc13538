//! SeaORM entities for Courier's tables; the migrations in `migration/` are the source of truth.

pub mod api_key;
pub mod delivery_attempt;
pub mod endpoint;
pub mod event;
pub mod rate_limit_counter;
pub mod submission;
pub mod tenant;
pub mod webhook_delivery;
