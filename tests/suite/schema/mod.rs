//! The GraphQL schema: the checked-in SDL, subscriptions over both protocols, and numbers
//! kept exact end to end.

mod exact_numbers;
mod schema_drift;
mod subscriptions;
