//! The one transaction policy of every race path: READ COMMITTED pinned on PostgreSQL
//! whatever the server's default (each connection's own default, set as it connects), the write lock taken up front on SQLite, and a bounded
//! retry of the whole transaction on a transient conflict.
//!
//! Why READ COMMITTED: every race is settled by row locks and conditions re-checked on the
//! locked row (`FOR UPDATE SKIP LOCKED`, `FOR SHARE`, `WHERE claim_token = ...`, `ON
//! CONFLICT`). At READ COMMITTED a statement that waited on a lock sees the winner's row
//! and decides on it; at REPEATABLE READ (a common server default) the same wait ends in a
//! serialization failure, which would surface as an internal error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult, SqliteTransactionMode,
    Statement, TransactionOptions, TransactionTrait,
};

use super::{is_transient, Db};

/// Tries of one transaction before a transient conflict is reported.
pub const MAX_TRIES: u32 = 5;

/// The transaction a unit of work runs in. Shared, so the work's future owns its handle;
/// the work must not keep a clone beyond its end (the commit needs the only one).
pub type Txn = Arc<DatabaseTransaction>;

impl Db {
    /// Runs `work` in a transaction under the race policy (see the module docs) and commits
    /// it. A serialization failure, deadlock or busy SQLite database, whether raised by
    /// `work` or by the commit, rolls back and runs `work` again (see the retry policy below); any
    /// other error rolls back and is returned. `work` may therefore run more than once and
    /// must keep its effects inside the transaction.
    pub async fn transaction<T, F, Fut>(&self, mut work: F) -> Result<T, DbErr>
    where
        F: FnMut(Txn) -> Fut,
        Fut: Future<Output = Result<T, DbErr>>,
    {
        let mut retry = Retry::default();
        loop {
            match self.try_once(&mut work).await {
                Ok(done) => return Ok(done),
                Err(err) => retry.again("transaction", err).await?,
            }
        }
    }

    /// Runs one statement on its own, committed by itself (one round trip: no `BEGIN`,
    /// isolation setting or `COMMIT`), under the same retry policy as [`Db::transaction`].
    /// For a single statement that settles its race with its own locks and conditions: at
    /// any isolation level one statement sees one snapshot, and a serialization failure
    /// (possible at REPEATABLE READ when a row it locks changed) is retried afresh.
    pub async fn autocommit(
        &self,
        statement: impl Fn() -> Result<Statement, DbErr>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        let mut retry = Retry::default();
        loop {
            match self.conn.query_all_raw(statement()?).await {
                Ok(rows) => return Ok(rows),
                Err(err) => retry.again("statement", err).await?,
            }
        }
    }

    async fn try_once<T, F, Fut>(&self, work: &mut F) -> Result<T, DbErr>
    where
        F: FnMut(Txn) -> Fut,
        Fut: Future<Output = Result<T, DbErr>>,
    {
        let txn = Arc::new(self.begin_race().await?);
        let done = work(txn.clone()).await;
        let txn = Arc::try_unwrap(txn)
            .map_err(|_| DbErr::Custom("a transaction outlived its work".into()))?;
        match done {
            Ok(done) => {
                txn.commit().await?;
                Ok(done)
            }
            Err(err) => {
                // A failed rollback closes the connection; the error that matters is `err`.
                let _ = txn.rollback().await;
                Err(err)
            }
        }
    }

    /// Begins a transaction at the race policy's isolation: on PostgreSQL each connection's
    /// default, pinned when it connects (see [`Db::connect_with`]), so a plain `BEGIN`.
    async fn begin_race(&self) -> Result<DatabaseTransaction, DbErr> {
        match self.backend() {
            DbBackend::Postgres => self.conn.begin().await,
            _ => self.conn.begin_with_options(write_options()).await,
        }
    }

    /// Starts a transaction that will write, outside the race policy (migrations). On
    /// SQLite it takes the write lock up front, like every write transaction here.
    pub async fn begin_write(&self) -> Result<DatabaseTransaction, DbErr> {
        match self.backend() {
            DbBackend::Sqlite => self.conn.begin_with_options(write_options()).await,
            _ => self.conn.begin().await,
        }
    }
}

/// SQLite's write transactions take the write lock up front (`BEGIN IMMEDIATE`), so they
/// wait on the busy timeout instead of failing when they would later upgrade a read lock.
fn write_options() -> TransactionOptions {
    TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    }
}

/// The retry policy, for a loop that tries some work until it succeeds: after a failed
/// try, [`Retry::again`] says whether to try once more.
#[derive(Debug, Default)]
struct Retry {
    tries: u32,
}

impl Retry {
    /// After a try that failed with `err`: `Ok` (having paused a little, longer after each
    /// conflict, jittered) when `err` is a transient conflict and fewer than [`MAX_TRIES`]
    /// tries were made; otherwise `err`, to give up with. `what` names the work in the log.
    async fn again(&mut self, what: &'static str, err: DbErr) -> Result<(), DbErr> {
        self.tries += 1;
        if self.tries >= MAX_TRIES || !is_transient(&err) {
            return Err(err);
        }
        tracing::debug!(tries = self.tries, what, error = %err, "transient conflict; retrying");
        let pause = 5 * u64::from(self.tries) + rand::random_range(0..10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        Ok(())
    }
}
