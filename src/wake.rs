//! Wake-up hints for delivery workers: an in-process notify, and on PostgreSQL a
//! debounced `NOTIFY` that reaches the workers of every process. Only ever a hint:
//! workers also poll, so nothing depends on a notification arriving.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::db::Db;

/// The PostgreSQL channel wake-up hints travel on.
pub const WAKE_CHANNEL: &str = "courier_wake";

/// A cheap handle for poking workers.
#[derive(Clone, Debug)]
pub struct Wakeup {
    local: Arc<Notify>,
    publish: Arc<Notify>,
    db: Db,
}

impl Wakeup {
    /// Hints for workers on `db`.
    pub fn new(db: Db) -> Self {
        Wakeup {
            local: Arc::new(Notify::new()),
            publish: Arc::new(Notify::new()),
            db,
        }
    }

    /// Tells workers there is new work: this process's at once, other processes' through
    /// one `NOTIFY` however many hints arrive while it is being sent.
    pub fn hint(&self) {
        self.local.notify_one();
        if self.db.backend() == DbBackend::Postgres {
            self.publish.notify_one();
        }
    }

    /// Wakes this process's worker only.
    pub fn hint_local(&self) {
        self.local.notify_one();
    }

    /// Resolves at the next hint (or at once if one arrived since the last wait).
    pub async fn notified(&self) {
        self.local.notified().await;
    }

    /// Publishes hints to, and receives them from, other processes until `shutdown`
    /// (PostgreSQL only). A lost listener connection is reopened.
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(pool) = self.db.pg_listen_pool().cloned() else {
            return;
        };
        let publisher = async {
            loop {
                self.publish.notified().await;
                let notify = Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "SELECT pg_notify($1, '')",
                    [WAKE_CHANNEL.into()],
                );
                if let Err(err) = self.db.conn().execute_raw(notify).await {
                    tracing::debug!(error = %err, "wake-up NOTIFY failed; workers will poll");
                }
            }
        };
        let listener = async {
            loop {
                match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut listener) => match listener.listen(WAKE_CHANNEL).await {
                        Ok(()) => loop {
                            match listener.recv().await {
                                Ok(_) => self.local.notify_one(),
                                Err(err) => {
                                    tracing::warn!(error = %err, "wake-up listener lost; reconnecting");
                                    break;
                                }
                            }
                        },
                        Err(err) => tracing::warn!(error = %err, "LISTEN failed; retrying"),
                    },
                    Err(err) => {
                        tracing::warn!(error = %err, "wake-up listener cannot connect; retrying")
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = publisher => {}
            () = listener => {}
        }
    }
}
