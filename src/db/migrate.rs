//! Applying migrations: one process at a time across processes (an advisory lock), given
//! up on a database gone silent, and a schema this version does not know told for what it
//! is.

use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use super::{availability, Db};

/// Arbitrary constant naming the advisory lock that serialises migrations across processes.
pub const MIGRATION_LOCK_KEY: i64 = 0x0063_6f75_7269_6572; // "courier" in ASCII

/// How many acquire timeouts migrations wait on a database out of reach before giving up.
pub const MIGRATION_GIVES_UP_AFTER: u32 = 10;

impl Db {
    /// Applies pending migrations. Safe to run from several processes at once:
    /// on PostgreSQL an advisory transaction lock makes later runs wait and then find nothing to do.
    /// There, a database that stays out of reach for [`MIGRATION_GIVES_UP_AFTER`] times the
    /// acquire timeout ends them with an error: a statement on a connection gone silent
    /// would otherwise wait for ever (no keepalive notices it), printing nothing.
    pub async fn migrate(&self) -> Result<(), DbErr> {
        if self.backend() != DbBackend::Postgres {
            return self.migrate_unwatched().await;
        }
        let options = self.conn.get_postgres_connection_pool().connect_options();
        let limit = self.timeouts.acquire * MIGRATION_GIVES_UP_AFTER;
        tokio::select! {
            migrated = self.migrate_unwatched() => migrated,
            why = availability::out_of_reach_for((*options).clone(), self.timeouts, limit) => {
                Err(DbErr::Conn(sea_orm::RuntimeErr::Internal(format!(
                    "the database stopped answering while migrations ran, and was still out \
                     of reach after {} s ({why}); nothing was applied, and the next run \
                     starts again",
                    limit.as_secs()
                ))))
            }
        }
    }

    /// [`Db::migrate`], with nothing watching for a database gone silent.
    async fn migrate_unwatched(&self) -> Result<(), DbErr> {
        let txn = self.begin_write().await?;
        if self.backend() == DbBackend::Postgres {
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_advisory_xact_lock($1)",
                [MIGRATION_LOCK_KEY.into()],
            ))
            .await?;
        }
        Migrator::up(&txn, None).await.map_err(newer_schema)?;
        txn.commit().await
    }
}

/// Migrations' own word for a database migrated by a later version (one it holds as
/// applied that this version does not know), told as what it means: run a later version.
fn newer_schema(err: DbErr) -> DbErr {
    let DbErr::Custom(message) = &err else {
        return err;
    };
    let unknown: Vec<&str> = message
        .lines()
        .filter(|line| line.ends_with("this migration has been applied but its file is missing"))
        .filter_map(|line| line.split('\'').nth(1))
        .collect();
    if unknown.is_empty() {
        return err;
    }
    // A later Courier names its migrations after this one's last; anything else was applied
    // by another application sharing the database.
    let last = Migrator::migrations()
        .iter()
        .map(|migration| migration.name().to_owned())
        .max()
        .unwrap_or_default();
    if unknown
        .iter()
        .all(|name| name.starts_with("m20") && **name > *last)
    {
        return DbErr::Custom(format!(
            "the database's schema is newer than this version of Courier (it has migration {} \
             applied, which this version does not know): run the version that migrated it, or a \
             later one",
            unknown.join(", ")
        ));
    }
    DbErr::Custom(format!(
        "the database holds migrations Courier never wrote ({}): it looks like another \
         application's database; give Courier a database of its own in DATABASE_URL",
        unknown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_from_a_later_version_is_told_as_such() {
        let told = newer_schema(DbErr::Custom(
            "Migration file of version 'm20991231_000001_later' is missing, this migration has \
             been applied but its file is missing"
                .to_owned(),
        ))
        .to_string();
        assert!(
            told.contains("newer than this version of Courier"),
            "{told}"
        );
        assert!(told.contains("m20991231_000001_later"), "{told}");
        let foreign = newer_schema(DbErr::Custom(
            "Migration file of version 'create_users' is missing, this migration has been \
             applied but its file is missing"
                .to_owned(),
        ))
        .to_string();
        assert!(
            foreign.contains("another application's database"),
            "{foreign}"
        );
        let other = newer_schema(DbErr::Custom("something else".to_owned())).to_string();
        assert!(other.contains("something else"), "{other}");
    }
}
