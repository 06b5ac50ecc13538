//! Fixed-window rate limits shared by every Courier process: one atomic upsert per request.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sea_orm::{ConnectionTrait, DbErr, Statement};
use tokio_util::sync::CancellationToken;

use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Counts one request and returns the window's total, atomically, whatever other
/// processes do at the same moment: the database serialises the increments on the
/// primary key. Settles race 5 (no lost increment, no over-admission).
const COUNT_REQUEST: &str = "\
INSERT INTO rate_limit_counters (limiter, subject, window_start, attempts) \
VALUES ($1, $2, $3, 1) \
ON CONFLICT (limiter, subject, window_start) \
DO UPDATE SET attempts = rate_limit_counters.attempts + 1 \
RETURNING attempts";

/// Deletes windows that ended before `$1`.
const PRUNE_WINDOWS: &str = "DELETE FROM rate_limit_counters WHERE window_start < $1";

/// How many times a counter statement is tried before the request is let through.
const MAX_TRIES: u32 = 5;

/// A fixed-window limit on one kind of request.
#[derive(Clone, Debug)]
pub struct RateLimiter {
    db: Db,
    limiter: &'static str,
    limit: Option<u32>,
    window: Duration,
    metrics: Arc<Metrics>,
}

impl RateLimiter {
    /// A limiter named `limiter` allowing `limit` requests per subject per `window`
    /// (`None`: unlimited, nothing is counted).
    pub fn new(
        db: Db,
        limiter: &'static str,
        limit: Option<u32>,
        window: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        RateLimiter {
            db,
            limiter,
            limit,
            window: window.max(Duration::from_secs(1)),
            metrics,
        }
    }

    /// Counts a request by `subject` and refuses it with [`Error::RateLimited`] when the
    /// window's budget is spent. The count commits on its own, before any business
    /// transaction, so a later rollback never refunds quota. If the counter cannot be
    /// read after a few tries, the request is allowed and the failure alerted.
    pub async fn check(&self, subject: &str) -> Result<()> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let now = db::now();
        let (window_start, window_end) = self.window_of(now);
        match self.count(subject, window_start).await {
            Ok(attempts) if attempts <= i64::from(limit) => Ok(()),
            Ok(_) => {
                let remaining_ms = (window_end - now).num_milliseconds().max(0) as u64;
                Err(Error::RateLimited {
                    retry_after_secs: remaining_ms.div_ceil(1000).max(1),
                })
            }
            Err(err) => {
                self.metrics.rate_limit_errors.inc();
                tracing::error!(
                    alert = "rate_limit_counter_unavailable",
                    limiter = self.limiter,
                    error = %crate::error::error_chain(&err),
                    "rate-limit counter failed; allowing the request"
                );
                Ok(())
            }
        }
    }

    fn window_of(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        fixed_window(now, self.window)
    }

    async fn count(&self, subject: &str, window_start: DateTime<Utc>) -> Result<i64, DbErr> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.count_once(subject, window_start).await {
                Ok(attempts) => return Ok(attempts),
                Err(err) if tries < MAX_TRIES && db::is_transient(&err) => {
                    let backoff =
                        Duration::from_millis(5 * u64::from(tries) + rand::random_range(0..5));
                    tokio::time::sleep(backoff).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// One upsert in its own transaction. On PostgreSQL the transaction is READ
    /// COMMITTED whatever the database default, so concurrent increments queue on the
    /// row lock instead of failing with serialization errors.
    async fn count_once(&self, subject: &str, window_start: DateTime<Utc>) -> Result<i64, DbErr> {
        let backend = self.db.backend();
        let txn = self.db.begin_read_committed().await?;
        let row = txn
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                COUNT_REQUEST,
                [self.limiter.into(), subject.into(), window_start.into()],
            ))
            .await?
            .ok_or_else(|| DbErr::RecordNotFound("rate-limit counter".into()))?;
        let attempts: i64 = row.try_get("", "attempts")?;
        txn.commit().await?;
        Ok(attempts)
    }

    /// Deletes counters of windows that have ended. Returns how many were removed.
    pub async fn prune(&self) -> Result<u64, DbErr> {
        let (current_start, _) = self.window_of(db::now());
        let result = self
            .db
            .conn()
            .execute_raw(Statement::from_sql_and_values(
                self.db.backend(),
                PRUNE_WINDOWS,
                [current_start.into()],
            ))
            .await?;
        Ok(result.rows_affected())
    }

    /// Deletes ended windows once per window until `shutdown`; a no-op when unlimited.
    pub async fn prune_until(self, shutdown: CancellationToken) {
        if self.limit.is_none() {
            return;
        }
        let mut ticks = tokio::time::interval(self.window.max(Duration::from_secs(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            match self.prune().await {
                Ok(0) => {}
                Ok(removed) => {
                    tracing::debug!(removed, limiter = self.limiter, "pruned rate-limit windows")
                }
                Err(err) => tracing::warn!(error = %err, "pruning rate-limit windows failed"),
            }
        }
    }
}

/// The fixed window containing `now`: `[start, end)`, aligned to the Unix epoch.
fn fixed_window(now: DateTime<Utc>, window: Duration) -> (DateTime<Utc>, DateTime<Utc>) {
    let window = window.as_secs().max(1) as i64;
    let start_secs = now.timestamp().div_euclid(window) * window;
    let start = Utc.timestamp_opt(start_secs, 0).single().unwrap_or(now);
    (start, start + chrono::Duration::seconds(window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_and_contain_now() {
        let at = |h, m, s| {
            Utc.with_ymd_and_hms(2026, 11, 30, h, m, s)
                .single()
                .unwrap()
        };
        let (start, end) = fixed_window(at(12, 34, 56), Duration::from_secs(60));
        assert_eq!((start, end), (at(12, 34, 0), at(12, 35, 0)));
        let (start, end) = fixed_window(at(12, 34, 0), Duration::from_secs(3600));
        assert_eq!((start, end), (at(12, 0, 0), at(13, 0, 0)));
    }
}
