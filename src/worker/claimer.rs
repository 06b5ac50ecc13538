//! The claiming loop's claims on a thread of their own, with connections of their own
//! (PostgreSQL). A claim is five round trips in a row (`BEGIN`, the turn lock, the claim,
//! the turns, `COMMIT`). On the runtime that also runs the requests, each answer waited its
//! turn behind the tasks of up to `COURIER_WORKER_CONCURRENCY` requests before the claim
//! went on, and the claiming loop, which the drain of many endpoints keeps busy without a
//! pause, spent more time in that queue than in the database. Here each answer is taken up
//! at once. The requests and the recording stay on the main runtime.

use sea_orm::DbErr;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;

use super::claim::{claim_due_with_targets, warm_claiming_loop, ClaimError, ClaimRequest, Claimed};
use super::targets::Targets;
use crate::bus::ChangeBus;
use crate::crypto::sealing::SecretKeys;
use crate::db::Db;
use crate::error::error_chain;

/// Connections of the claims' own pool: the claiming loop makes one claim at a time; the
/// second serves a claim that begins while the first connection is still coming back.
const CONNECTIONS: u32 = 2;

/// The claims' thread, its runtime and its pool. Dropping it stops the thread.
#[derive(Debug)]
pub struct Claimer {
    handle: Handle,
    db: Db,
    _stop: oneshot::Sender<()>,
}

impl Claimer {
    /// Starts the thread, opens its pool beside `db`'s and plans the claiming loop's
    /// statements on each of its connections. `None` on SQLite, or if either cannot start
    /// (logged): claims then run on the caller's runtime.
    pub async fn start(db: &Db) -> Option<Claimer> {
        let (ready_tx, ready) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let main = db.clone();
        let spawned = std::thread::Builder::new()
            .name("courier-claims".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready_tx.send(Err(DbErr::Custom(err.to_string())));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match main.dedicated(CONNECTIONS).await {
                        Ok(Some(own)) => {
                            // Planned on its connections before the first claim needs them.
                            let limit = own.timeouts().acquire;
                            crate::db::warm_statements(&own, limit, |txn| {
                                let own = own.clone();
                                async move { warm_claiming_loop(&txn, &own).await }
                            })
                            .await;
                            if ready_tx.send(Ok(Some((Handle::current(), own)))).is_ok() {
                                // Runs the claims spawned here until the claimer is dropped.
                                let _ = stopped.await;
                            }
                        }
                        other => {
                            let _ = ready_tx.send(other.map(|_| None));
                        }
                    }
                });
            });
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "the claims' thread did not start; claiming on the main runtime");
            return None;
        }
        match ready.await {
            Ok(Ok(Some((handle, db)))) => Some(Claimer {
                handle,
                db,
                _stop: stop,
            }),
            Ok(Ok(None)) => None,
            Ok(Err(err)) => {
                tracing::warn!(error = %error_chain(&err),
                    "the claims' own connections did not open; claiming on the main runtime");
                None
            }
            Err(_) => None,
        }
    }

    /// [`claim_due_with_targets`] on the claims' thread and connections.
    pub async fn claim(
        &self,
        bus: &ChangeBus,
        keys: SecretKeys,
        request: ClaimRequest,
    ) -> Result<(Claimed, Targets), ClaimError> {
        let (db, bus) = (self.db.clone(), bus.clone());
        // A claim given up on (its deadline passed) is stopped and rolled back, as it would
        // be on the caller's runtime, rather than left to commit claims nobody starts.
        let claiming = AbortOnDropHandle::new(
            self.handle
                .spawn(async move { claim_due_with_targets(&db, &bus, &keys, request).await }),
        );
        match claiming.await {
            Ok(claimed) => claimed,
            // Dropped with the runtime, or a panic: whatever it claimed is reclaimed after
            // its lease.
            Err(err) => Err(ClaimError::Claim(DbErr::Custom(format!(
                "the claim did not finish: {err}"
            )))),
        }
    }
}

/// Claims through `claimer`'s thread and connections if there is one, on the caller's
/// runtime and `db`'s pool if not (SQLite, or a claimer that did not start).
pub async fn claim(
    claimer: Option<&Claimer>,
    db: &Db,
    bus: &ChangeBus,
    keys: SecretKeys,
    request: ClaimRequest,
) -> Result<(Claimed, Targets), ClaimError> {
    match claimer {
        Some(claimer) => claimer.claim(bus, keys, request).await,
        None => claim_due_with_targets(db, bus, &keys, request).await,
    }
}
