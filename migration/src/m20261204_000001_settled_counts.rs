//! Delivered and failed counts per endpoint, kept in sharded rows instead of counted from
//! history, filled from the deliveries already there.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum EndpointSettledCounts {
    Table,
    EndpointId,
    Shard,
    Delivered,
    Failed,
}

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    Id,
}

/// The deliveries delivered and failed so far, on shard 0. Run while no older process
/// records outcomes (start-up migrates before serving), the counts start exact.
const BACKFILL: &str =
    "INSERT INTO endpoint_settled_counts (endpoint_id, shard, delivered, failed) \
     SELECT endpoint_id, 0, \
            SUM(CASE WHEN state = 'delivered' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) \
     FROM webhook_deliveries WHERE state IN ('delivered', 'failed') GROUP BY endpoint_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Each change into or out of `delivered` or `failed` adds to one of an endpoint's
        // shards, in the transaction that makes it; a count is their sum.
        manager
            .create_table(
                Table::create()
                    .table(EndpointSettledCounts::Table)
                    .col(
                        ColumnDef::new(EndpointSettledCounts::EndpointId)
                            .uuid()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(EndpointSettledCounts::Shard)
                            .small_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(EndpointSettledCounts::Delivered)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(EndpointSettledCounts::Failed)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .primary_key(
                        Index::create()
                            .col(EndpointSettledCounts::EndpointId)
                            .col(EndpointSettledCounts::Shard),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_endpoint_settled_counts_endpoint")
                            .from(
                                EndpointSettledCounts::Table,
                                EndpointSettledCounts::EndpointId,
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
            .drop_table(Table::drop().table(EndpointSettledCounts::Table).to_owned())
            .await
    }
}
