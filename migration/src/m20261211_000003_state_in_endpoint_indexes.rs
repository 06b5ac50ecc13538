//! An endpoint's indexes (by id, and by creation time) carry each delivery's state after
//! the order's columns, so a listing of one endpoint's deliveries in one state checks the
//! state in the index and reads from the table only the rows it returns. Without it, the
//! `DELIVERED` deliveries of an endpoint that mostly fails (a receiver down for weeks) were
//! found by reading every one of its deliveries from the table. The entries are a few
//! bytes longer, and no more numerous: a delivery's new state is a new row version, which
//! every index takes an entry for anyway. On PostgreSQL, statistics of endpoints and
//! states together tell the planner how an endpoint's deliveries are spread over the
//! states, so it does not walk the newest deliveries of everyone expecting to meet that
//! endpoint's delivered ones soon (its statistics of each column alone cannot tell it
//! that one endpoint has none).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const BY_ID: &str = "CREATE INDEX idx_webhook_deliveries_endpoint_state \
     ON webhook_deliveries (endpoint_id, id, state)";
const BY_TIME: &str = "CREATE INDEX idx_webhook_deliveries_endpoint_created_state \
     ON webhook_deliveries (endpoint_id, created_at, id, state)";

/// Endpoints and states counted together (read by ANALYZE, as autovacuum runs it).
const STATISTICS: &str = "CREATE STATISTICS webhook_deliveries_endpoint_state (mcv) \
     ON endpoint_id, state FROM webhook_deliveries";

/// The indexes they replace.
const OLD_BY_ID: &str = "CREATE INDEX idx_webhook_deliveries_endpoint \
     ON webhook_deliveries (endpoint_id, id)";
const OLD_BY_TIME: &str = "CREATE INDEX idx_webhook_deliveries_endpoint_created \
     ON webhook_deliveries (endpoint_id, created_at, id)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        // New names rather than the old ones dropped and made again: on SQLite each
        // statement may run on another pooled connection.
        db.execute_unprepared(BY_ID).await?;
        db.execute_unprepared(BY_TIME).await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_endpoint")
            .await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_endpoint_created")
            .await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(STATISTICS).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared("DROP STATISTICS IF EXISTS webhook_deliveries_endpoint_state")
                .await?;
        }
        db.execute_unprepared(OLD_BY_ID).await?;
        db.execute_unprepared(OLD_BY_TIME).await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_endpoint_state")
            .await?;
        db.execute_unprepared("DROP INDEX idx_webhook_deliveries_endpoint_created_state")
            .await?;
        Ok(())
    }
}
