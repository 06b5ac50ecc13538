//! The application state: a cheap clone handed to every resolver, handler and background task.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::auth::cache::KeyCache;
use crate::auth::revocation::Revocations;
use crate::bus::ChangeBus;
use crate::bus::Wakeup;
use crate::config::ServeArgs;
use crate::db::Db;
use crate::metrics::Metrics;
use crate::service::access::Access;
use crate::service::api_keys::ApiKeys;
use crate::service::deliveries::Deliveries;
use crate::service::endpoints::Endpoints;
use crate::service::rate_limit::RateLimiter;
use crate::service::submissions::group_commit::GroupCommit;
use crate::service::submissions::intake::Intake;
use crate::service::submissions::publish::Fanout;
use crate::service::submissions::Submissions;
use crate::service::tenants::Tenants;
use crate::worker::handoff::Handoff;
use crate::worker::hold::HeldEndpoints;

/// Everything a request or a background task needs, behind one reference count: a request
/// clones it several times, and cloning each service's pools and counters instead (dozens
/// of shared counters, contended between threads) cost more than a submit's own work.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Services>);

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct Services {
    /// The database pool.
    pub db: Db,
    /// The settings this process runs with.
    pub config: Arc<ServeArgs>,
    /// This process's metrics.
    pub metrics: Arc<Metrics>,
    /// Cancelled when the process starts shutting down.
    pub shutdown: CancellationToken,
    /// Poked when new work is committed, so a waiting worker looks for it at once.
    pub wakeup: Wakeup,
    /// Delivery state changes, for subscribers.
    pub bus: ChangeBus,
    /// Recently authenticated API keys.
    pub keys: Arc<KeyCache>,
    /// The keys open sessions and subscriptions hold, ended when found revoked.
    pub revocations: Revocations,
    /// Who may reach which endpoint, decided once for every operation.
    pub access: Access,
    /// Endpoint operations.
    pub endpoints: Endpoints,
    /// Tenant operations and portal links.
    pub tenants: Tenants,
    /// API key operations.
    pub api_keys: ApiKeys,
    /// Submission operations.
    pub submissions: Submissions,
    /// Delivery operations.
    pub deliveries: Deliveries,
    /// Publishing events to every subscribed endpoint.
    pub fanout: Fanout,
    /// The per-API-key submission limit.
    pub submit_rate_limiter: RateLimiter,
    /// Where this process's worker takes the deliveries submissions claim as they are
    /// stored.
    pub handoff: Handoff,
    /// The endpoints that asked this process's worker to wait, or answered `410`, until
    /// their hold is over: claims this process made before the answer are not sent.
    pub held: HeldEndpoints,
}

impl AppState {
    /// Wires the services over `db` with `config`.
    pub fn new(db: Db, config: ServeArgs, shutdown: CancellationToken) -> Self {
        let metrics = Arc::new(Metrics::new(db.queries().clone()));
        let wakeup = Wakeup::default();
        let bus = ChangeBus::new(db.backend(), metrics.clone());
        let submit_rate_limiter = RateLimiter::new(
            db.clone(),
            "submit",
            config.rate_limit,
            Duration::from_secs(config.rate_limit_window_secs),
            metrics.clone(),
        );
        let intake = Intake::new(
            submit_rate_limiter.clone(),
            config.max_payload_bytes,
            wakeup.clone(),
            metrics.clone(),
        );
        let access = Access::new(db.clone());
        let handoff = Handoff::default();
        let keys = Arc::new(KeyCache::new(Duration::from_millis(config.auth_cache_ms)));
        let revocations = Revocations::default();
        AppState(Arc::new(Services {
            tenants: Tenants::new(db.clone(), access.clone(), &config.public_url()),
            api_keys: ApiKeys::new(db.clone(), keys.clone(), revocations.clone()),
            keys,
            revocations,
            endpoints: Endpoints::new(
                db.clone(),
                access.clone(),
                bus.clone(),
                wakeup.clone(),
                config.allow_private_destinations,
                config.secret_keys(),
            ),
            submissions: Submissions::new(
                db.clone(),
                access.clone(),
                intake.clone(),
                GroupCommit::start(db.clone(), bus.clone(), metrics.clone(), handoff.clone()),
            ),
            deliveries: Deliveries::new(
                db.clone(),
                access.clone(),
                bus.clone(),
                wakeup.clone(),
                metrics.clone(),
            ),
            fanout: Fanout::new(db.clone(), access.clone(), bus.clone(), intake),
            access,
            bus,
            submit_rate_limiter,
            handoff,
            held: HeldEndpoints::default(),
            wakeup,
            db,
            config: Arc::new(config),
            metrics,
            shutdown,
        }))
    }
}
