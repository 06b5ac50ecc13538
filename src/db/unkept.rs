//! Read-only transactions whose statements are not kept prepared on their connection
//! (PostgreSQL): for statements whose text varies from call to call.
//!
//! The driver keeps every statement it runs prepared on its connection, up to a hundred,
//! each holding server memory for its text and the parsed query (1.6 MB for a set listing's
//! page of 101 endpoints). A statement whose text changes with its input (a set listing's
//! page has one branch per endpoint it reads) would fill that cache with shapes seldom run
//! again, push out the statements of the hot paths, and hold that memory in every server
//! process of the pool. Unkept, each runs as the connection's unnamed statement: one more
//! round trip (parse, then run), and nothing left behind.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, ExecResult, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;
use sqlx::{Executor as _, Postgres};
use tokio::sync::Mutex;

/// A read-only transaction on one connection of the pool whose statements are run without
/// being kept prepared. Rolled back if dropped before [`UnkeptTransaction::commit`].
pub struct UnkeptTransaction {
    /// The transaction, locked by whichever statement is running on it.
    txn: Mutex<sqlx::Transaction<'static, Postgres>>,
    /// The pool's count of statements run, counted as the pool's other connections count
    /// them: a statement's, not `BEGIN`'s, `COMMIT`'s or one run unprepared.
    queries: Counter,
}

impl UnkeptTransaction {
    /// Takes a connection from `pool` and starts a transaction with `begin` (a `BEGIN`,
    /// and any settings after it, sent in one round trip).
    pub(super) async fn begin(
        pool: &sqlx::PgPool,
        begin: String,
        queries: Counter,
    ) -> Result<Self, DbErr> {
        let txn = pool
            .begin_with(sqlx::AssertSqlSafe(begin))
            .await
            .map_err(|err| DbErr::Conn(RuntimeErr::SqlxError(Arc::new(err))))?;
        Ok(Self {
            txn: Mutex::new(txn),
            queries,
        })
    }

    /// Commits the transaction and returns its connection to the pool.
    pub async fn commit(self) -> Result<(), DbErr> {
        self.txn.into_inner().commit().await.map_err(exec_err)
    }

    /// `statement` as the driver runs it, not kept once run.
    fn unkept(statement: &Statement) -> sqlx::query::Query<'_, Postgres, SqlxValues> {
        let values = statement
            .values
            .clone()
            .unwrap_or(sea_orm::Values(Vec::new()));
        sqlx::query_with(
            sqlx::AssertSqlSafe(statement.sql.as_str()),
            SqlxValues(values),
        )
        .persistent(false)
    }
}

fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(Arc::new(err)))
}

fn exec_err(err: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(err)))
}

#[async_trait::async_trait]
impl ConnectionTrait for UnkeptTransaction {
    fn get_database_backend(&self) -> DbBackend {
        DbBackend::Postgres
    }

    async fn execute_raw(&self, statement: Statement) -> Result<ExecResult, DbErr> {
        let mut txn = self.txn.lock().await;
        self.queries.inc();
        let done = Self::unkept(&statement).execute(&mut **txn).await;
        done.map(ExecResult::from).map_err(exec_err)
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        let mut txn = self.txn.lock().await;
        let done = (&mut **txn)
            .execute(sqlx::AssertSqlSafe(sql.to_owned()))
            .await;
        done.map(ExecResult::from).map_err(exec_err)
    }

    async fn query_one_raw(&self, statement: Statement) -> Result<Option<QueryResult>, DbErr> {
        let mut txn = self.txn.lock().await;
        self.queries.inc();
        let row = Self::unkept(&statement).fetch_optional(&mut **txn).await;
        row.map(|row| row.map(QueryResult::from)).map_err(query_err)
    }

    async fn query_all_raw(&self, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        let mut txn = self.txn.lock().await;
        self.queries.inc();
        let rows = Self::unkept(&statement).fetch_all(&mut **txn).await;
        rows.map(|rows| rows.into_iter().map(QueryResult::from).collect())
            .map_err(query_err)
    }
}
