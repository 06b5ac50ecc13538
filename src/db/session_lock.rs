//! A lock one process holds across several statements of its own, on PostgreSQL: an
//! advisory session lock on a connection set aside for it, which ends with that connection.

use sea_orm::{DbBackend, DbErr};
use sqlx::pool::PoolConnection;
use sqlx::Postgres;

use super::{sqlx_err, Db};

/// An advisory lock held until dropped. Its connection is closed then, not returned to the
/// pool, so the lock never outlives its holder on a pooled connection.
pub struct SessionLock {
    _connection: PoolConnection<Postgres>,
}

impl Db {
    /// Waits for, then holds, the advisory lock `key` (PostgreSQL); `None` on SQLite, whose
    /// database one process holds anyway.
    pub async fn session_lock(&self, key: i64) -> Result<Option<SessionLock>, DbErr> {
        if self.backend() != DbBackend::Postgres {
            return Ok(None);
        }
        let pool = self.conn().get_postgres_connection_pool();
        let mut connection = pool.acquire().await.map_err(sqlx_err)?;
        connection.close_on_drop();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *connection)
            .await
            .map_err(sqlx_err)?;
        Ok(Some(SessionLock {
            _connection: connection,
        }))
    }
}
