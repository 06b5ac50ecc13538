//! The GraphQL schema: the checked-in SDL, subscriptions over both protocols (and at the
//! pace of thousands of changes a second), numbers kept exact end to end, arguments coerced
//! and literals validated before anything runs, where a field error leaves its `null`, and
//! objects whose every selection is left out, and `__typename` held to the rules.

mod coercion;
mod empty_selections;
mod exact_numbers;
mod field_errors;
mod field_order;
mod literals;
mod nested_reads;
mod pace;
mod root_fragments;
mod schema_drift;
mod subscriptions;
mod typename;
