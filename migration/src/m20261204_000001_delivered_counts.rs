//! Delivered counts per endpoint, kept in sharded rows instead of counted from history,
//! filled from the deliveries already there.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum EndpointDeliveredCounts {
    Table,
    EndpointId,
    Shard,
    Delivered,
}

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    Id,
}

/// The deliveries delivered so far, on shard 0. Run while no older process records
/// outcomes (start-up migrates before serving), the count starts exact.
const BACKFILL: &str = "INSERT INTO endpoint_delivered_counts (endpoint_id, shard, delivered) \
     SELECT endpoint_id, 0, COUNT(*) FROM webhook_deliveries WHERE state = 'delivered' \
     GROUP BY endpoint_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Each change into or out of `delivered` adds to one of an endpoint's shards, in
        // the transaction that makes it; the count is their sum.
        manager
            .create_table(
                Table::create()
                    .table(EndpointDeliveredCounts::Table)
                    .col(
                        ColumnDef::new(EndpointDeliveredCounts::EndpointId)
                            .uuid()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(EndpointDeliveredCounts::Shard)
                            .small_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(EndpointDeliveredCounts::Delivered)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .primary_key(
                        Index::create()
                            .col(EndpointDeliveredCounts::EndpointId)
                            .col(EndpointDeliveredCounts::Shard),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_endpoint_delivered_counts_endpoint")
                            .from(
                                EndpointDeliveredCounts::Table,
                                EndpointDeliveredCounts::EndpointId,
                            )
                            .to(Endpoints::Table, Endpoints::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(BACKFILL)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(EndpointDeliveredCounts::Table)
                    .to_owned(),
            )
            .await
    }
}
