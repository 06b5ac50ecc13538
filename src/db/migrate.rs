//! Applying migrations: one process at a time across processes (an advisory lock), never
//! holding up live traffic for long behind a table lock they wait for, given up on a
//! database gone silent, and a schema this version does not know told for what it is.

use std::time::{Duration, Instant};

use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use super::classify::sqlx_cause;
use super::{availability, Db};

/// Arbitrary constant naming the advisory lock that serialises migrations across processes.
pub const MIGRATION_LOCK_KEY: i64 = 0x0063_6f75_7269_6572; // "courier" in ASCII

/// How many acquire timeouts migrations wait on a database out of reach before giving up.
pub const MIGRATION_GIVES_UP_AFTER: u32 = 10;

/// How long one try at the migrations waits for a lock on a table (PostgreSQL's
/// `lock_timeout`). A table change waits for every transaction using the table to end,
/// and every statement on the table that comes after it queues behind it meanwhile: a
/// long transaction elsewhere (a report, a backup) would otherwise hold up a live
/// deployment's traffic for as long as it runs. So a try that waits longer is rolled back,
/// the traffic goes on, and the migrations try again.
pub const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(1);

/// How long migrations keep trying to take the table locks they need before giving up.
pub const MIGRATION_LOCKS_TRIED_FOR: Duration = Duration::from_secs(600);

/// PostgreSQL's SQLSTATE for a lock not taken within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

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

    /// [`Db::migrate`], with nothing watching for a database gone silent: tries again,
    /// after a pause, while a try gives up waiting for a table lock (see
    /// [`MIGRATION_LOCK_WAIT`]), for up to [`MIGRATION_LOCKS_TRIED_FOR`].
    async fn migrate_unwatched(&self) -> Result<(), DbErr> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(250);
        loop {
            match self.migrate_once().await {
                Err(err) if waited_for_a_lock(&err) => {
                    if started.elapsed() >= MIGRATION_LOCKS_TRIED_FOR {
                        return Err(DbErr::Custom(format!(
                            "migrations could not take the table locks they need for {} s: \
                             other sessions kept Courier's tables in use (pg_stat_activity \
                             shows which); nothing was applied, and the next run starts again",
                            MIGRATION_LOCKS_TRIED_FOR.as_secs()
                        )));
                    }
                    tracing::warn!(
                        waited_ms = MIGRATION_LOCK_WAIT.as_millis() as u64,
                        retry_in_ms = pause.as_millis() as u64,
                        "migrations waited for a table another session is using; rolled back so \
                         as not to hold up its traffic, trying again"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                done => return done,
            }
        }
    }

    /// One try at the migrations, in one transaction: on PostgreSQL, with the migration
    /// lock held and table locks waited for at most [`MIGRATION_LOCK_WAIT`].
    async fn migrate_once(&self) -> Result<(), DbErr> {
        let txn = self.begin_write().await?;
        if self.backend() == DbBackend::Postgres {
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_advisory_xact_lock($1)",
                [MIGRATION_LOCK_KEY.into()],
            ))
            .await?;
            // After the migration lock, which waits for another process's migrations as
            // long as they take.
            txn.execute_unprepared(&format!(
                "SET LOCAL lock_timeout = '{}ms'",
                MIGRATION_LOCK_WAIT.as_millis()
            ))
            .await?;
        }
        Migrator::up(&txn, None)
            .await
            .map_err(newer_schema)
            .map_err(foreign_object)?;
        txn.commit().await
    }
}

/// A migration refused because the database already holds a table, index or type of the
/// name it creates (PostgreSQL's `42P07` and `42710`, SQLite's "already exists"), told as
/// what it means: the database is not Courier's alone. (Courier's own half-done work
/// cannot leave one: the migrations run in one transaction.)
fn foreign_object(err: DbErr) -> DbErr {
    let clash = match sqlx_cause(&err).and_then(|cause| cause.as_database_error()) {
        Some(db_err) => {
            matches!(db_err.code().as_deref(), Some("42P07" | "42710"))
                || (db_err.code().as_deref() == Some("1")
                    && db_err.message().contains("already exists"))
        }
        None => false,
    };
    if !clash {
        return err;
    }
    let said = sqlx_cause(&err)
        .and_then(|cause| cause.as_database_error())
        .map(|db_err| db_err.message().to_owned())
        .unwrap_or_default();
    DbErr::Custom(format!(
        "the database already holds something Courier's migrations create ({said}), made \
         outside them: it looks like another application's database (or a table or index \
         made by hand); give Courier a database of its own in DATABASE_URL, or drop what \
         was made by hand"
    ))
}

/// Whether `err` is PostgreSQL giving up on a lock after `lock_timeout`.
fn waited_for_a_lock(err: &DbErr) -> bool {
    sqlx_cause(err)
        .and_then(|cause| cause.as_database_error())
        .and_then(|db_err| db_err.code())
        .is_some_and(|code| code == LOCK_NOT_AVAILABLE)
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
