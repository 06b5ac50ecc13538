//! The whole data model: endpoints, submissions, deliveries, attempts, rate-limit counters, API keys.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    Id,
    Name,
    Url,
    SigningSecret,
    Disabled,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Submissions {
    Table,
    Id,
    EndpointId,
    IdempotencyKey,
    Payload,
    PayloadHash,
    SubmittedBy,
    CreatedAt,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    SubmissionId,
    EndpointId,
    State,
    CycleAttempts,
    NextAttemptAt,
    ClaimToken,
    ClaimExpiresAt,
    LastError,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum DeliveryAttempts {
    Table,
    Id,
    DeliveryId,
    Number,
    ClaimToken,
    StartedAt,
    FinishedAt,
    StatusCode,
    Error,
    DurationMs,
    Superseded,
}

#[derive(DeriveIden)]
enum RateLimitCounters {
    Table,
    Limiter,
    Subject,
    WindowStart,
    Attempts,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Id,
    Name,
    Role,
    EndpointScope,
    TokenHash,
    CreatedAt,
    RevokedAt,
}

/// Serves the worker's "due" query: only rows that can still be claimed are indexed,
/// ordered the way claims take them. A `processing` row's `next_attempt_at` is its
/// lease expiry, so one index covers both fresh and abandoned work.
const DUE_INDEX: &str = "CREATE INDEX idx_webhook_deliveries_due \
     ON webhook_deliveries (next_attempt_at) \
     WHERE state IN ('pending', 'processing')";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Endpoints::Table)
                    .col(
                        ColumnDef::new(Endpoints::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Endpoints::Name).string_len(200).not_null())
                    .col(ColumnDef::new(Endpoints::Url).text().not_null())
                    .col(ColumnDef::new(Endpoints::SigningSecret).text().not_null())
                    .col(
                        ColumnDef::new(Endpoints::Disabled)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .col(timestamp(Endpoints::CreatedAt))
                    .col(timestamp(Endpoints::UpdatedAt))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Submissions::Table)
                    .col(
                        ColumnDef::new(Submissions::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Submissions::EndpointId).uuid().not_null())
                    .col(
                        ColumnDef::new(Submissions::IdempotencyKey)
                            .string_len(255)
                            .null(),
                    )
                    .col(
                        ColumnDef::new(Submissions::Payload)
                            .json_binary()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Submissions::PayloadHash)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(ColumnDef::new(Submissions::SubmittedBy).uuid().null())
                    .col(timestamp(Submissions::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_submissions_endpoint")
                            .from(Submissions::Table, Submissions::EndpointId)
                            .to(Endpoints::Table, Endpoints::Id),
                    )
                    .to_owned(),
            )
            .await?;
        // The authority on idempotency: NULL keys never collide (standard SQL on both backends).
        manager
            .create_index(
                Index::create()
                    .name("uq_submissions_endpoint_idempotency_key")
                    .table(Submissions::Table)
                    .col(Submissions::EndpointId)
                    .col(Submissions::IdempotencyKey)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(WebhookDeliveries::Table)
                    .col(
                        ColumnDef::new(WebhookDeliveries::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(WebhookDeliveries::SubmissionId)
                            .uuid()
                            .not_null()
                            .unique_key(),
                    )
                    .col(
                        ColumnDef::new(WebhookDeliveries::EndpointId)
                            .uuid()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(WebhookDeliveries::State)
                            .string_len(16)
                            .not_null()
                            .check(Expr::col(WebhookDeliveries::State).is_in([
                                "pending",
                                "processing",
                                "delivered",
                                "failed",
                            ])),
                    )
                    .col(
                        ColumnDef::new(WebhookDeliveries::CycleAttempts)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(WebhookDeliveries::NextAttemptAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(ColumnDef::new(WebhookDeliveries::ClaimToken).uuid().null())
                    .col(
                        ColumnDef::new(WebhookDeliveries::ClaimExpiresAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(ColumnDef::new(WebhookDeliveries::LastError).text().null())
                    .col(timestamp(WebhookDeliveries::CreatedAt))
                    .col(timestamp(WebhookDeliveries::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_webhook_deliveries_submission")
                            .from(WebhookDeliveries::Table, WebhookDeliveries::SubmissionId)
                            .to(Submissions::Table, Submissions::Id),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_webhook_deliveries_endpoint")
                            .from(WebhookDeliveries::Table, WebhookDeliveries::EndpointId)
                            .to(Endpoints::Table, Endpoints::Id),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(DUE_INDEX)
            .await?;
        // Dashboards list an endpoint's deliveries newest first.
        manager
            .create_index(
                Index::create()
                    .name("idx_webhook_deliveries_endpoint")
                    .table(WebhookDeliveries::Table)
                    .col(WebhookDeliveries::EndpointId)
                    .col(WebhookDeliveries::Id)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(DeliveryAttempts::Table)
                    .col(
                        ColumnDef::new(DeliveryAttempts::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(DeliveryAttempts::DeliveryId)
                            .uuid()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(DeliveryAttempts::Number)
                            .integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(DeliveryAttempts::ClaimToken)
                            .uuid()
                            .not_null(),
                    )
                    .col(timestamp(DeliveryAttempts::StartedAt))
                    .col(timestamp(DeliveryAttempts::FinishedAt))
                    .col(
                        ColumnDef::new(DeliveryAttempts::StatusCode)
                            .integer()
                            .null(),
                    )
                    .col(ColumnDef::new(DeliveryAttempts::Error).text().null())
                    .col(
                        ColumnDef::new(DeliveryAttempts::DurationMs)
                            .integer()
                            .null(),
                    )
                    .col(
                        ColumnDef::new(DeliveryAttempts::Superseded)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_delivery_attempts_delivery")
                            .from(DeliveryAttempts::Table, DeliveryAttempts::DeliveryId)
                            .to(WebhookDeliveries::Table, WebhookDeliveries::Id),
                    )
                    .to_owned(),
            )
            .await?;
        // Lifetime attempt numbers are unique per delivery, across cycles and claims.
        manager
            .create_index(
                Index::create()
                    .name("uq_delivery_attempts_delivery_number")
                    .table(DeliveryAttempts::Table)
                    .col(DeliveryAttempts::DeliveryId)
                    .col(DeliveryAttempts::Number)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RateLimitCounters::Table)
                    .col(
                        ColumnDef::new(RateLimitCounters::Limiter)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RateLimitCounters::Subject)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(timestamp(RateLimitCounters::WindowStart))
                    .col(
                        ColumnDef::new(RateLimitCounters::Attempts)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .primary_key(
                        Index::create()
                            .col(RateLimitCounters::Limiter)
                            .col(RateLimitCounters::Subject)
                            .col(RateLimitCounters::WindowStart),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ApiKeys::Table)
                    .col(ColumnDef::new(ApiKeys::Id).uuid().not_null().primary_key())
                    .col(ColumnDef::new(ApiKeys::Name).string_len(200).not_null())
                    .col(
                        ColumnDef::new(ApiKeys::Role)
                            .string_len(16)
                            .not_null()
                            .check(Expr::col(ApiKeys::Role).is_in(["admin", "partner"])),
                    )
                    .col(ColumnDef::new(ApiKeys::EndpointScope).json_binary().null())
                    .col(
                        ColumnDef::new(ApiKeys::TokenHash)
                            .string_len(64)
                            .not_null()
                            .unique_key(),
                    )
                    .col(timestamp(ApiKeys::CreatedAt))
                    .col(
                        ColumnDef::new(ApiKeys::RevokedAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            ApiKeys::Table.into_iden(),
            RateLimitCounters::Table.into_iden(),
            DeliveryAttempts::Table.into_iden(),
            WebhookDeliveries::Table.into_iden(),
            Submissions::Table.into_iden(),
            Endpoints::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        Ok(())
    }
}

/// A required UTC timestamp column.
fn timestamp<T: IntoIden>(name: T) -> ColumnDef {
    ColumnDef::new(name)
        .timestamp_with_time_zone()
        .not_null()
        .to_owned()
}
