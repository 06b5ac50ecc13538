//! Courier's schema migrations: one ordered list, applied identically on PostgreSQL and SQLite.

pub use sea_orm_migration::prelude::*;

pub use m20261212_000001_listener_index::LISTENS;

mod m20261130_000001_create_tables;
mod m20261130_000010_event_fanout;
mod m20261201_000001_endpoint_lifecycle;
mod m20261202_000001_flow_control;
mod m20261203_000001_outage_recovery;
mod m20261204_000001_settled_counts;
mod m20261204_000002_listing_indexes;
mod m20261204_000003_payload_once;
mod m20261204_000004_failed_listing;
mod m20261205_000001_tenants;
mod m20261206_000001_ordering_lines;
mod m20261207_000001_endpoint_health;
mod m20261208_000001_trace_context;
mod m20261209_000001_line_bounds;
mod m20261210_000001_recorded_attempts;
mod m20261211_000001_events_by_time;
mod m20261211_000002_failed_by_time;
mod m20261211_000003_state_in_endpoint_indexes;
mod m20261212_000001_listener_index;
mod m20261213_000001_listings_in_order;
mod m20261214_000001_endpoint_event_type_by_time;
mod m20261215_000001_held_retry;

/// The ordered list of Courier's migrations.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_tables::Migration),
            Box::new(m20261130_000010_event_fanout::Migration),
            Box::new(m20261201_000001_endpoint_lifecycle::Migration),
            Box::new(m20261202_000001_flow_control::Migration),
            Box::new(m20261203_000001_outage_recovery::Migration),
            Box::new(m20261204_000001_settled_counts::Migration),
            Box::new(m20261204_000002_listing_indexes::Migration),
            Box::new(m20261204_000003_payload_once::Migration),
            Box::new(m20261204_000004_failed_listing::Migration),
            Box::new(m20261205_000001_tenants::Migration),
            Box::new(m20261206_000001_ordering_lines::Migration),
            Box::new(m20261207_000001_endpoint_health::Migration),
            Box::new(m20261208_000001_trace_context::Migration),
            Box::new(m20261209_000001_line_bounds::Migration),
            Box::new(m20261210_000001_recorded_attempts::Migration),
            Box::new(m20261211_000001_events_by_time::Migration),
            Box::new(m20261211_000002_failed_by_time::Migration),
            Box::new(m20261211_000003_state_in_endpoint_indexes::Migration),
            Box::new(m20261212_000001_listener_index::Migration),
            Box::new(m20261213_000001_listings_in_order::Migration),
            Box::new(m20261214_000001_endpoint_event_type_by_time::Migration),
            Box::new(m20261215_000001_held_retry::Migration),
        ]
    }
}
