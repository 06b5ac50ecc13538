//! The recorder: writes finished attempts in batches (one transaction for many outcomes,
//! each still fenced by its own claim token), isolates an outcome the database refuses so
//! it cannot hold up the others, then frees their recording permits.

use sea_orm::ActiveEnum as _;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DbBackend, DbErr};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinSet;

use super::ended::EndedGuard;
use super::health::HealthPolicy;
use super::record::{record, FinishedAttempt, Recorded};
use super::recovery::Recovery;
use super::schedule::NextStep;
use crate::db::{is_transient, is_unavailable};
use crate::error::error_chain;
use crate::state::AppState;

/// Most outcomes written in one transaction.
const MAX_BATCH: usize = 128;
/// Most batches written at once. Usually one: the outcomes that arrive while a batch
/// commits form the next, larger batch. Two at once whenever outcomes came in (which once
/// kept slots from waiting on the recorder, before a slot was freed when its request
/// ended) halved the batches and, measured on a drain of one endpoint, cost a third more
/// CPU per delivery in Courier and PostgreSQL alike. A second batch starts only for an
/// outcome that another delivery waits on (see [`may_start`]), and only on PostgreSQL:
/// SQLite has one writer anyway.
const MAX_WRITERS: usize = 2;

/// First pause between tries at writing a batch.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between tries at writing a batch.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a batch is retried through an unreachable database before its outcomes are
/// left to be reclaimed.
const GIVE_UP_AFTER: Duration = Duration::from_secs(300);
/// Tries at writing one outcome the database refuses before it is given up.
const REFUSED_TRIES: u32 = 3;

/// Whether a batch may start while `writing` batches (of at most `max_writers`) are being
/// written: at once when none is, or alongside one when it holds an outcome that
/// `settles_a_head` (see [`settles_a_line_head`]). Anything else waits for the batch being
/// written, and grows meanwhile.
fn may_start(writing: usize, max_writers: usize, settles_a_head: bool) -> bool {
    writing == 0 || (writing < max_writers && settles_a_head)
}

/// Whether `attempt` settles an ordering line's head (delivered or failed, not retried):
/// the next delivery of its line cannot be attempted until it is recorded (see
/// [`crate::service::lines`]).
fn settles_a_line_head(attempt: &FinishedAttempt) -> bool {
    attempt.claim.ordering_key.is_some() && !matches!(attempt.step, NextStep::RetryAfter(_))
}

/// Why outcomes could not be written.
enum Unwritten {
    /// The database answered with an error: something in the batch cannot be written as it is.
    Refused(DbErr),
    /// The database stayed unreachable (or busy) past [`GIVE_UP_AFTER`], or the process is stopping.
    Unreachable(DbErr),
}

/// A finished attempt on its way to the database, holding a recording permit.
pub struct Finished {
    /// What happened.
    pub attempt: FinishedAttempt,
    /// Held until the outcome is recorded (or given up on), and released as this drops.
    pub _permit: OwnedSemaphorePermit,
    /// Keeps the ended request out of this process's in-flight counts until then.
    pub _ended: EndedGuard,
}

/// Writes outcomes as they arrive: one at a time when the worker is quiet, many per
/// transaction when it is busy. Nothing waits for a batch to fill: what arrives while a
/// batch is written becomes the next batch (see [`MAX_WRITERS`]). Each batch locks its
/// deliveries in id order, so batches of other processes cannot deadlock with it, and each
/// claim's fence still decides.
#[derive(Clone)]
pub struct Recorder {
    state: AppState,
    /// Tells when the database answers again after an outage (see [`super::recovery`]).
    recovery: Arc<Recovery>,
}

impl Recorder {
    /// A recorder for `state`'s database, told by `recovery` when it answers again.
    pub(super) fn new(state: AppState, recovery: Arc<Recovery>) -> Self {
        Recorder { state, recovery }
    }

    /// Records until every sender is gone, the inbox is empty and every batch is written.
    pub async fn run(self, mut inbox: mpsc::Receiver<Finished>) {
        let max_writers = match self.state.db.backend() {
            DbBackend::Postgres => MAX_WRITERS,
            _ => 1,
        };
        let mut writing: JoinSet<Vec<Finished>> = JoinSet::new();
        let mut batch: Vec<Finished> = Vec::with_capacity(MAX_BATCH);
        // Whether `batch` holds an outcome that settles a line's head, kept as it grows.
        let mut settles_a_head = false;
        let mut open = true;
        while open || !writing.is_empty() || !batch.is_empty() {
            if !batch.is_empty() && may_start(writing.len(), max_writers, settles_a_head) {
                settles_a_head = false;
                let full = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                let recorder = self.clone();
                writing.spawn(async move {
                    recorder.write(&full).await;
                    full
                });
                continue;
            }
            // Some branch is always enabled here: with nothing being written, a batch that
            // is full, or waits after the inbox closed, has just been started above.
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                biased;
                // A written batch is dropped here, and its recording permits with it.
                Some(written) = writing.join_next(), if !writing.is_empty() => {
                    if let Err(err) = written {
                        // The batch's permits were freed as its task unwound; its claims
                        // are reclaimed after their lease.
                        tracing::error!(error = %err, "writing a batch of outcomes failed");
                    }
                }
                received = inbox.recv_many(&mut batch, room), if open && room > 0 => {
                    if received == 0 {
                        open = false;
                    }
                    settles_a_head |= batch[batch.len() - received..]
                        .iter()
                        .any(|finished| settles_a_line_head(&finished.attempt));
                }
            }
        }
    }

    /// Writes one batch; see [`Recorder::write_isolating`].
    async fn write(&self, batch: &[Finished]) {
        let attempts: Vec<FinishedAttempt> = batch.iter().map(|f| f.attempt.clone()).collect();
        self.write_isolating(&attempts).await;
    }

    /// Writes `attempts` in one transaction. When the database refuses it (rather than
    /// failing to answer), retrying the same batch cannot help: each half is written on its
    /// own, down to the outcome it refuses, which alone is given up. One bad outcome costs a
    /// few quick statements instead of holding every outcome written with it for minutes.
    async fn write_isolating(&self, attempts: &[FinishedAttempt]) {
        match self.write_retrying(attempts).await {
            Ok(recorded) => {
                let mut handed_on = false;
                for (attempt, recorded) in attempts.iter().zip(recorded) {
                    handed_on |= recorded.new_state.is_some() && settles_a_line_head(attempt);
                    self.report(attempt, &recorded);
                }
                if handed_on {
                    // A settled head made the next delivery of its line due, which no
                    // state change announces: the claiming loop looks at once, rather
                    // than at its next poll.
                    self.state.wakeup.hint();
                }
            }
            Err(Unwritten::Refused(err)) if attempts.len() > 1 => {
                tracing::warn!(error = %error_chain(&err), outcomes = attempts.len(),
                    "the database refused a batch of outcomes; writing each half on its own");
                let (first, second) = attempts.split_at(attempts.len() / 2);
                Box::pin(self.write_isolating(first)).await;
                Box::pin(self.write_isolating(second)).await;
            }
            Err(Unwritten::Refused(err) | Unwritten::Unreachable(err)) => {
                self.state
                    .metrics
                    .outcomes_given_up
                    .inc_by(attempts.len() as u64);
                for attempt in attempts {
                    tracing::error!(delivery_id = %attempt.claim.delivery_id, error = %error_chain(&err),
                        "recording failed; the delivery will be reclaimed after its lease");
                }
            }
        }
    }

    /// Tries to write `attempts` in one transaction (each try within the database deadline; a
    /// try whose commit went unacknowledged is recognised by the next, which adds no second
    /// attempt for the same claim). An unreachable or busy database is retried: a result
    /// written after its lease ran out is still safe (the claim-token fence marks it
    /// superseded if another worker took over, and applies it if nobody did), so outcomes
    /// are not dropped just because they are late; only a shutdown or [`GIVE_UP_AFTER`] ends
    /// those retries. A refusal ends them at once for a batch, which the caller splits,
    /// and after [`REFUSED_TRIES`] for a single outcome.
    async fn write_retrying(
        &self,
        attempts: &[FinishedAttempt],
    ) -> Result<Vec<Recorded>, Unwritten> {
        let started = std::time::Instant::now();
        let mut returns = self.state.db.returns();
        // Claims wait while outcomes the database could not take are held (see
        // [`super::recovery`]).
        let mut holding = None;
        let mut backoff = FIRST_BACKOFF;
        let (mut tries, mut refusals) = (0, 0);
        let policy = HealthPolicy {
            disable_after_failures: self.state.config.disable_after_failures,
        };
        loop {
            tries += 1;
            let db = &self.state.db;
            let err = match db
                .within_deadline(record(db, &self.state.bus, policy, attempts))
                .await
            {
                Ok(recorded) => return Ok(recorded),
                Err(err) => err,
            };
            let stopping = self.state.shutdown.is_cancelled() && tries >= 3;
            if is_unavailable(&err) && holding.is_none() {
                holding = Some(self.recovery.hold(attempts.len()));
            }
            if is_unavailable(&err) || is_transient(&err) {
                if started.elapsed() >= GIVE_UP_AFTER || stopping {
                    return Err(Unwritten::Unreachable(err));
                }
            } else {
                refusals += 1;
                if attempts.len() > 1 || refusals >= REFUSED_TRIES || stopping {
                    return Err(Unwritten::Refused(err));
                }
            }
            self.state.metrics.recording_retries.inc();
            tracing::warn!(error = %error_chain(&err), outcomes = attempts.len(), "recording failed; retrying");
            // A database found back after an outage is written to at once: claims wait
            // meanwhile, so what was held through it is recorded before they resume.
            tokio::select! {
                () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(MAX_BACKOFF),
                Ok(()) = returns.changed() => backoff = FIRST_BACKOFF,
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
                let outcome = &attempt.outcome;
                // Numbers as numbers (a JSON log line's `status` is 204, not "204"); no
                // status when nothing answered.
                let status = outcome.status;
                let error = outcome.error.as_deref().unwrap_or_default();
                let duration_ms = u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX);
                tracing::debug!(%delivery_id, attempt = recorded.number, state = %state.to_value(), "attempt recorded");
                match attempt.step {
                    NextStep::Delivered => {
                        let latency = (attempt.finished_at - attempt.claim.created_at)
                            .to_std()
                            .unwrap_or_default();
                        metrics.delivery_latency.observe(latency.as_secs_f64());
                        tracing::info!(%delivery_id, attempt = recorded.number, status, duration_ms, "delivered");
                    }
                    NextStep::RetryAfter(delay) => {
                        let next_attempt_at = recorded
                            .next_attempt_at
                            .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                            .unwrap_or_default();
                        let retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                        tracing::info!(%delivery_id, attempt = recorded.number, status, error, duration_ms,
                            retry_in_ms, %next_attempt_at, "attempt failed; retry scheduled");
                        self.wake_for_retry(delay);
                    }
                    NextStep::Failed if super::health::is_gone(outcome) => {
                        tracing::info!(%delivery_id, attempt = recorded.number, status, error, duration_ms,
                            "delivery failed: the endpoint answered 410 Gone, so no retry; replay it once the endpoint is enabled again");
                    }
                    NextStep::Failed => {
                        tracing::info!(%delivery_id, attempt = recorded.number, status, error, duration_ms,
                            "delivery failed: the cycle's attempts are spent; replay it to try again");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::claim::Claim;
    use crate::worker::dispatch::{AttemptOutcome, OutcomeKind};
    use entity::webhook_delivery::DeliveryState;
    use uuid::Uuid;

    fn attempt(ordering_key: Option<&str>, step: NextStep) -> FinishedAttempt {
        let now = chrono::Utc::now();
        FinishedAttempt {
            claim: Claim {
                delivery_id: Uuid::now_v7(),
                claim_token: Uuid::new_v4(),
                previous_state: DeliveryState::Pending,
                cycle_attempts: 0,
                endpoint_id: Uuid::now_v7(),
                submission_id: Uuid::now_v7(),
                created_at: now,
                lease_expires_at: now,
                ordering_key: ordering_key.map(str::to_owned),
                event_type: None,
            },
            outcome: AttemptOutcome {
                status: Some(204),
                error: None,
                retry_after: None,
                duration: Duration::from_millis(1),
                kind: OutcomeKind::Success,
                answer: None,
            },
            step,
            started_at: now,
            finished_at: now,
        }
    }

    #[test]
    fn only_a_settled_head_of_a_line_is_waited_on() {
        assert!(settles_a_line_head(&attempt(
            Some("order-1"),
            NextStep::Delivered
        )));
        assert!(settles_a_line_head(&attempt(
            Some("order-1"),
            NextStep::Failed
        )));
        let retry = NextStep::RetryAfter(Duration::from_secs(5));
        assert!(!settles_a_line_head(&attempt(Some("order-1"), retry)));
        assert!(!settles_a_line_head(&attempt(None, NextStep::Delivered)));
    }

    #[test]
    fn a_second_batch_starts_only_for_a_line_head_and_only_with_room() {
        // Nothing being written: any batch starts.
        assert!(may_start(0, MAX_WRITERS, false));
        assert!(may_start(0, 1, true));
        // One being written: only a batch a line waits on starts beside it.
        assert!(!may_start(1, MAX_WRITERS, false));
        assert!(may_start(1, MAX_WRITERS, true));
        // Never more than the most writers (one on SQLite).
        assert!(!may_start(MAX_WRITERS, MAX_WRITERS, true));
        assert!(!may_start(1, 1, true));
    }
}
