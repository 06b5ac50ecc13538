//! Whether a SQLite database can be written: a file this user may only read (or one opened
//! with `?mode=ro`) opens and reads as usual, and then fails every write, so a process
//! serving it would look ready while refusing every submission.

use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, Statement, TransactionTrait as _};

use super::Db;

impl Db {
    /// On SQLite, writes the database header back unchanged inside a transaction that is
    /// rolled back: the error a write gets if the file cannot be written. Nothing to check
    /// on PostgreSQL, whose privileges the migrations have already used.
    pub async fn check_writable(&self) -> Result<(), DbErr> {
        if self.backend() != DbBackend::Sqlite {
            return Ok(());
        }
        let conn = self.conn();
        let version: i64 = conn
            .query_one_raw(Statement::from_string(
                DbBackend::Sqlite,
                "PRAGMA user_version",
            ))
            .await?
            .map(|row| row.try_get_by_index(0))
            .transpose()?
            .unwrap_or_default();
        let txn = conn.begin().await?;
        let written = txn
            .execute_unprepared(&format!("PRAGMA user_version = {version}"))
            .await;
        match written {
            // SQLite may have ended the transaction itself: the write's error is the news.
            Err(err) => {
                let _ = txn.rollback().await;
                Err(err)
            }
            Ok(_) => txn.rollback().await,
        }
    }
}
