//! Endpoint and key lifecycle: secret rotation with overlap, why and when an endpoint was
//! disabled, its run of failed deliveries, when each API key was last used, and the index
//! retention prunes by.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    PreviousSigningSecret,
    PreviousSecretExpiresAt,
    DisabledReason,
    DisabledAt,
    ConsecutiveFailures,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    LastUsedAt,
}

/// Serves retention: settled deliveries ordered by when they settled (their last change).
const SETTLED_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_settled \
     ON webhook_deliveries (updated_at) \
     WHERE state IN ('delivered', 'failed')";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite's ALTER TABLE adds one at a time.
        let endpoint_columns = [
            ColumnDef::new(Endpoints::PreviousSigningSecret)
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::PreviousSecretExpiresAt)
                .timestamp_with_time_zone()
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::DisabledReason)
                .string_len(16)
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::DisabledAt)
                .timestamp_with_time_zone()
                .null()
                .to_owned(),
            ColumnDef::new(Endpoints::ConsecutiveFailures)
                .integer()
                .not_null()
                .default(0)
                .to_owned(),
        ];
        for mut column in endpoint_columns {
            manager
                .alter_table(
                    Table::alter()
                        .table(Endpoints::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        // Endpoints disabled before reasons existed were disabled by an operator.
        manager
            .get_connection()
            .execute_unprepared(
                "UPDATE endpoints SET disabled_reason = 'MANUAL', disabled_at = updated_at \
                 WHERE disabled",
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(
                        ColumnDef::new(ApiKeys::LastUsedAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(SETTLED_INDEX)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX idx_webhook_deliveries_settled")
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .drop_column(ApiKeys::LastUsedAt)
                    .to_owned(),
            )
            .await?;
        for column in [
            Endpoints::ConsecutiveFailures,
            Endpoints::DisabledAt,
            Endpoints::DisabledReason,
            Endpoints::PreviousSecretExpiresAt,
            Endpoints::PreviousSigningSecret,
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
