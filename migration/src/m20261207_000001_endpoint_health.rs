//! Endpoint health at a glance: per endpoint, minute and shard, the attempts recorded, how
//! many were answered 2xx, the slowest, and a latency histogram over fixed bounds.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum EndpointHealthMinutes {
    Table,
    EndpointId,
    Minute,
    Shard,
    Attempts,
    Succeeded,
    SlowestMs,
}

/// The histogram's buckets, `b0` (fastest) to `b10` (slower than the last bound).
const BUCKETS: usize = 11;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let mut table = Table::create();
        table
            .table(EndpointHealthMinutes::Table)
            .col(
                ColumnDef::new(EndpointHealthMinutes::EndpointId)
                    .uuid()
                    .not_null(),
            )
            .col(
                ColumnDef::new(EndpointHealthMinutes::Minute)
                    .timestamp_with_time_zone()
                    .not_null(),
            )
            .col(
                ColumnDef::new(EndpointHealthMinutes::Shard)
                    .small_integer()
                    .not_null(),
            )
            .col(
                ColumnDef::new(EndpointHealthMinutes::Attempts)
                    .big_integer()
                    .not_null(),
            )
            .col(
                ColumnDef::new(EndpointHealthMinutes::Succeeded)
                    .big_integer()
                    .not_null(),
            )
            .col(
                ColumnDef::new(EndpointHealthMinutes::SlowestMs)
                    .big_integer()
                    .not_null(),
            );
        for bucket in 0..BUCKETS {
            table.col(
                ColumnDef::new(Alias::new(format!("b{bucket}")))
                    .big_integer()
                    .not_null(),
            );
        }
        table.primary_key(
            Index::create()
                .col(EndpointHealthMinutes::EndpointId)
                .col(EndpointHealthMinutes::Minute)
                .col(EndpointHealthMinutes::Shard),
        );
        manager.create_table(table.to_owned()).await?;
        // Pruning the minutes that left the window reads them in time order.
        manager
            .create_index(
                Index::create()
                    .name("idx_endpoint_health_minutes_minute")
                    .table(EndpointHealthMinutes::Table)
                    .col(EndpointHealthMinutes::Minute)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(EndpointHealthMinutes::Table).to_owned())
            .await
    }
}
