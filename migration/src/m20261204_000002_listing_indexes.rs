//! Listings that stay index-backed as history grows: work in progress by id, deliveries by
//! event type (the type kept on the delivery too, filled from the submissions already
//! there), by time in time order, and by submission (which retention's deletes check).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    EventType,
}

/// Pending and processing deliveries anywhere, newest first: only they are indexed.
const UNSETTLED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_unsettled \
     ON webhook_deliveries (id) WHERE state IN ('pending', 'processing')";

/// Deliveries of one event type, newest first.
const EVENT_TYPE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_event_type \
     ON webhook_deliveries (event_type, id) WHERE event_type IS NOT NULL";

/// One endpoint's deliveries of one event type, newest first.
const ENDPOINT_EVENT_TYPE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_endpoint_event_type \
     ON webhook_deliveries (endpoint_id, event_type, id) WHERE event_type IS NOT NULL";

/// Listings by time, ordered by it: all deliveries, and one endpoint's.
const CREATED_INDEX: &str =
    "CREATE INDEX idx_webhook_deliveries_created_id ON webhook_deliveries (created_at, id)";
const ENDPOINT_CREATED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_endpoint_created \
     ON webhook_deliveries (endpoint_id, created_at, id)";

/// A submission's delivery: reading an event's deliveries, and the check each deleted
/// submission makes that no delivery still refers to it.
const SUBMISSION_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_submission \
     ON webhook_deliveries (submission_id)";

/// Every delivery takes its submission's event type.
const BACKFILL: &str = "UPDATE webhook_deliveries SET event_type = \
     (SELECT s.event_type FROM submissions s WHERE s.id = webhook_deliveries.submission_id) \
     WHERE EXISTS (SELECT 1 FROM submissions s \
                   WHERE s.id = webhook_deliveries.submission_id AND s.event_type IS NOT NULL)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(ColumnDef::new(WebhookDeliveries::EventType).text().null())
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        for sql in [
            BACKFILL,
            UNSETTLED_INDEX,
            EVENT_TYPE_INDEX,
            ENDPOINT_EVENT_TYPE_INDEX,
            SUBMISSION_INDEX,
            // The time index of the recovery round becomes one that also orders.
            "DROP INDEX idx_webhook_deliveries_created",
            CREATED_INDEX,
            ENDPOINT_CREATED_INDEX,
        ] {
            db.execute_unprepared(sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for index in [
            "idx_webhook_deliveries_endpoint_created",
            "idx_webhook_deliveries_created_id",
            "idx_webhook_deliveries_submission",
            "idx_webhook_deliveries_endpoint_event_type",
            "idx_webhook_deliveries_event_type",
            "idx_webhook_deliveries_unsettled",
        ] {
            db.execute_unprepared(&format!("DROP INDEX {index}"))
                .await?;
        }
        db.execute_unprepared(
            "CREATE INDEX idx_webhook_deliveries_created ON webhook_deliveries (created_at)",
        )
        .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .drop_column(WebhookDeliveries::EventType)
                    .to_owned(),
            )
            .await
    }
}
