//! Events indexed by creation time and id, so that retention's sweep walks the expired
//! events in one order from where it stopped (by `(created_at, id)`), reading each once,
//! instead of reading again on every run the expired events that deliveries still hold.
//! It replaces the index by time alone, which it covers.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const EVENTS_IN_ORDER_INDEX: &str = "CREATE INDEX idx_events_created_id ON events (created_at, id)";

const EVENTS_CREATED_INDEX: &str = "CREATE INDEX idx_events_created ON events (created_at)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(EVENTS_IN_ORDER_INDEX).await?;
        db.execute_unprepared("DROP INDEX idx_events_created")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(EVENTS_CREATED_INDEX).await?;
        db.execute_unprepared("DROP INDEX idx_events_created_id")
            .await?;
        Ok(())
    }
}
