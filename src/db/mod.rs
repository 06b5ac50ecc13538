//! Connecting, migrating, and the one place where PostgreSQL and SQLite differ: whose
//! clock decides ([`Clock`]), the transaction policy of race paths ([`Db::transaction`]),
//! and the few SQL spellings that differ.

mod availability;
mod classify;
mod clock;
mod deadline;
mod diagnose;
mod due;
pub mod ids;
mod listing;
pub mod measured;
mod migrate;
pub(crate) mod parking;
mod redact;
mod scrub;
mod session_lock;
pub(crate) mod shard;
pub(crate) mod sql;
mod transaction;
mod unkept;
mod warmup;
mod writable;
pub use self::redact::redact;
pub use self::session_lock::SessionLock;
pub use self::warmup::{warm_statements, warm_up};

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use prometheus_client::metrics::counter::Counter;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, SqlxPostgresConnector,
    SqlxSqliteConnector,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use self::classify::{
    classify, is_transient, is_unavailable, may_have_committed, sqlx_cause, storage_trouble,
    Failure, StorageTrouble,
};
pub use self::clock::{fixed_window_start, Clock};
use self::deadline::{check_on_release, ping_if_idle, MissedDeadlines};
pub use self::deadline::{deadline_missed, Progress, Timeouts, PING_WHEN_IDLE_FOR};
pub use self::diagnose::{
    check_url, describe, explain_connect_error, location, sqlite_in_memory, sqlite_path,
    sqlx_message,
};
pub use self::listing::ListingTxn;
pub use self::migrate::{
    MIGRATION_GIVES_UP_AFTER, MIGRATION_LOCKS_TRIED_FOR, MIGRATION_LOCK_KEY, MIGRATION_LOCK_WAIT,
};
pub use self::transaction::{Txn, MAX_TRIES};

/// A handle on Courier's database: a cheap clone around the connection pool.
#[derive(Clone, Debug)]
pub struct Db {
    conn: DatabaseConnection,
    queries: Counter,
    timeouts: Timeouts,
    missed: Arc<MissedDeadlines>,
    /// Whether the database was last found out of reach (see [`availability`]).
    availability: Arc<availability::Availability>,
}

/// The options of every PostgreSQL pool of `size` connections: no wait for a connection
/// outlasts `timeouts.acquire`; a connection idle for a while is pinged when taken, and one
/// coming back while deadlines are being missed must answer a ping (see [`deadline`]).
fn pg_pool_options(size: u32, timeouts: Timeouts, missed: &Arc<MissedDeadlines>) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(timeouts.acquire)
        .test_before_acquire(false)
        .before_acquire(ping_if_idle())
        .after_release(check_on_release(missed.clone(), timeouts.acquire))
}

/// A PostgreSQL URL's connection options. A host written as an IPv6 literal
/// (`postgres://[::1]/courier`) keeps its brackets in sqlx's reading, which then looks
/// it up as a name and fails: it is given without them.
pub(super) fn pg_options(url: &str) -> Result<PgConnectOptions, DbErr> {
    let options = PgConnectOptions::from_str(url).map_err(sqlx_err)?;
    let literal = options
        .get_host()
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .map(str::to_owned);
    Ok(match literal {
        Some(address) => options.host(&address),
        None => options,
    })
}

impl Db {
    /// Opens a pool for `url` (`postgres://` or `sqlite:`) with `pool_size` connections
    /// and the default [`Timeouts`].
    pub async fn connect(url: &str, pool_size: u32) -> Result<Self, DbErr> {
        Self::connect_with(url, pool_size, Timeouts::default()).await
    }

    /// Opens a pool for `url` (`postgres://` or `sqlite:`) with `pool_size` connections.
    /// No wait for a connection outlasts `timeouts.acquire`, opening one included; the
    /// work deadline applies where callers use [`Db::within_deadline`].
    ///
    /// SQLite gets WAL, a busy timeout and foreign keys so several connections can share the file.
    pub async fn connect_with(
        url: &str,
        pool_size: u32,
        timeouts: Timeouts,
    ) -> Result<Self, DbErr> {
        let pool_size = pool_size.max(1);
        let missed = Arc::new(MissedDeadlines::default());
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // Every statement here is prepared once per connection and run with arrays and
            // ids whose sizes do not change its best plan, and none leans on a parameter's
            // value for an index (states are written into the text; the optional filters
            // of a fan-out read the endpoints, which it reads whole anyway). Left to itself,
            // PostgreSQL plans the larger statements afresh on every run (a custom plan sees
            // each array's length, so it always looks cheaper), which cost milliseconds a
            // submission and a claim; a generic plan is made once per connection.
            // The race policy's isolation (see [`Db::transaction`]) is each connection's own
            // default, whatever the server's, the database's or the role's: a transaction
            // then begins with one `BEGIN` rather than a `BEGIN` and a `SET TRANSACTION` (a
            // round trip less), and a statement run on its own, outside a transaction, is
            // settled at READ COMMITTED too (at REPEATABLE READ a row changed meanwhile
            // fails it with a serialization error rather than re-checking it).
            // A session left idle inside a transaction (its process cut off by the network
            // mid-transaction, never to send its `COMMIT`) is ended by the server after
            // twice the work deadline, so the locks it holds (an endpoint's flow row, say,
            // which every process's claims take) are not held until TCP gives up, hours
            // later. Courier never leaves a transaction idle for anywhere near that long.
            let idle_in_transaction = format!("{}ms", (timeouts.work * 2).as_millis());
            let options = pg_options(url)?.options([
                ("plan_cache_mode", "force_generic_plan"),
                ("default_transaction_isolation", "read committed"),
                (
                    "idle_in_transaction_session_timeout",
                    idle_in_transaction.as_str(),
                ),
            ]);
            let pool = pg_pool_options(pool_size, timeouts, &missed)
                .connect_with(options.clone())
                .await
                .map_err(sqlx_err)?;
            let db = Db::counted(
                SqlxPostgresConnector::from_sqlx_postgres_pool(pool),
                timeouts,
                missed,
            );
            // New ids carry the database's time (see [`ids`]); should this first look fail,
            // they carry this host's until a serving process looks again.
            if let Err(err) = db.within_deadline(measured::measure(&db)).await {
                tracing::debug!(error = %crate::error::error_chain(&err),
                    "measuring the database's clock failed");
            }
            Ok(db)
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(sqlx_err)?
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_FOR)
                .foreign_keys(true);
            // Each connection to an in-memory database is a database of its own: keep one.
            let in_memory = sqlite_in_memory(url);
            let pool_size = if in_memory { 1 } else { pool_size };
            let pool_options = SqlitePoolOptions::new()
                .max_connections(pool_size)
                .min_connections(u32::from(in_memory))
                .idle_timeout((!in_memory).then_some(Duration::from_secs(600)))
                .max_lifetime((!in_memory).then_some(Duration::from_secs(1800)))
                .acquire_timeout(timeouts.acquire);
            let pool = open_sqlite(pool_options, options).await.map_err(sqlx_err)?;
            Ok(Db::counted(
                SqlxSqliteConnector::from_sqlx_sqlite_pool(pool),
                timeouts,
                missed,
            ))
        } else {
            Err(DbErr::Custom(format!(
                "unsupported DATABASE_URL scheme (expected postgres:// or sqlite:): {}",
                redact(url)
            )))
        }
    }

    /// A pool of `size` connections of its own to the same PostgreSQL database, with the
    /// same settings and deadlines, opened on the runtime that calls this: its connections
    /// are driven by that runtime (see [`crate::worker::claimer`]). Its statements count in
    /// this pool's [`Db::queries`]. `None` on SQLite, whose writers share one file lock.
    pub async fn dedicated(&self, size: u32) -> Result<Option<Db>, DbErr> {
        if self.backend() != DbBackend::Postgres {
            return Ok(None);
        }
        let options = self.conn.get_postgres_connection_pool().connect_options();
        let pool = pg_pool_options(size.max(1), self.timeouts, &self.missed)
            .connect_with((*options).clone())
            .await
            .map_err(sqlx_err)?;
        let mut conn = SqlxPostgresConnector::from_sqlx_postgres_pool(pool);
        let counter = self.queries.clone();
        conn.set_metric_callback(move |_| {
            counter.inc();
        });
        Ok(Some(Db {
            conn,
            queries: self.queries.clone(),
            timeouts: self.timeouts,
            missed: self.missed.clone(),
            availability: self.availability.clone(),
        }))
    }

    fn counted(
        mut conn: DatabaseConnection,
        timeouts: Timeouts,
        missed: Arc<MissedDeadlines>,
    ) -> Self {
        let queries = Counter::default();
        let counter = queries.clone();
        conn.set_metric_callback(move |_| {
            counter.inc();
        });
        Db {
            conn,
            queries,
            timeouts,
            missed,
            availability: Arc::default(),
        }
    }

    /// Probes the database through a connection of its own until `shutdown`, turning
    /// database work away at once while it is out of reach (see [`availability`]). Returns
    /// at once on SQLite.
    pub async fn watch_availability(&self, shutdown: tokio_util::sync::CancellationToken) {
        if self.backend() != DbBackend::Postgres {
            return;
        }
        let options = self.conn.get_postgres_connection_pool().connect_options();
        availability::watch(
            self.availability.clone(),
            (*options).clone(),
            self.timeouts,
            shutdown,
        )
        .await;
    }

    /// Statements this pool has executed (a Prometheus counter, shared by every clone).
    pub fn queries(&self) -> &Counter {
        &self.queries
    }

    /// The SeaORM connection.
    pub fn conn(&self) -> &DatabaseConnection {
        &self.conn
    }

    /// A new one-connection pool for one `LISTEN` session, so listening never starves
    /// queries; `None` on SQLite. Each session gets a pool of its own: a session dropped on
    /// a silent network says `UNLISTEN` on its way out and holds its connection until the
    /// network answers or TCP gives up, which must not keep the next session from
    /// connecting (with one pool of two, two such losses left a process's listener unable
    /// to connect again, and its subscriptions ended at once as lagged).
    pub fn new_listen_pool(&self) -> Option<sqlx::PgPool> {
        if self.backend() != DbBackend::Postgres {
            return None;
        }
        let options = self.conn.get_postgres_connection_pool().connect_options();
        Some(
            PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(self.timeouts.acquire)
                .connect_lazy_with((*options).clone()),
        )
    }

    /// Which backend this is.
    pub fn backend(&self) -> DbBackend {
        self.conn.get_database_backend()
    }

    /// The clock for one statement that decides by time (see [`Clock`]): the database's
    /// on PostgreSQL, this process's on SQLite.
    pub fn clock(&self) -> Clock {
        Clock::new(self.backend())
    }

    /// Whether `moment` is still ahead, by the clock that decides (see [`Clock`]): asked of
    /// the database on PostgreSQL, so every process answers alike whatever its own clock
    /// says; this process's clock on SQLite.
    pub async fn is_ahead(&self, moment: DateTime<Utc>) -> Result<bool, DbErr> {
        let clock = self.clock();
        let row = self
            .conn
            .query_one_raw(clock.statement("SELECT $1 > {now} AS ahead", [moment.into()]))
            .await?;
        match row {
            Some(row) => row.try_get("", "ahead"),
            None => Ok(false),
        }
    }

    /// The clause that locks the rows a `SELECT` reads until the transaction ends:
    /// ` FOR UPDATE` on PostgreSQL; nothing on SQLite, which rejects it and where the
    /// write transaction (`BEGIN IMMEDIATE`) already excludes every other writer.
    pub fn lock_rows(&self) -> &'static str {
        match self.backend() {
            DbBackend::Postgres => " FOR UPDATE",
            _ => "",
        }
    }

    /// `$1, $2, ...` numbered from `first`, for an `IN (...)` list of `count` values.
    pub fn placeholders(first: usize, count: usize) -> String {
        (first..first + count)
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// SQL testing that a column is (or, `negated`, is not) one of `ids`, bound from
    /// parameter `first` on: one array on PostgreSQL (`= ANY($n::uuid[])`, so the statement
    /// text is the same for every number of ids and prepares once), one parameter each on
    /// SQLite (`IN ($n, ...)`). Put it after the column: `format!("id {list}")`.
    pub fn id_list(
        backend: DbBackend,
        first: usize,
        ids: &[uuid::Uuid],
        negated: bool,
    ) -> (String, Vec<sea_orm::Value>) {
        match backend {
            DbBackend::Postgres => {
                let op = if negated { "<> ALL" } else { "= ANY" };
                (
                    format!("{op}(${first}::uuid[])"),
                    vec![sea_orm::Value::from(ids.to_vec())],
                )
            }
            _ => {
                let op = if negated { "NOT IN" } else { "IN" };
                let list = Self::placeholders(first, ids.len());
                (
                    format!("{op} ({list})"),
                    ids.iter().map(|id| sea_orm::Value::from(*id)).collect(),
                )
            }
        }
    }

    /// Whether this process's probe last found the database out of reach (its work is then
    /// turned away at once; see [`availability`]).
    pub fn out_of_reach(&self) -> bool {
        self.availability.unreachable()
    }

    /// A count of the times this process's probe has found the database out of reach, to
    /// pass to [`Db::no_outage_since`] at the end of work that must not span an outage.
    pub fn outages(&self) -> u64 {
        self.availability.outages()
    }

    /// Unavailable (and certainly not committed, as work turned away is) when this process's
    /// probe has found the database out of reach since it counted `outages` (see
    /// [`Db::outages`]): a transaction that checks this before its `COMMIT` has not waited
    /// (for a connection, or on a statement the network held back) through an outage the
    /// probe found. One too short for the probe to notice, or one that holds the `COMMIT`
    /// itself, goes unseen.
    pub fn no_outage_since(&self, outages: u64) -> Result<(), DbErr> {
        if self.availability.outages() == outages {
            Ok(())
        } else {
            Err(availability::turned_away())
        }
    }

    /// When this process's probe last found the database back after finding it out of
    /// reach (`None`: never), as a receiver whose `changed()` resolves each time it does.
    pub fn returns(&self) -> tokio::sync::watch::Receiver<Option<std::time::Instant>> {
        self.availability.returns()
    }

    /// `SELECT 1`, for readiness checks.
    pub async fn ping(&self) -> Result<(), DbErr> {
        self.conn.ping().await
    }

    /// Closes the pools.
    pub async fn close(self) -> Result<(), DbErr> {
        self.conn.close().await
    }
}

/// Now as Courier stamps it: the database's clock as this process last measured it (this
/// host's on SQLite; see [`measured`]), in UTC, truncated to microseconds (PostgreSQL's
/// precision), so a value read back compares equal to the value written on both backends.
/// Only for what no decision depends on (the times rows, attempts and webhooks carry);
/// decisions are the database's own, through [`Db::clock`].
pub fn now() -> DateTime<Utc> {
    DateTime::<Utc>::from(measured::database_now()).trunc_subsecs(6)
}

/// How long opening a SQLite file waits for another process's lock, as every statement
/// does (its busy timeout).
const SQLITE_BUSY_FOR: Duration = Duration::from_secs(10);

/// A pool on a SQLite file, opened with `options`. A connection's set-up (switching a new
/// file to WAL) can find the file locked by another process starting at the same moment
/// and is refused at once, without the busy timeout that statements wait out: it is tried
/// again, within the same [`SQLITE_BUSY_FOR`]. (Two commands started together on a new
/// file, as the README's tour does, failed 1 run in 8 with "database is locked".)
async fn open_sqlite(
    pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) -> Result<sqlx::SqlitePool, sqlx::Error> {
    let started = std::time::Instant::now();
    loop {
        match pool.clone().connect_with(options.clone()).await {
            Err(err) if is_busy(&err) && started.elapsed() < SQLITE_BUSY_FOR => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            opened => return opened,
        }
    }
}

/// Whether `err` is SQLite's "database is locked" (`SQLITE_BUSY`, in any extended form).
fn is_busy(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|err| err.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

fn sqlx_err(err: sqlx::Error) -> DbErr {
    DbErr::Conn(sea_orm::RuntimeErr::SqlxError(err.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_is_given_without_its_brackets() {
        let options = pg_options("postgres://app@[::1]:5433/courier").expect("readable");
        assert_eq!(options.get_host(), "::1");
        assert_eq!(options.get_port(), 5433);
        let named = pg_options("postgres://app@db.internal/courier").expect("readable");
        assert_eq!(named.get_host(), "db.internal");
    }
}
