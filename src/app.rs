//! Assembles a running Courier: state, schema and router, served until the shutdown token fires.

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::ServeArgs;
use crate::db::Db;
use crate::http;
use crate::schema::{self, CourierSchema};
use crate::state::AppState;
use crate::worker::claimer::Claimer;
use crate::worker::Worker;

/// One Courier application instance: its own state over its own database pool.
pub struct App {
    state: AppState,
    schema: CourierSchema,
}

impl App {
    /// Builds an instance over `db` (already migrated) that stops when `shutdown` is cancelled.
    pub fn new(db: Db, config: ServeArgs, shutdown: CancellationToken) -> Self {
        let state = AppState::new(db, config, shutdown);
        let schema = schema::build(Some(state.clone()));
        App { state, schema }
    }

    /// The shared state, for callers that drive services directly.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The HTTP router.
    pub fn router(&self) -> Router {
        http::router(self.schema.clone(), self.state.clone())
    }

    /// Serves HTTP on `listener`, with the event listener, the revocation watcher, retention and (unless
    /// its concurrency is 0) the delivery worker, until the shutdown token is cancelled;
    /// then lets in-flight work finish.
    ///
    /// It reports ready (`listening`) only once the database connections are open and warm and
    /// (on PostgreSQL) `LISTEN` holds, each within the connection acquire timeout, so the
    /// first requests and deliveries do not pay for the start-up.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        let shutdown = self.state.shutdown.clone();
        let events_listener = tokio::spawn(crate::bus::listener::run(
            self.state.db.clone(),
            self.state.bus.clone(),
            self.state.wakeup.clone(),
            self.state.revocations.hints(),
            shutdown.clone(),
        ));
        let limit = self.state.db.timeouts().acquire;
        let warm = async {
            let db = &self.state.db;
            crate::db::warm_up(db, limit).await;
            // A submission's statements and its claim's, planned on every connection.
            crate::db::warm_statements(db, limit, |txn| async move {
                crate::service::submissions::store::warm_statements(&txn, db).await?;
                crate::worker::claim::warm_statements(&txn, db).await
            })
            .await;
        };
        // The claims' own thread and connections, open and warm before the worker starts
        // (so a submission never arrives before the worker can take its claim).
        let claimer = async {
            if self.state.config.worker_concurrency > 0 {
                Claimer::start(&self.state.db).await
            } else {
                None
            }
        };
        let (_, live, claimer) = tokio::join!(warm, self.state.bus.wait_live(limit), claimer);
        if !live {
            tracing::warn!("not yet listening for changes from other processes; going on");
        }
        let revocation_watcher = tokio::spawn(crate::auth::revocation::watch(
            self.state.db.clone(),
            self.state.keys.clone(),
            self.state.revocations.clone(),
            shutdown.clone(),
        ));
        let worker = if self.state.config.worker_concurrency > 0 {
            let worker = Worker::new(self.state.clone(), claimer).map_err(std::io::Error::other)?;
            Some(tokio::spawn(worker.run()))
        } else {
            tracing::info!("COURIER_WORKER_CONCURRENCY=0: serving the API only");
            None
        };
        let pruner = tokio::spawn(
            self.state
                .submit_rate_limiter
                .clone()
                .prune_until(shutdown.clone()),
        );
        let availability = {
            let db = self.state.db.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { db.watch_availability(shutdown).await })
        };
        let clock_watch = tokio::spawn(crate::db::measured::keep_measuring(
            self.state.db.clone(),
            shutdown.clone(),
        ));
        let retention = tokio::spawn(crate::worker::retention::run(
            self.state.db.clone(),
            self.state.config.retention_days,
            std::time::Duration::from_secs(self.state.config.prune_interval_secs),
            shutdown.clone(),
        ));
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "listening");
        }
        http::connections::serve(
            listener,
            self.router(),
            self.state.config.connection_limits(),
            self.state.metrics.clone(),
            shutdown.clone(),
        )
        .await?;
        tracing::info!("HTTP server stopped");
        let worker = async {
            if let Some(worker) = worker {
                let _ = worker.await;
            }
        };
        let background = stop_background(
            [
                pruner,
                retention,
                events_listener,
                revocation_watcher,
                clock_watch,
                availability,
            ],
            BACKGROUND_STOP_WITHIN,
        );
        tokio::join!(worker, background);
        Ok(())
    }
}

/// How long the background tasks (pruning, retention, the event listener, the revocation
/// watcher, the database clock's measurement, the database's probe) get to stop on their
/// own after a shutdown.
const BACKGROUND_STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits up to `within` for `tasks`, each of which stops at the shutdown signal when idle,
/// then aborts those still waiting on the database: their work is one transaction or
/// statement at a time, which the database rolls back, so a silent network never keeps
/// the process from exiting.
async fn stop_background<const N: usize>(
    tasks: [tokio::task::JoinHandle<()>; N],
    within: std::time::Duration,
) {
    let aborts: Vec<_> = tasks.iter().map(|task| task.abort_handle()).collect();
    let joined = futures_util::future::join_all(tasks);
    if tokio::time::timeout(within, joined).await.is_err() {
        tracing::warn!("background database work still waiting at shutdown; abandoned");
        for abort in aborts {
            abort.abort();
        }
    }
}
