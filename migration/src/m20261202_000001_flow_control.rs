//! Fair share and flow control per endpoint: each endpoint's in-flight cap, rate limit and
//! `Retry-After` pause, the `endpoint_flow` row that claims take turns on, and the indexes
//! that keep a claim's per-endpoint questions index lookups.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    Id,
    MaxInFlight,
    RateLimit,
    PausedUntil,
}

#[derive(DeriveIden)]
enum EndpointFlow {
    Table,
    EndpointId,
    TurnAt,
    RateTat,
    BlockedUntil,
    ServedAt,
}

fn moment(column: EndpointFlow) -> ColumnDef {
    ColumnDef::new(column)
        .timestamp_with_time_zone()
        .null()
        .to_owned()
}

/// The round robin's order: ready endpoints, longest waiting first.
const TURN_INDEX: &str =
    "CREATE INDEX idx_endpoint_flow_turn ON endpoint_flow (turn_at) WHERE turn_at IS NOT NULL";

/// Every endpoint already there gets its row; a worker's first sweep makes those with due
/// work ready.
const BACKFILL_FLOW: &str = "INSERT INTO endpoint_flow (endpoint_id) SELECT id FROM endpoints";

/// Claims take one endpoint's due rows in due order: the due index leads with the endpoint.
const DUE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_due_by_endpoint \
     ON webhook_deliveries (endpoint_id, next_attempt_at) \
     WHERE state IN ('pending', 'processing')";

/// What is in flight to one endpoint: its `processing` rows whose lease still runs
/// (a `processing` row's `next_attempt_at` is its lease expiry).
const IN_FLIGHT_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_in_flight \
     ON webhook_deliveries (endpoint_id, next_attempt_at) \
     WHERE state = 'processing'";

const OLD_DUE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_due \
     ON webhook_deliveries (next_attempt_at) \
     WHERE state IN ('pending', 'processing')";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [
            ColumnDef::new(Endpoints::MaxInFlight)
                .integer()
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::RateLimit)
                .integer()
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::PausedUntil)
                .timestamp_with_time_zone()
                .null()
                .to_owned(),
        ];
        for mut column in columns {
            manager
                .alter_table(
                    Table::alter()
                        .table(Endpoints::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        // One row per endpoint: where it stands in the claims' round robin (`turn_at`: ready
        // once passed, longest waiting first; NULL: nothing known to be due), when a claim
        // last took from it (a woken endpoint takes its place by that), its rate limiter's
        // theoretical arrival time (GCRA), and until when a pause or the rate limit holds it
        // back. Claims lock it `FOR UPDATE SKIP LOCKED`, so claims for one endpoint take
        // turns across processes.
        manager
            .create_table(
                Table::create()
                    .table(EndpointFlow::Table)
                    .col(
                        ColumnDef::new(EndpointFlow::EndpointId)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(moment(EndpointFlow::TurnAt))
                    .col(moment(EndpointFlow::RateTat))
                    .col(moment(EndpointFlow::BlockedUntil))
                    .col(moment(EndpointFlow::ServedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_endpoint_flow_endpoint")
                            .from(EndpointFlow::Table, EndpointFlow::EndpointId)
                            .to(Endpoints::Table, Endpoints::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        for sql in [
            TURN_INDEX,
            BACKFILL_FLOW,
            "DROP INDEX idx_webhook_deliveries_due",
            DUE_INDEX,
            IN_FLIGHT_INDEX,
        ] {
            db.execute_unprepared(sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for sql in [
            "DROP INDEX idx_webhook_deliveries_in_flight",
            "DROP INDEX idx_webhook_deliveries_due_by_endpoint",
            OLD_DUE_INDEX,
        ] {
            db.execute_unprepared(sql).await?;
        }
        manager
            .drop_table(Table::drop().table(EndpointFlow::Table).to_owned())
            .await?;
        for column in [
            Endpoints::PausedUntil,
            Endpoints::RateLimit,
            Endpoints::MaxInFlight,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Endpoints::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
