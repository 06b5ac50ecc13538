//! Recording's lookup of a batch's earlier attempts as a function on PostgreSQL, so that
//! it is planned on every call, one index lookup per delivery, rather than once per
//! connection from whatever statistics the table had then.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Every attempt already recorded for the deliveries `ids`. A prepared statement keeps the
/// plan made when it was first run: with statistics taken while `delivery_attempts` was
/// nearly empty, that is a sequential scan per delivery, and without autovacuum it stays
/// one as the table grows to millions of rows. The body of a function with a `SET` clause
/// is never inlined into its caller and is planned on each call, here with sequential
/// scans ruled out; `OFFSET 0` keeps the lateral subquery from being flattened into a join
/// that walks the whole index.
const CREATE: &str = "\
CREATE FUNCTION courier_recorded_attempts(ids uuid[])
RETURNS TABLE (delivery_id uuid, claim_token uuid, number integer, superseded boolean)
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    SELECT i.id, a.claim_token, a.number, a.superseded
    FROM unnest(ids) AS i(id)
    CROSS JOIN LATERAL (
        SELECT d.claim_token, d.number, d.superseded FROM delivery_attempts d
        WHERE d.delivery_id = i.id OFFSET 0
    ) AS a
$$";

const DROP: &str = "DROP FUNCTION IF EXISTS courier_recorded_attempts(uuid[])";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite plans every statement it prepares afresh: it keeps its plain lookup.
        if manager.get_database_backend() == DbBackend::Postgres {
            manager.get_connection().execute_unprepared(CREATE).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager.get_connection().execute_unprepared(DROP).await?;
        }
        Ok(())
    }
}
