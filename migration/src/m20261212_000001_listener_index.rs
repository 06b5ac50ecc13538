//! The endpoints that listen for operational events (those listing a `courier.*` type in
//! `eventTypes`), indexed on their own (PostgreSQL): a recording that may announce a failure,
//! a pause or a disable locks them with the endpoints it writes, in one id order, and finds
//! them here instead of reading every endpoint.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Whether an endpoint (its row named `endpoints`, or unqualified) lists an operational
/// event type. The statements that look for listeners spell it exactly so, which is what
/// lets PostgreSQL use the index.
pub const LISTENS: &str = "event_types ?| ARRAY['courier.endpoint.disabled', \
     'courier.endpoint.enabled', 'courier.endpoint.paused', 'courier.delivery.failed']";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let sql = format!("CREATE INDEX idx_endpoints_listeners ON endpoints (id) WHERE {LISTENS}");
        manager.get_connection().execute_unprepared(&sql).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX IF EXISTS idx_endpoints_listeners")
            .await?;
        Ok(())
    }
}
