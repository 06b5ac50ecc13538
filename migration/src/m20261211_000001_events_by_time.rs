//! Events indexed by creation time, so that retention finds the expired ones without
//! reading every event on each run.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const EVENTS_CREATED_INDEX: &str = "CREATE INDEX idx_events_created ON events (created_at)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(EVENTS_CREATED_INDEX)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX idx_events_created")
            .await?;
        Ok(())
    }
}
