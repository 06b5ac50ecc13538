//! Tenants: the customers endpoints are grouped by, the tenant an endpoint belongs to, the
//! tenant a partner key speaks for, and the moment a key (a portal link's) expires.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    Name,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Endpoints {
    Table,
    TenantId,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    TenantId,
    ExpiresAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Tenants::Table)
                    .col(ColumnDef::new(Tenants::Id).uuid().not_null().primary_key())
                    .col(ColumnDef::new(Tenants::Name).string_len(200).not_null())
                    .col(
                        ColumnDef::new(Tenants::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        // SQLite adds one column per statement. Tenants are never deleted and an endpoint
        // never changes tenant, so the service's existence check at creation is the whole
        // integrity rule (SQLite cannot add a foreign key to an existing table).
        manager
            .alter_table(
                Table::alter()
                    .table(Endpoints::Table)
                    .add_column(ColumnDef::new(Endpoints::TenantId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(ColumnDef::new(ApiKeys::TenantId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(
                        ColumnDef::new(ApiKeys::ExpiresAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        // A tenant's endpoints, in id order (its listing and its keys' scope).
        manager
            .create_index(
                Index::create()
                    .name("idx_endpoints_tenant")
                    .table(Endpoints::Table)
                    .col(Endpoints::TenantId)
                    .col(Alias::new("id"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name("idx_endpoints_tenant").to_owned())
            .await?;
        for (table, column) in [
            (ApiKeys::Table.into_iden(), ApiKeys::ExpiresAt.into_iden()),
            (ApiKeys::Table.into_iden(), ApiKeys::TenantId.into_iden()),
            (
                Endpoints::Table.into_iden(),
                Endpoints::TenantId.into_iden(),
            ),
        ] {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        manager
            .drop_table(Table::drop().table(Tenants::Table).to_owned())
            .await
    }
}
