//! Leaving no earlier copy of rewritten rows in a SQLite file: what an in-place rewrite
//! (a secret sealed where it was stored in clear) leaves behind in the file's free space
//! and in its write-ahead log.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use super::Db;

impl Db {
    /// On SQLite, rebuilds the database file from its live rows (`VACUUM`: free pages and
    /// the space rows left inside pages are not copied) and empties the write-ahead log
    /// into it (`wal_checkpoint(TRUNCATE)`), so bytes that rows held before being rewritten
    /// are gone from both files. Takes the file's write lock for as long as the rebuild.
    /// Nothing on PostgreSQL, whose old row versions are its vacuum's to remove.
    pub async fn scrub_freed_space(&self) -> Result<(), DbErr> {
        if self.backend() != DbBackend::Sqlite {
            return Ok(());
        }
        self.conn().execute_unprepared("VACUUM").await?;
        let checkpoint = self
            .conn()
            .query_one_raw(Statement::from_string(
                DbBackend::Sqlite,
                "PRAGMA wal_checkpoint(TRUNCATE)",
            ))
            .await?;
        // Its first column is 1 when another connection kept it from finishing.
        let busy: i32 = match checkpoint {
            Some(row) => row.try_get_by_index(0)?,
            None => 0,
        };
        if busy != 0 {
            return Err(DbErr::Custom(
                "another connection to the SQLite file kept its write-ahead log from being emptied"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}
