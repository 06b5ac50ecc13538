//! Failed deliveries indexed with their endpoint beside the id, so a listing of one
//! endpoint's (or one partner's) failures checks the endpoint in the index and reads from
//! the table only the rows it returns, whichever of the two failed indexes the planner picks.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Failed deliveries in id order, each entry carrying its endpoint.
const FAILED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed \
     ON webhook_deliveries (id, endpoint_id) WHERE state = 'failed'";

/// The index it replaces.
const OLD_FAILED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed \
     ON webhook_deliveries (id) WHERE state = 'failed'";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_failed")
            .await?;
        db.execute_unprepared(FAILED_INDEX).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_failed")
            .await?;
        db.execute_unprepared(OLD_FAILED_INDEX).await?;
        Ok(())
    }
}
