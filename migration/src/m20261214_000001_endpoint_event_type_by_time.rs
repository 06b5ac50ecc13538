//! An index for one endpoint's deliveries of one event type in a time range, in the order
//! of a listing by time: without it such a listing reads the endpoint's time index with
//! the type as a filter, a walk of the whole range for a type the endpoint seldom gets
//! (and of every endpoint of a tenant, for a tenant's listing of that type).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// One endpoint's deliveries of one event type, by creation time.
const ENDPOINT_EVENT_TYPE_CREATED: &str =
    "CREATE INDEX idx_webhook_deliveries_endpoint_event_type_created \
     ON webhook_deliveries (endpoint_id, event_type, created_at, id) \
     WHERE event_type IS NOT NULL";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(ENDPOINT_EVENT_TYPE_CREATED)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX idx_webhook_deliveries_endpoint_event_type_created")
            .await?;
        Ok(())
    }
}
