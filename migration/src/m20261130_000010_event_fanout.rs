//! Event types and fan-out: the endpoints' type filters, the `events` table, and the
//! link from each fanned-out submission to its event.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    EventTypes,
}

#[derive(DeriveIden)]
enum Submissions {
    Table,
    EventId,
    EventType,
}

#[derive(DeriveIden)]
enum Events {
    Table,
    Id,
    EventType,
    IdempotencyKey,
    Payload,
    PayloadHash,
    PublishedBy,
    CreatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // The types an endpoint receives; an empty array means every type.
        manager
            .alter_table(
                Table::alter()
                    .table(Endpoints::Table)
                    .add_column(
                        ColumnDef::new(Endpoints::EventTypes)
                            .json_binary()
                            .not_null()
                            .default(Expr::cust("'[]'")),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Events::Table)
                    .col(ColumnDef::new(Events::Id).uuid().not_null().primary_key())
                    .col(ColumnDef::new(Events::EventType).string_len(255).not_null())
                    .col(
                        ColumnDef::new(Events::IdempotencyKey)
                            .string_len(255)
                            .null(),
                    )
                    .col(ColumnDef::new(Events::Payload).json_binary().not_null())
                    .col(
                        ColumnDef::new(Events::PayloadHash)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(ColumnDef::new(Events::PublishedBy).uuid().not_null())
                    .col(
                        ColumnDef::new(Events::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        // The authority on publish idempotency: one event per API key and key (NULL keys
        // never collide).
        manager
            .create_index(
                Index::create()
                    .name("uq_events_publisher_idempotency_key")
                    .table(Events::Table)
                    .col(Events::PublishedBy)
                    .col(Events::IdempotencyKey)
                    .unique()
                    .to_owned(),
            )
            .await?;

        // SQLite adds one column per statement.
        manager
            .alter_table(
                Table::alter()
                    .table(Submissions::Table)
                    .add_column(ColumnDef::new(Submissions::EventId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Submissions::Table)
                    .add_column(
                        ColumnDef::new(Submissions::EventType)
                            .string_len(255)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_submissions_event")
                    .table(Submissions::Table)
                    .col(Submissions::EventId)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
