//! The transaction of one page of a `deliveries` listing: read-only, with the planner
//! settings that keep a page reading a page, and (for a page read in steps) one snapshot
//! and statements not kept prepared.

use async_trait::async_trait;
use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, ExecResult, QueryResult, Statement,
    TransactionTrait as _,
};

use super::unkept::UnkeptTransaction;
use super::Db;

impl Db {
    /// Starts a read-only transaction for one page of a keyset listing. On PostgreSQL,
    /// bitmap scans are off in it: a bitmap scan gathers every matching row and sorts them
    /// before the first one comes back, which is how a planner without statistics (a table
    /// never analyzed) or with misleading ones turns a page of history into a read of all
    /// of it. Without bitmaps the page walks an index in the listing's order and stops.
    ///
    /// And its statements are planned for the values they are given, not once per
    /// connection for any value (the connections' `force_generic_plan`): a plan for any
    /// event type, say, walks the newest deliveries first expecting a third of them to
    /// match, and for a type few or none have walks the whole history (all 100,000 rows of
    /// a small one), where the plan for that type reads a few index pages.
    ///
    /// With `in_order`, sorts are off too, for a listing that an index serves in its order
    /// whatever the statistics say: a planner that cannot count a partial index's rows (a
    /// table never vacuumed) takes it for small, reads all of it and sorts (every settled
    /// delivery, for a page of delivered ones).
    ///
    /// JIT compiling is off in either case: a disabled sort weighs a plan's cost far above
    /// PostgreSQL's JIT threshold, and compiling took a 20 ms page of a tenant's listing to
    /// 100 ms.
    ///
    /// With `in_steps`, for a page read in more than one statement, each made from what
    /// the last found (PostgreSQL): every statement sees the database as of the first
    /// (`REPEATABLE READ`, read-only, which never fails to serialize), and none is kept
    /// prepared on the connection, their texts varying with what was found (see
    /// [`super::unkept`]). The settings go in the round trip that begins the transaction,
    /// as `SET LOCAL` would take one each.
    pub async fn begin_listing(&self, in_order: bool, in_steps: bool) -> Result<ListingTxn, DbErr> {
        if self.backend() != DbBackend::Postgres {
            return Ok(ListingTxn::Kept(self.conn.begin().await?));
        }
        let settings = if in_order {
            IN_ORDER_LISTING_SETTINGS
        } else {
            LISTING_SETTINGS
        };
        if in_steps {
            let pool = self.conn.get_postgres_connection_pool();
            let begin = format!("{BEGIN_ONE_SNAPSHOT}; {settings}");
            let txn = UnkeptTransaction::begin(pool, begin, self.queries.clone()).await?;
            return Ok(ListingTxn::Unkept(txn));
        }
        let txn = self.conn.begin().await?;
        txn.execute_unprepared(settings).await?;
        Ok(ListingTxn::Kept(txn))
    }
}

/// The settings of a listing's transaction (see [`Db::begin_listing`]), for it alone.
const LISTING_SETTINGS: &str = "SELECT set_config('enable_bitmapscan', 'off', true), \
     set_config('plan_cache_mode', 'force_custom_plan', true), set_config('jit', 'off', true)";

/// The beginning of a listing's transaction that sees one snapshot throughout (see
/// [`Db::begin_listing`]).
const BEGIN_ONE_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// [`LISTING_SETTINGS`] with sorts off, for a listing read in an index's order.
const IN_ORDER_LISTING_SETTINGS: &str = "SELECT set_config('enable_bitmapscan', 'off', true), \
     set_config('plan_cache_mode', 'force_custom_plan', true), set_config('jit', 'off', true), \
     set_config('enable_sort', 'off', true)";

/// A listing's transaction (see [`Db::begin_listing`]). Rolled back if dropped uncommitted.
pub enum ListingTxn {
    /// Its statements kept prepared on the connection, as every other statement is.
    Kept(DatabaseTransaction),
    /// Its statements not kept (see [`super::unkept`]).
    Unkept(UnkeptTransaction),
}

impl ListingTxn {
    /// Commits the transaction.
    pub async fn commit(self) -> Result<(), DbErr> {
        match self {
            Self::Kept(txn) => txn.commit().await,
            Self::Unkept(txn) => txn.commit().await,
        }
    }
}

#[async_trait]
impl ConnectionTrait for ListingTxn {
    fn get_database_backend(&self) -> DbBackend {
        match self {
            Self::Kept(txn) => txn.get_database_backend(),
            Self::Unkept(txn) => txn.get_database_backend(),
        }
    }

    async fn execute_raw(&self, statement: Statement) -> Result<ExecResult, DbErr> {
        match self {
            Self::Kept(txn) => txn.execute_raw(statement).await,
            Self::Unkept(txn) => txn.execute_raw(statement).await,
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        match self {
            Self::Kept(txn) => txn.execute_unprepared(sql).await,
            Self::Unkept(txn) => txn.execute_unprepared(sql).await,
        }
    }

    async fn query_one_raw(&self, statement: Statement) -> Result<Option<QueryResult>, DbErr> {
        match self {
            Self::Kept(txn) => txn.query_one_raw(statement).await,
            Self::Unkept(txn) => txn.query_one_raw(statement).await,
        }
    }

    async fn query_all_raw(&self, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        match self {
            Self::Kept(txn) => txn.query_all_raw(statement).await,
            Self::Unkept(txn) => txn.query_all_raw(statement).await,
        }
    }
}
