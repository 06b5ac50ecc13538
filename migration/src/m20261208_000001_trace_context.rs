//! Tracing: the W3C trace context (`traceparent`) of the `submit` or `publish` that made
//! a submission or an event, so each delivery attempt's span can link back to it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Submissions {
    Table,
    TraceContext,
}

#[derive(DeriveIden)]
enum Events {
    Table,
    TraceContext,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // `text`, NULL unless tracing was on: nothing is stored, and no row grows, without it.
        manager
            .alter_table(
                Table::alter()
                    .table(Submissions::Table)
                    .add_column(ColumnDef::new(Submissions::TraceContext).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Events::Table)
                    .add_column(ColumnDef::new(Events::TraceContext).text().null())
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Events::Table)
                    .drop_column(Events::TraceContext)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Submissions::Table)
                    .drop_column(Submissions::TraceContext)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
