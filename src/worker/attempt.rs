//! One attempt of a claimed delivery: its request (or none, when the cycle's attempts are
//! already spent), traced, and what comes next by the retry policy.

use std::time::Duration;

use tracing::Instrument as _;

use super::claim::Claim;
use super::dispatch::{AttemptOutcome, OutcomeKind, Webhook};
use super::health;
use super::record::FinishedAttempt;
use super::schedule::NextStep;
use super::targets::Target;
use super::Worker;
use crate::db;
use crate::telemetry::spans::{self, AttemptSpan};

impl Worker {
    /// Sends one delivery and decides what comes next.
    pub(super) async fn deliver(&self, claim: Claim, target: Option<Target>) -> FinishedAttempt {
        let started_at = db::now();
        let attempt_in_cycle = u32::try_from(claim.cycle_attempts).unwrap_or(0) + 1;
        let per_cycle = self.policy.attempts_per_cycle();
        if claim.attempts_spent(per_cycle) {
            // Every attempt of the cycle was made, the last without an outcome recorded
            // within its lease: another request would exceed the cycle (a receiver slower
            // than the lease would otherwise get one per lease, forever).
            tracing::warn!(delivery_id = %claim.delivery_id, attempts = per_cycle,
                "the cycle's attempts are spent, the last outlived its lease; the delivery fails");
            let outcome = AttemptOutcome {
                status: None,
                error: Some(format!(
                    "the cycle's {per_cycle} attempts are spent: the last one's outcome was not \
                     recorded within its lease (the receiver may be slower than \
                     COURIER_LEASE_SECS, or its process stopped)"
                )),
                retry_after: None,
                duration: Duration::ZERO,
                kind: OutcomeKind::LeaseSpent,
                answer: None,
            };
            return FinishedAttempt {
                claim,
                outcome,
                step: NextStep::Failed,
                started_at,
                finished_at: db::now(),
            };
        }
        let outcome = match &target {
            Some(target) => {
                let (span, trace) = spans::attempt(AttemptSpan {
                    delivery_id: claim.delivery_id,
                    endpoint_id: claim.endpoint_id,
                    attempt: attempt_in_cycle,
                    url: &target.url,
                    submitted_in: target.trace_context.as_deref(),
                });
                let outcome = self
                    .dispatcher
                    .send(&Webhook {
                        id: claim.delivery_id,
                        endpoint_id: claim.endpoint_id,
                        url: &target.url,
                        secret: &target.secret,
                        previous_secret: target.previous_secret.as_deref(),
                        body: &target.body,
                        ordering_key: claim.ordering_key.as_deref(),
                        trace: trace.as_ref(),
                    })
                    .instrument(span.clone())
                    .await;
                spans::attempt_finished(&span, outcome.status, outcome.error.as_deref());
                outcome
            }
            None => AttemptOutcome {
                status: None,
                // Nothing was sent: what to send could not be read (a claim whose secret
                // does not open here is handed back instead, see `super::unopened`).
                error: Some(
                    "not sent: the delivery's submission or endpoint could not be read".into(),
                ),
                retry_after: None,
                duration: Duration::ZERO,
                kind: OutcomeKind::Connection,
                answer: None,
            },
        };
        let finished_at = db::now();
        self.state.metrics.attempt(outcome.kind.as_str());
        // A 410 Gone is final: no retries (and the recorder disables the endpoint).
        let step = if health::is_gone(&outcome) {
            NextStep::Failed
        } else {
            self.policy.next_step(
                outcome.succeeded(),
                attempt_in_cycle,
                outcome.retry_after,
                rand::random::<f64>(),
            )
        };
        FinishedAttempt {
            claim,
            outcome,
            step,
            started_at,
            finished_at,
        }
    }
}
