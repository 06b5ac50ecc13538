//! Outage recovery: what the receiver answered each attempt (the start of its body and its
//! headers), and the indexes behind bulk replay and listings by time.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum DeliveryAttempts {
    Table,
    ResponseBody,
    ResponseHeaders,
}

/// Bulk replay walks the failed deliveries in id order, all of them or one endpoint's:
/// only failed rows are indexed, so the walk never reads settled or pending history.
const FAILED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed \
     ON webhook_deliveries (id) WHERE state = 'failed'";

/// One endpoint's failed deliveries, in id order.
const FAILED_BY_ENDPOINT_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed_by_endpoint \
     ON webhook_deliveries (endpoint_id, id) WHERE state = 'failed'";

/// Listings by creation time (`createdAfter`, `createdBefore`).
const CREATED_INDEX: &str =
    "CREATE INDEX idx_webhook_deliveries_created ON webhook_deliveries (created_at)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Both nullable: attempts that got no response, and every attempt recorded before.
        for column in [
            DeliveryAttempts::ResponseBody,
            DeliveryAttempts::ResponseHeaders,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(DeliveryAttempts::Table)
                        .add_column(ColumnDef::new(column).text().null())
                        .to_owned(),
                )
                .await?;
        }
        let db = manager.get_connection();
        for sql in [FAILED_INDEX, FAILED_BY_ENDPOINT_INDEX, CREATED_INDEX] {
            db.execute_unprepared(sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for index in [
            "idx_webhook_deliveries_created",
            "idx_webhook_deliveries_failed_by_endpoint",
            "idx_webhook_deliveries_failed",
        ] {
            db.execute_unprepared(&format!("DROP INDEX {index}"))
                .await?;
        }
        for column in [
            DeliveryAttempts::ResponseHeaders,
            DeliveryAttempts::ResponseBody,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(DeliveryAttempts::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
