//! Failed deliveries indexed with their endpoint beside the id, so a listing of one
//! endpoint's (or one partner's) failures checks the endpoint in the index and reads from
//! the table only the rows it returns, whichever of the two failed indexes the planner picks;
//! and the plain index on a delivery's submission dropped, since the unique constraint on
//! the same column already is one (every delivery wrote both).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Failed deliveries in id order, each entry carrying its endpoint.
const FAILED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed_with_endpoint \
     ON webhook_deliveries (id, endpoint_id) WHERE state = 'failed'";

/// The index it replaces.
const OLD_FAILED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed \
     ON webhook_deliveries (id) WHERE state = 'failed'";

/// The index the unique constraint makes redundant.
const SUBMISSION_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_submission \
     ON webhook_deliveries (submission_id)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        // A new name rather than the old one dropped and made again: on SQLite each
        // statement may run on another pooled connection.
        db.execute_unprepared(FAILED_INDEX).await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_failed")
            .await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_submission")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(SUBMISSION_INDEX).await?;
        db.execute_unprepared(OLD_FAILED_INDEX).await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_failed_with_endpoint")
            .await?;
        Ok(())
    }
}
