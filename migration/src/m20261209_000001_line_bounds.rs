//! Ordered delivery at length: each line remembers from which number on a delivery can
//! still be waiting in it, so handing a line on seeks straight to its next delivery instead
//! of walking past every one it has settled.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderingLines {
    Table,
    WaitingFrom,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // NULL (every existing line) means "from the start": always a safe bound.
        manager
            .alter_table(
                Table::alter()
                    .table(OrderingLines::Table)
                    .add_column(
                        ColumnDef::new(OrderingLines::WaitingFrom)
                            .big_integer()
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
                    .table(OrderingLines::Table)
                    .drop_column(OrderingLines::WaitingFrom)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
