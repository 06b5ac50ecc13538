//! Ordered delivery: the ordering key a submission (or a published event) carries, each delivery's place in its
//! line (the endpoint's deliveries with that key) and whether it waits behind the line's
//! head, and one row per line holding the line's counters.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderingLines {
    Table,
    EndpointId,
    OrderingKey,
    LastSeq,
    Open,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Submissions {
    Table,
    OrderingKey,
}

#[derive(DeriveIden)]
enum Events {
    Table,
    OrderingKey,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    OrderingKey,
    LineSeq,
    Waiting,
}

/// A line's unsettled deliveries in line order: the head (never waiting) and those waiting
/// behind it. A hand-off reads the first waiting one; the console reads the head.
const LINE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_line \
     ON webhook_deliveries (endpoint_id, ordering_key, line_seq) \
     WHERE ordering_key IS NOT NULL AND state IN ('pending', 'processing')";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(OrderingLines::Table)
                    .col(ColumnDef::new(OrderingLines::EndpointId).uuid().not_null())
                    .col(
                        ColumnDef::new(OrderingLines::OrderingKey)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(OrderingLines::LastSeq)
                            .big_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(OrderingLines::Open).integer().not_null())
                    .col(
                        ColumnDef::new(OrderingLines::UpdatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .primary_key(
                        Index::create()
                            .col(OrderingLines::EndpointId)
                            .col(OrderingLines::OrderingKey),
                    )
                    .to_owned(),
            )
            .await?;
        // SQLite adds one column per statement.
        manager
            .alter_table(
                Table::alter()
                    .table(Submissions::Table)
                    .add_column(
                        ColumnDef::new(Submissions::OrderingKey)
                            .string_len(255)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Events::Table)
                    .add_column(ColumnDef::new(Events::OrderingKey).string_len(255).null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    // `text`, not `varchar(255)` (the service checks the length): with no
                    // statistics PostgreSQL estimates a row's width from declared lengths,
                    // and a wider row made it sort a listing it should walk by index.
                    .add_column(ColumnDef::new(WebhookDeliveries::OrderingKey).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(
                        ColumnDef::new(WebhookDeliveries::LineSeq)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(
                        ColumnDef::new(WebhookDeliveries::Waiting)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(LINE_INDEX)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX idx_webhook_deliveries_line")
            .await?;
        for (table, column) in [
            (
                WebhookDeliveries::Table.into_iden(),
                WebhookDeliveries::Waiting.into_iden(),
            ),
            (
                WebhookDeliveries::Table.into_iden(),
                WebhookDeliveries::LineSeq.into_iden(),
            ),
            (
                WebhookDeliveries::Table.into_iden(),
                WebhookDeliveries::OrderingKey.into_iden(),
            ),
            (Events::Table.into_iden(), Events::OrderingKey.into_iden()),
            (
                Submissions::Table.into_iden(),
                Submissions::OrderingKey.into_iden(),
            ),
        ] {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        manager
            .drop_table(Table::drop().table(OrderingLines::Table).to_owned())
            .await
    }
}
