//! Indexes for listings that stay on their index whatever the statistics say: each event
//! type's deliveries by creation time, so that a listing of one type in a time range reads
//! its page in the listing's order (not every delivery of the type, sorted after, nor every
//! delivery in the range for a type few have); and the failed indexes that lead with the
//! endpoint rewritten with the state as a range (`BETWEEN 'failed' AND 'failed'`), the
//! form in which statements about some endpoints say it, so that those statements can
//! read them and can never read the failed indexes of every endpoint (see
//! `service::deliveries::state_filter`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// One event type's deliveries in the order of a listing by time.
const EVENT_TYPE_CREATED: &str = "CREATE INDEX idx_webhook_deliveries_event_type_created \
     ON webhook_deliveries (event_type, created_at, id) WHERE event_type IS NOT NULL";

/// The failed indexes that lead with the endpoint: the name each had, its columns, and
/// the name it has in the range form.
const FAILED_BY_ENDPOINT: [(&str, &str, &str); 2] = [
    (
        "idx_webhook_deliveries_failed_by_endpoint",
        "endpoint_id, id",
        "idx_webhook_deliveries_endpoint_failed",
    ),
    (
        "idx_webhook_deliveries_failed_endpoint_created",
        "endpoint_id, created_at, id",
        "idx_webhook_deliveries_endpoint_failed_created",
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(EVENT_TYPE_CREATED).await?;
        for (old, columns, new) in FAILED_BY_ENDPOINT {
            db.execute_unprepared(&format!(
                "CREATE INDEX {new} ON webhook_deliveries ({columns}) \
                 WHERE state BETWEEN 'failed' AND 'failed'"
            ))
            .await?;
            db.execute_unprepared(&format!("DROP INDEX {old}")).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for (old, columns, new) in FAILED_BY_ENDPOINT {
            db.execute_unprepared(&format!(
                "CREATE INDEX {old} ON webhook_deliveries ({columns}) WHERE state = 'failed'"
            ))
            .await?;
            db.execute_unprepared(&format!("DROP INDEX {new}")).await?;
        }
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_event_type_created")
            .await?;
        Ok(())
    }
}
