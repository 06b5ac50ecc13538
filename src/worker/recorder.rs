//! The recorder: writes finished attempts in batches (one transaction for many outcomes,
//! each still fenced by its own claim token), then frees their slots.

use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::health::HealthPolicy;
use super::record::{record_batch_with, FinishedAttempt, Recorded};
use super::schedule::NextStep;
use crate::error::error_chain;
use crate::state::AppState;

/// Most outcomes written in one transaction.
const MAX_BATCH: usize = 128;
/// Longest pause between tries at writing a batch.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a batch is retried before its outcomes are left to be reclaimed.
const GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// A finished attempt on its way to the database, holding its worker slot.
pub struct Finished {
    /// What happened.
    pub attempt: FinishedAttempt,
    /// Released once the outcome is recorded (or given up on).
    pub slot: OwnedSemaphorePermit,
}

/// Writes outcomes as they arrive: one at a time when the worker is quiet, many per
/// transaction when it is busy. Nothing waits for a batch to fill.
pub struct Recorder {
    state: AppState,
    slots: Arc<Semaphore>,
}

impl Recorder {
    /// A recorder for `state`'s database, freeing slots of `slots`.
    pub fn new(state: AppState, slots: Arc<Semaphore>) -> Self {
        Recorder { state, slots }
    }

    /// Records until every sender is gone and the inbox is empty.
    pub async fn run(self, mut inbox: mpsc::Receiver<Finished>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while inbox.recv_many(&mut batch, MAX_BATCH).await > 0 {
            self.write(&batch).await;
            for finished in batch.drain(..) {
                drop(finished.slot);
            }
            let busy =
                self.state.config.worker_concurrency as usize - self.slots.available_permits();
            self.state.metrics.in_flight.set(busy as i64);
            self.state.wakeup.free_slot();
        }
    }

    /// Writes one batch, retrying through database trouble (each try within the database
    /// deadline; a try whose commit went unacknowledged is recognised by the next, which
    /// adds no second attempt for the same claim). A result written after its
    /// lease ran out is still safe (the claim-token fence marks it superseded if another
    /// worker took over, and applies it if nobody did), so outcomes are not dropped just
    /// because they are late; only a shutdown or [`GIVE_UP_AFTER`] ends the retries.
    async fn write(&self, batch: &[Finished]) {
        let attempts: Vec<FinishedAttempt> = batch.iter().map(|f| f.attempt.clone()).collect();
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        let mut tries = 0;
        let policy = HealthPolicy {
            disable_after_failures: self.state.config.disable_after_failures,
        };
        loop {
            tries += 1;
            let db = &self.state.db;
            match db
                .within_deadline(record_batch_with(db, &self.state.events, policy, &attempts))
                .await
            {
                Ok(recorded) => {
                    for (attempt, recorded) in attempts.iter().zip(recorded) {
                        self.report(attempt, &recorded);
                    }
                    return;
                }
                Err(err)
                    if started.elapsed() < GIVE_UP_AFTER
                        && !(self.state.shutdown.is_cancelled() && tries >= 3) =>
                {
                    tracing::warn!(error = %error_chain(&err), outcomes = attempts.len(), "recording failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(err) => {
                    tracing::error!(error = %error_chain(&err), outcomes = attempts.len(),
                        "recording failed; the deliveries will be reclaimed after their lease");
                    return;
                }
            }
        }
    }

    fn report(&self, attempt: &FinishedAttempt, recorded: &Recorded) {
        let metrics = &self.state.metrics;
        let delivery_id = attempt.claim.delivery_id;
        match recorded.new_state {
            None => {
                metrics.superseded.inc();
                tracing::warn!(%delivery_id, number = recorded.number,
                    "result recorded under a superseded claim; the newer claim's state stands");
            }
            Some(state) => {
                tracing::debug!(%delivery_id, attempt = recorded.number, state = state.as_str(),
                    status = ?attempt.outcome.status, error = ?attempt.outcome.error, "attempt recorded");
                match attempt.step {
                    NextStep::Delivered => {
                        let latency = (attempt.finished_at - attempt.claim.created_at)
                            .to_std()
                            .unwrap_or_default();
                        metrics.delivery_latency.observe(latency.as_secs_f64());
                    }
                    NextStep::RetryAfter(delay) => self.wake_for_retry(delay),
                    NextStep::Failed => {
                        tracing::info!(%delivery_id, attempts = recorded.number, error = ?attempt.outcome.error, "delivery failed");
                    }
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
}
