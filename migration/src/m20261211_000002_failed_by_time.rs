//! Failed deliveries indexed by creation time, overall and per endpoint, so that a listing
//! of the failures in a time range (an outage being recovered from) reads its page rather
//! than every failure of the endpoint, sorted after; and the failed index by id with the
//! endpoint beside it replaced by one by id alone. Listings of a set of endpoints read
//! each endpoint's page from its own index now, and with the endpoint beside the id, the
//! planner took that index for one endpoint's page too, reading every failure of every
//! endpoint (one receiver down for a month made every other endpoint's failures slow).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// One endpoint's failures in the order of a listing by time.
const FAILED_ENDPOINT_CREATED_INDEX: &str =
    "CREATE INDEX idx_webhook_deliveries_failed_endpoint_created \
     ON webhook_deliveries (endpoint_id, created_at, id) WHERE state = 'failed'";

/// Every failure in the order of a listing by time.
const FAILED_CREATED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed_created \
     ON webhook_deliveries (created_at, id) WHERE state = 'failed'";

/// Every failure in id order.
const FAILED_BY_ID_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_failed_by_id \
     ON webhook_deliveries (id) WHERE state = 'failed'";

/// The index the one above replaces.
const FAILED_WITH_ENDPOINT_INDEX: &str =
    "CREATE INDEX idx_webhook_deliveries_failed_with_endpoint \
     ON webhook_deliveries (id, endpoint_id) WHERE state = 'failed'";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for index in [
            FAILED_ENDPOINT_CREATED_INDEX,
            FAILED_CREATED_INDEX,
            FAILED_BY_ID_INDEX,
        ] {
            db.execute_unprepared(index).await?;
        }
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_failed_with_endpoint")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(FAILED_WITH_ENDPOINT_INDEX).await?;
        for index in [
            "idx_webhook_deliveries_failed_by_id",
            "idx_webhook_deliveries_failed_created",
            "idx_webhook_deliveries_failed_endpoint_created",
        ] {
            db.execute_unprepared(&format!("DROP INDEX {index}"))
                .await?;
        }
        Ok(())
    }
}
