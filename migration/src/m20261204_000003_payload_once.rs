//! A published event's payload stored once: the submissions it fanned out to keep a JSON
//! null in its place (the event holds the payload), here for those already there too.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Every fan-out submission whose event is there gives up its copy.
const UP: &str = "UPDATE submissions SET payload = 'null' \
     WHERE event_id IS NOT NULL AND EXISTS (SELECT 1 FROM events e WHERE e.id = submissions.event_id)";

/// Each takes its copy back from its event.
const DOWN: &str = "UPDATE submissions SET payload = \
     (SELECT e.payload FROM events e WHERE e.id = submissions.event_id) \
     WHERE event_id IS NOT NULL AND EXISTS (SELECT 1 FROM events e WHERE e.id = submissions.event_id)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(UP).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(DOWN).await?;
        Ok(())
    }
}
