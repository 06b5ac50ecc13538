//! What every way in (`submit` and `publish`) does around storing, written once: validate
//! the idempotency key and the payload, count against the caller's rate limit, hash the
//! content, answer a repeat, and count what became of it.

use std::sync::Arc;

use serde_json::Value;

use crate::auth::Identity;
use crate::bus::Wakeup;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, SubmissionOutcome};
use crate::service::payload::{self, canonical::payload_hash};
use crate::service::rate_limit::RateLimiter;

/// Longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// The shared front and back of the submission pipeline. A cheap clone.
#[derive(Clone, Debug)]
pub struct Intake {
    rate_limiter: RateLimiter,
    max_payload_bytes: usize,
    wakeup: Wakeup,
    metrics: Arc<Metrics>,
}

/// Who wrote a payload: the limit on payloads (`COURIER_MAX_PAYLOAD_BYTES`) is for
/// callers' own; Courier's (a test webhook, a few hundred bytes) is sent whatever it is set
/// to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFrom {
    /// The caller (`submit`, `publish`).
    Caller,
    /// Courier itself (`sendTestEvent`).
    Courier,
}

/// A submission's content, accepted: ready to store.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The idempotency key, validated.
    pub key: Option<String>,
    /// The payload, validated.
    pub payload: Value,
    /// The canonical hash of the payload, to tell a repeat from a conflict.
    pub hash: String,
}

impl Intake {
    /// The pipeline around `rate_limiter`; `wakeup` is hinted after new deliveries commit.
    pub fn new(
        rate_limiter: RateLimiter,
        max_payload_bytes: usize,
        wakeup: Wakeup,
        metrics: Arc<Metrics>,
    ) -> Self {
        Intake {
            rate_limiter,
            max_payload_bytes,
            wakeup,
            metrics,
        }
    }

    /// Validates `key` and `payload` (held to the payload limit when it comes from the
    /// caller), then counts once against the caller's rate limit (after validation, so bad
    /// input spends none of it), and hashes the content.
    pub async fn accept(
        &self,
        caller: &Identity,
        key: Option<String>,
        payload: Value,
        from: PayloadFrom,
    ) -> Result<Accepted> {
        let key = validate_key(key)?;
        let max_bytes = match from {
            PayloadFrom::Caller => self.max_payload_bytes,
            PayloadFrom::Courier => usize::MAX,
        };
        let payload = payload::accept(payload, max_bytes)?;
        if let Err(err) = self.rate_limiter.check(&caller.key_id.to_string()).await {
            self.metrics.submission(SubmissionOutcome::RateLimited);
            return Err(err);
        }
        let hash =
            payload_hash(&payload).map_err(|err| Error::bad_input(format!("payload: {err}")))?;
        Ok(Accepted { key, payload, hash })
    }

    /// An earlier submission holds the key: with `same_content` it is the answer
    /// (`created: false`); otherwise the repeat is an `IDEMPOTENCY_CONFLICT`.
    pub fn repeat(&self, same_content: bool) -> Result<()> {
        if same_content {
            self.metrics.submission(SubmissionOutcome::Deduplicated);
            Ok(())
        } else {
            self.metrics.submission(SubmissionOutcome::Conflicted);
            Err(Error::IdempotencyConflict)
        }
    }

    /// Something new committed with `deliveries` new deliveries waiting for a claim:
    /// counted, and the worker hinted when there is something to deliver.
    pub fn stored(&self, outcome: SubmissionOutcome, deliveries: usize) {
        self.metrics.submission(outcome);
        if deliveries > 0 {
            self.wakeup.hint();
        }
    }
}

/// An idempotency key is optional; when given it is 1 to 255 characters.
fn validate_key(key: Option<String>) -> Result<Option<String>> {
    match key {
        None => Ok(None),
        Some(key) if key.is_empty() => Err(Error::bad_input("idempotencyKey must not be empty")),
        Some(key) if key.chars().any(char::is_control) => Err(Error::bad_input(
            "idempotencyKey must not contain control characters",
        )),
        Some(key) if key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS => Err(Error::bad_input(
            format!("idempotencyKey must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        )),
        Some(key) => Ok(Some(key)),
    }
}
