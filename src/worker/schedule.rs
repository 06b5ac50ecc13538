//! The retry schedule: exponential backoff with jitter, capped, honouring `Retry-After`. Pure arithmetic.

use std::time::Duration;

/// How a delivery is retried within one cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// No delay is longer than this, whatever the attempt count or `Retry-After`.
    pub max: Duration,
    /// Attempts per cycle; the last failure makes the delivery `failed`.
    pub max_attempts: u32,
}

/// Up to this fraction of each delay is shaved off at random, so retries of many
/// deliveries that failed together spread out instead of arriving in a burst.
pub const JITTER_FRACTION: f64 = 0.2;

/// What happens after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// The endpoint accepted it.
    Delivered,
    /// Try again after this delay.
    RetryAfter(Duration),
    /// The cycle's attempts are spent.
    Failed,
}

impl RetryPolicy {
    /// The step after attempt number `attempt_in_cycle` (from 1) ended, given whether it
    /// succeeded, any `Retry-After` the endpoint sent, and `jitter` drawn from `[0, 1)`.
    pub fn next_step(
        &self,
        succeeded: bool,
        attempt_in_cycle: u32,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> NextStep {
        if succeeded {
            NextStep::Delivered
        } else if attempt_in_cycle >= self.max_attempts {
            NextStep::Failed
        } else {
            NextStep::RetryAfter(self.delay(attempt_in_cycle, retry_after, jitter))
        }
    }

    /// `base x 2^(n-1)`, minus up to [`JITTER_FRACTION`] of it, at least any
    /// `Retry-After`, and never more than `max`.
    pub fn delay(
        &self,
        attempt_in_cycle: u32,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> Duration {
        let exponent = attempt_in_cycle.saturating_sub(1).min(40);
        let backoff = self
            .base
            .saturating_mul(1u32 << exponent.min(31))
            .min(self.max);
        let jitter = jitter.clamp(0.0, 1.0);
        let jittered = backoff.mul_f64(1.0 - JITTER_FRACTION * jitter);
        jittered
            .max(retry_after.unwrap_or(Duration::ZERO))
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
        max_attempts: 5,
    };

    #[test]
    fn delays_double_from_the_base_and_stop_at_the_cap() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| POLICY.delay(n, None, 0.0).as_secs())
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            POLICY.delay(200, None, 0.0),
            Duration::from_secs(60),
            "huge counts do not overflow"
        );
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_fifth() {
        for jitter in [0.0, 0.25, 0.5, 0.999] {
            let delay = POLICY.delay(3, None, jitter);
            assert!(
                delay <= Duration::from_secs(4) && delay >= Duration::from_millis(3200),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_within_the_cap() {
        assert_eq!(
            POLICY.delay(1, Some(Duration::from_secs(30)), 0.5),
            Duration::from_secs(30)
        );
        assert_eq!(
            POLICY.delay(1, Some(Duration::from_secs(3600)), 0.0),
            Duration::from_secs(60)
        );
        assert_eq!(
            POLICY.delay(4, Some(Duration::from_secs(1)), 0.0),
            Duration::from_secs(8),
            "a shorter Retry-After does not hurry"
        );
    }

    #[test]
    fn the_last_attempt_of_a_cycle_fails_the_delivery() {
        assert_eq!(POLICY.next_step(true, 5, None, 0.0), NextStep::Delivered);
        assert_eq!(
            POLICY.next_step(false, 4, None, 0.0),
            NextStep::RetryAfter(Duration::from_secs(8))
        );
        assert_eq!(POLICY.next_step(false, 5, None, 0.0), NextStep::Failed);
    }
}
