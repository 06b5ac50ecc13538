//! Ordered delivery: a head that another delivery takes its line from (a replay or resend
//! submitted before it, while it only waited for its next retry) keeps the time of that
//! retry, and gets it back when the line is handed back to it, rather than being attempted
//! at once. Each hand-back that went at once spent an attempt of its cycle: a few replays
//! on a line whose head was failing sent that head to `FAILED` in seconds.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    ResumeAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // NULL (every existing row) means "at once", as before.
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(
                        ColumnDef::new(WebhookDeliveries::ResumeAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .drop_column(WebhookDeliveries::ResumeAt)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
