//! The application state: a cheap clone handed to every resolver, handler and background task.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::ServeArgs;
use crate::db::Db;
use crate::metrics::Metrics;
use crate::service::endpoints::Endpoints;

/// Everything a request or a background task needs, shared by reference count.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The database pool.
    pub db: Db,
    /// The settings this process runs with.
    pub config: Arc<ServeArgs>,
    /// This process's metrics.
    pub metrics: Arc<Metrics>,
    /// Cancelled when the process starts shutting down.
    pub shutdown: CancellationToken,
    /// Endpoint operations.
    pub endpoints: Endpoints,
}

impl AppState {
    /// Wires the services over `db` with `config`.
    pub fn new(db: Db, config: ServeArgs, shutdown: CancellationToken) -> Self {
        let endpoints = Endpoints::new(db.clone(), config.allow_private_destinations);
        AppState {
            db,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            shutdown,
            endpoints,
        }
    }
}
