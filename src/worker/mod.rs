//! The delivery worker: claims due deliveries in batches, sends each (at most
//! `COURIER_WORKER_CONCURRENCY` in flight), records the outcome under its claim's fence,
//! and on shutdown stops claiming and lets in-flight requests finish within a grace period.

pub mod claim;
pub mod dispatch;
pub mod record;
pub mod schedule;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use self::claim::{claim_due, release, Claim};
use self::dispatch::{AttemptOutcome, Dispatcher, DispatcherError, OutcomeKind, Webhook};
use self::record::{load_targets, record, FinishedAttempt, Target};
use self::schedule::{NextStep, RetryPolicy};
use crate::db;
use crate::error::error_chain;
use crate::state::AppState;

/// Most deliveries claimed in one statement.
const MAX_CLAIM_BATCH: usize = 64;
/// Longest pause between tries at recording an outcome.
const MAX_RECORD_BACKOFF: Duration = Duration::from_secs(2);

/// A delivery worker for one process.
pub struct Worker {
    state: AppState,
    dispatcher: Dispatcher,
    policy: RetryPolicy,
    slots: Arc<Semaphore>,
    concurrency: usize,
}

impl Worker {
    /// A worker using `state`'s settings. Fails only if the HTTP client cannot be built.
    pub fn new(state: AppState) -> Result<Self, DispatcherError> {
        let config = &state.config;
        let dispatcher = Dispatcher::new(
            Duration::from_millis(config.request_timeout_ms),
            config.allow_private_destinations,
        )?;
        let policy = RetryPolicy {
            base: Duration::from_millis(config.retry_base_ms),
            max: Duration::from_millis(config.retry_max_ms.max(config.retry_base_ms)),
            max_attempts: config.max_attempts,
        };
        let concurrency = config.worker_concurrency as usize;
        if config.lease().as_millis() <= u128::from(config.request_timeout_ms) {
            tracing::warn!(
                lease_secs = config.lease_secs,
                request_timeout_ms = config.request_timeout_ms,
                "the lease is not longer than the request timeout: slow requests will be reclaimed and sent twice"
            );
        }
        Ok(Worker {
            dispatcher,
            policy,
            slots: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            state,
        })
    }

    /// Runs until the shutdown token fires, then drains in-flight deliveries for up to
    /// the grace period. Whatever is still unfinished is left to be reclaimed after its lease.
    pub async fn run(self) {
        let this = Arc::new(self);
        let shutdown = this.state.shutdown.clone();
        let poll = Duration::from_millis(this.state.config.poll_interval_ms);
        let mut in_flight = JoinSet::new();
        tracing::info!(concurrency = this.concurrency, "delivery worker started");
        loop {
            while in_flight.try_join_next().is_some() {}
            this.state.metrics.in_flight.set(in_flight.len() as i64);
            if shutdown.is_cancelled() {
                break;
            }
            let free = this.slots.available_permits().min(MAX_CLAIM_BATCH);
            if free == 0 {
                tokio::select! {
                    _ = in_flight.join_next() => continue,
                    () = shutdown.cancelled() => break,
                }
            }
            let mut batch_was_full = false;
            match this.claim(free).await {
                Ok(claims) => {
                    batch_was_full = claims.len() == free;
                    this.start(claims, &mut in_flight).await;
                }
                Err(err) => {
                    tracing::error!(error = %error_chain(&err), "claiming deliveries failed")
                }
            }
            if batch_was_full {
                continue;
            }
            tokio::select! {
                () = this.state.wakeup.notified() => {}
                () = tokio::time::sleep(poll) => {}
                () = shutdown.cancelled() => break,
            }
        }
        this.drain(in_flight).await;
    }

    async fn claim(&self, limit: usize) -> Result<Vec<Claim>, sea_orm::DbErr> {
        let claims = claim_due(
            &self.state.db,
            &self.state.events,
            limit as u32,
            self.state.config.lease(),
        )
        .await?;
        self.state.metrics.claims.inc_by(claims.len() as u64);
        Ok(claims)
    }

    /// Loads what to send and starts one task per claim.
    async fn start(self: &Arc<Self>, claims: Vec<Claim>, in_flight: &mut JoinSet<()>) {
        if claims.is_empty() {
            return;
        }
        let mut targets = match load_targets(&self.state.db, &claims).await {
            Ok(targets) => targets,
            Err(err) => {
                tracing::error!(error = %error_chain(&err), "loading claimed deliveries failed; releasing them");
                if let Err(err) = release(&self.state.db, &self.state.events, &claims).await {
                    // They stay `processing` and are reclaimed after their lease.
                    tracing::error!(error = %error_chain(&err), "releasing claims failed");
                }
                return;
            }
        };
        for claim in claims {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                tracing::error!(delivery_id = %claim.delivery_id, "no free slot for a claimed delivery");
                continue;
            };
            let target = targets.remove(&claim.delivery_id);
            let worker = Arc::clone(self);
            in_flight.spawn(async move { worker.deliver(claim, target, permit).await });
        }
        self.state.metrics.in_flight.set(in_flight.len() as i64);
    }

    /// Sends one delivery and records the outcome.
    async fn deliver(&self, claim: Claim, target: Option<Target>, _slot: OwnedSemaphorePermit) {
        let started_at = db::now();
        let outcome = match &target {
            Some(target) => {
                self.dispatcher
                    .send(&Webhook {
                        id: claim.delivery_id,
                        url: &target.url,
                        secret: &target.secret,
                        body: &target.body,
                    })
                    .await
            }
            None => AttemptOutcome {
                status: None,
                error: Some("the delivery's submission or endpoint could not be read".into()),
                retry_after: None,
                duration: Duration::ZERO,
                kind: OutcomeKind::Connection,
            },
        };
        let finished_at = db::now();
        let attempt_in_cycle = u32::try_from(claim.cycle_attempts).unwrap_or(0) + 1;
        let step = self.policy.next_step(
            outcome.succeeded(),
            attempt_in_cycle,
            outcome.retry_after,
            rand::random::<f64>(),
        );
        let attempt = FinishedAttempt {
            claim: &claim,
            outcome: &outcome,
            step,
            started_at,
            finished_at,
        };
        let metrics = &self.state.metrics;
        metrics.attempt(outcome.kind.as_str());
        // Keep trying while the claim is ours: a result recorded after the lease runs out
        // would only be marked superseded, and the delivery will be retried anyway.
        let mut backoff = Duration::from_millis(50);
        let recorded = loop {
            match record(&self.state.db, &self.state.events, &attempt).await {
                Ok(recorded) => break Some(recorded),
                Err(err)
                    if db::now() + chrono::Duration::from_std(backoff).unwrap_or_default()
                        < claim.lease_expires_at =>
                {
                    tracing::warn!(delivery_id = %claim.delivery_id, error = %error_chain(&err), "recording failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_RECORD_BACKOFF);
                }
                Err(err) => {
                    tracing::error!(delivery_id = %claim.delivery_id, error = %error_chain(&err),
                        "recording failed; the delivery will be reclaimed after its lease");
                    break None;
                }
            }
        };
        let Some(recorded) = recorded else {
            return;
        };
        match recorded.new_state {
            None => {
                metrics.superseded.inc();
                tracing::warn!(delivery_id = %claim.delivery_id, number = recorded.number,
                    "result recorded under a superseded claim; the newer claim's state stands");
            }
            Some(state) => {
                tracing::info!(delivery_id = %claim.delivery_id, attempt = recorded.number,
                    state = state.as_str(), status = ?outcome.status, error = ?outcome.error,
                    "attempt recorded");
                if step == NextStep::Delivered {
                    let latency = (finished_at - claim.created_at)
                        .to_std()
                        .unwrap_or_default();
                    metrics.delivery_latency.observe(latency.as_secs_f64());
                }
                if let NextStep::RetryAfter(delay) = step {
                    self.wake_for_retry(delay);
                }
            }
        }
    }

    /// A retry due before the next poll wakes this worker when it is due.
    fn wake_for_retry(&self, delay: Duration) {
        if delay < Duration::from_millis(self.state.config.poll_interval_ms) {
            let wakeup = self.state.wakeup.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                wakeup.hint();
            });
        }
    }

    /// Lets in-flight deliveries finish within the grace period.
    async fn drain(&self, mut in_flight: JoinSet<()>) {
        let grace = self.state.config.shutdown_grace();
        let remaining = in_flight.len();
        if remaining > 0 {
            tracing::info!(
                remaining,
                ?grace,
                "delivery worker stopping: letting in-flight deliveries finish"
            );
        }
        let drained = tokio::time::timeout(grace, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                unfinished = in_flight.len(),
                "grace period over; unfinished deliveries will be reclaimed after their lease"
            );
            in_flight.abort_all();
        }
        self.state.metrics.in_flight.set(0);
        tracing::info!("delivery worker stopped");
    }
}
