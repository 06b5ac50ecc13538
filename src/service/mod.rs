//! Domain operations and their transactions. No GraphQL types here: resolvers call in, errors come out as [`crate::error::Error`].

pub mod access;
pub mod api_keys;
pub mod deliveries;
pub mod endpoints;
pub(crate) mod event_types;
pub mod flow;
pub mod lines;
pub mod operational;
pub mod pagination;
pub mod payload;
pub mod rate_limit;
pub mod recent_health;
pub mod rotation;
pub mod sealing;
pub mod submissions;
pub mod switch;
pub mod tenants;
pub mod time_range;
