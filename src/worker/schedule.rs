//! The retry schedule: listed delays (the default spans a day) or doubling from a base,
//! with jitter, honouring `Retry-After`. Pure arithmetic, and the parser of
//! `COURIER_RETRY_SCHEDULE`.

use std::sync::Arc;
use std::time::Duration;

use crate::service::flow::MAX_PAUSE;

/// The default schedule: the delays after each failed attempt of a cycle. Quick at first,
/// so a blip (a deploy, a restart) costs seconds, then hours apart, so a receiver that is
/// down for an afternoon or a night loses nothing: ten attempts over about 32.6 hours, and
/// at least 26 hours even when jitter shortens every delay as much as it can.
pub const DEFAULT_SCHEDULE: &str = "5s,30s,2m,5m,30m,2h,6h,12h,12h";

/// [`DEFAULT_SCHEDULE`]'s delays.
pub const DEFAULT_DELAYS: [Duration; 9] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3_600),
    Duration::from_secs(6 * 3_600),
    Duration::from_secs(12 * 3_600),
    Duration::from_secs(12 * 3_600),
];

/// Attempts per cycle when doubling is asked for without `COURIER_MAX_ATTEMPTS`.
pub const DEFAULT_DOUBLING_ATTEMPTS: u32 = 8;

/// First delay when doubling is asked for without `COURIER_RETRY_BASE_MS`.
pub const DEFAULT_DOUBLING_BASE: Duration = Duration::from_secs(1);

/// Most delays a schedule may list (attempts per cycle are delays + 1, at most 100).
pub const MAX_LISTED_DELAYS: usize = 99;

/// Up to this fraction of each delay is shaved off at random, so retries of many
/// deliveries that failed together spread out instead of arriving in a burst.
pub const JITTER_FRACTION: f64 = 0.2;

/// How long the retries of a cycle wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delays {
    /// `base x 2^(n-1)` before retry `n`, never more than the policy's `max`, for
    /// `attempts` attempts per cycle.
    Doubling {
        /// Delay after the first failed attempt.
        base: Duration,
        /// Attempts per cycle.
        attempts: u32,
    },
    /// Retry `n` waits the `n`th delay; attempts per cycle are the delays + 1.
    Listed(Arc<[Duration]>),
}

/// How a delivery is retried within one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The delays themselves.
    pub delays: Delays,
    /// The longest delay: doubling delays stop growing here.
    pub max: Duration,
}

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
    /// Doubling delays from `base`, capped at `max`, `attempts` per cycle.
    pub fn doubling(base: Duration, max: Duration, attempts: u32) -> Self {
        RetryPolicy {
            delays: Delays::Doubling {
                base,
                attempts: attempts.max(1),
            },
            max: max.max(base),
        }
    }

    /// The listed delays; `max` is at least the longest of them.
    pub fn listed(delays: &[Duration], max: Duration) -> Self {
        let longest = delays.iter().copied().max().unwrap_or_default();
        RetryPolicy {
            delays: Delays::Listed(delays.into()),
            max: max.max(longest),
        }
    }

    /// Attempts per cycle; the last failure makes the delivery `failed`.
    pub fn attempts_per_cycle(&self) -> u32 {
        match &self.delays {
            Delays::Doubling { attempts, .. } => *attempts,
            Delays::Listed(delays) => u32::try_from(delays.len() + 1).unwrap_or(u32::MAX),
        }
    }

    /// The delays of a whole cycle without jitter, in order.
    pub fn nominal_delays(&self) -> Vec<Duration> {
        (1..self.attempts_per_cycle())
            .map(|attempt| self.delay(attempt, None, 0.0))
            .collect()
    }

    /// How long a cycle lasts from its first attempt to its last, without jitter or
    /// `Retry-After` (and not counting the requests themselves).
    pub fn span(&self) -> Duration {
        self.nominal_delays().into_iter().sum()
    }

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
        } else if attempt_in_cycle >= self.attempts_per_cycle() {
            NextStep::Failed
        } else {
            NextStep::RetryAfter(self.delay(attempt_in_cycle, retry_after, jitter))
        }
    }

    /// The delay after failed attempt `attempt_in_cycle` (from 1), minus up to
    /// [`JITTER_FRACTION`] of it, and at least any `Retry-After` up to [`MAX_PAUSE`]: the
    /// delivery that was answered waits as long as the endpoint's pause, no longer.
    pub fn delay(
        &self,
        attempt_in_cycle: u32,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> Duration {
        let planned = match &self.delays {
            Delays::Doubling { base, .. } => {
                let exponent = attempt_in_cycle.saturating_sub(1).min(31);
                base.saturating_mul(1u32 << exponent).min(self.max)
            }
            Delays::Listed(delays) => {
                let index = usize::try_from(attempt_in_cycle.saturating_sub(1)).unwrap_or(0);
                delays
                    .get(index.min(delays.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or_default()
            }
        };
        let jitter = jitter.clamp(0.0, 1.0);
        let jittered = planned.mul_f64(1.0 - JITTER_FRACTION * jitter);
        jittered.max(retry_after.unwrap_or(Duration::ZERO).min(MAX_PAUSE))
    }
}

/// What a schedule looks like, as a refusal of one says.
const EXPECTED_DELAYS: &str =
    "expected delays such as 5s,5m,30m,2h,5h,10h,10h (units ms, s, m, h, d)";

/// Parses a schedule such as `5s,5m,30m,2h,5h,10h,10h`: comma-separated delays, each a
/// whole number with a unit (`ms`, `s`, `m`, `h` or `d`), each above zero and at most
/// `longest`, at most [`MAX_LISTED_DELAYS`] of them.
pub fn parse_schedule(text: &str, longest: Duration) -> Result<Vec<Duration>, String> {
    if text.trim().is_empty() {
        return Err(format!("no delays listed; {EXPECTED_DELAYS}"));
    }
    let delays = text
        .split(',')
        .map(|part| parse_delay(part.trim(), longest))
        .collect::<Result<Vec<_>, _>>()?;
    if delays.len() > MAX_LISTED_DELAYS {
        return Err(format!(
            "{} delays listed; at most {MAX_LISTED_DELAYS} (attempts per cycle are the delays + 1, at most 100)",
            delays.len()
        ));
    }
    Ok(delays)
}

/// One delay of a schedule: digits, then a unit.
fn parse_delay(part: &str, longest: Duration) -> Result<Duration, String> {
    let expected = EXPECTED_DELAYS;
    if part.is_empty() {
        return Err(format!(
            "an empty delay (two commas in a row, or one at either end); {expected}"
        ));
    }
    let split = part
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{part:?} has no unit; {expected}"))?;
    let (digits, unit) = part.split_at(split);
    let amount: u64 = digits
        .parse()
        .map_err(|_| format!("{part:?} does not start with a whole number; {expected}"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{part:?} has an unknown unit {unit:?}; {expected}")),
    };
    let delay = Duration::from_millis(amount.saturating_mul(unit_ms));
    if delay.is_zero() {
        return Err(format!(
            "{part:?} is no delay at all; every delay must be above zero"
        ));
    }
    if delay > longest {
        return Err(format!(
            "{part:?} is longer than the longest retry delay accepted ({} days)",
            longest.as_secs() / 86_400
        ));
    }
    Ok(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubling() -> RetryPolicy {
        RetryPolicy::doubling(Duration::from_secs(1), Duration::from_secs(60), 5)
    }

    fn default_schedule() -> RetryPolicy {
        let delays = parse_schedule(DEFAULT_SCHEDULE, Duration::from_secs(30 * 86_400)).unwrap();
        assert_eq!(
            delays, DEFAULT_DELAYS,
            "the documented text and the delays agree"
        );
        RetryPolicy::listed(&delays, Duration::from_secs(3_600))
    }

    #[test]
    fn delays_double_from_the_base_and_stop_at_the_cap() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| doubling().delay(n, None, 0.0).as_secs())
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            doubling().delay(200, None, 0.0),
            Duration::from_secs(60),
            "huge counts do not overflow"
        );
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_fifth() {
        for jitter in [0.0, 0.25, 0.5, 0.999] {
            let delay = doubling().delay(3, None, jitter);
            assert!(
                delay <= Duration::from_secs(4) && delay >= Duration::from_millis(3200),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_hour_an_endpoint_pause_lasts_at_most() {
        assert_eq!(
            doubling().delay(1, Some(Duration::from_secs(30)), 0.5),
            Duration::from_secs(30)
        );
        assert_eq!(
            doubling().delay(1, Some(Duration::from_secs(3600)), 0.0),
            Duration::from_secs(3600),
            "as long as the pause, though doubling delays stop at a minute"
        );
        assert_eq!(
            doubling().delay(1, Some(Duration::from_secs(36_000)), 0.0),
            MAX_PAUSE,
            "ten hours asked, one hour kept"
        );
        assert_eq!(
            doubling().delay(4, Some(Duration::from_secs(1)), 0.0),
            Duration::from_secs(8),
            "a shorter Retry-After does not hurry"
        );
    }

    #[test]
    fn the_last_attempt_of_a_cycle_fails_the_delivery() {
        assert_eq!(
            doubling().next_step(true, 5, None, 0.0),
            NextStep::Delivered
        );
        assert_eq!(
            doubling().next_step(false, 4, None, 0.0),
            NextStep::RetryAfter(Duration::from_secs(8))
        );
        assert_eq!(doubling().next_step(false, 5, None, 0.0), NextStep::Failed);
    }

    #[test]
    fn the_default_schedule_spans_more_than_a_day_even_fully_jittered() {
        let policy = default_schedule();
        assert_eq!(policy.attempts_per_cycle(), 10);
        let span = policy.span();
        assert_eq!(span, Duration::from_secs(117_455));
        let shortest: Duration = (1..policy.attempts_per_cycle())
            .map(|n| policy.delay(n, None, 0.999_999))
            .sum();
        assert!(shortest >= Duration::from_secs(24 * 3_600), "{shortest:?}");
        assert_eq!(
            policy.nominal_delays()[..3],
            [
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(120)
            ]
        );
    }

    #[test]
    fn a_listed_schedule_sets_the_attempts_and_each_delay() {
        let delays =
            parse_schedule("5s,5m,30m,2h,5h,10h,10h", Duration::from_secs(86_400)).unwrap();
        let policy = RetryPolicy::listed(&delays, Duration::from_secs(60));
        assert_eq!(policy.attempts_per_cycle(), 8);
        assert_eq!(policy.delay(2, None, 0.0), Duration::from_secs(300));
        assert_eq!(
            policy.delay(7, None, 0.0),
            Duration::from_secs(36_000),
            "not capped by max"
        );
        assert_eq!(
            policy.next_step(false, 7, None, 0.0),
            NextStep::RetryAfter(Duration::from_secs(36_000))
        );
        assert_eq!(policy.next_step(false, 8, None, 0.0), NextStep::Failed);
        let jittered = policy.delay(2, None, 0.5);
        assert!(jittered < Duration::from_secs(300) && jittered >= Duration::from_secs(240));
        // Retry-After is honoured up to an hour, whatever the listed delays.
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(7_200)), 0.0),
            MAX_PAUSE
        );
        assert_eq!(
            policy.delay(6, Some(Duration::from_secs(90_000)), 0.0),
            Duration::from_secs(36_000),
            "a longer listed delay stays"
        );
        assert_eq!(
            policy.span(),
            Duration::from_secs(5 + 300 + 1_800 + 7_200 + 18_000 + 72_000)
        );
    }

    #[test]
    fn schedules_that_make_no_sense_are_refused_with_the_reason() {
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(
            parse_schedule(" 250ms, 1s ,2m,1d", month).unwrap(),
            vec![
                Duration::from_millis(250),
                Duration::from_secs(1),
                Duration::from_secs(120),
                Duration::from_secs(86_400)
            ]
        );
        for (text, reason) in [
            ("", "no delays listed"),
            ("  ", "no delays listed"),
            ("5", "no unit"),
            ("5s,,1m", "an empty delay"),
            ("5s,", "an empty delay"),
            ("s", "whole number"),
            ("-5s", "whole number"),
            ("5 s", "unknown unit"),
            ("5w", "unknown unit"),
            ("0s", "above zero"),
            ("31d", "longer than"),
            ("99999999999999999999s", "whole number"),
        ] {
            let err = parse_schedule(text, month).unwrap_err();
            assert!(err.contains(reason), "{text:?}: {err}");
        }
        let hundred = vec!["1s"; 100].join(",");
        assert!(parse_schedule(&hundred, month)
            .unwrap_err()
            .contains("at most 99"));
        assert_eq!(
            parse_schedule(&vec!["1s"; 99].join(","), month)
                .unwrap()
                .len(),
            99
        );
    }
}
