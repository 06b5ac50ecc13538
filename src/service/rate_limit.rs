//! Fixed-window rate limits shared by every Courier process: one atomic upsert per request.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr};
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Counts one request and returns the window's total, atomically, whatever other
/// processes do at the same moment: the database serialises the increments on the
/// primary key. Settles race 5 (no lost increment, no over-admission). The window is the
/// one containing the database's now, so processes whose clocks disagree count together.
const COUNT_REQUEST: &str = "\
INSERT INTO rate_limit_counters (limiter, subject, window_start, attempts) \
VALUES ($1, $2, {window_start($3)}, 1) \
ON CONFLICT (limiter, subject, window_start) \
DO UPDATE SET attempts = rate_limit_counters.attempts + 1 \
RETURNING attempts, window_start, {now} AS counted_at";

/// Deletes windows that ended before the current one began.
const PRUNE_WINDOWS: &str =
    "DELETE FROM rate_limit_counters WHERE window_start < {window_start($1)}";

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
        match self.count(subject).await {
            Ok(counted) if counted.attempts <= i64::from(limit) => Ok(()),
            Ok(counted) => {
                let window =
                    chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX);
                let window_end = counted.window_start.checked_add_signed(window);
                let remaining_ms = window_end
                    .map(|end| (end - counted.at).num_milliseconds().max(0))
                    .unwrap_or(0) as u64;
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

    /// One upsert in its own transaction under the race policy ([`Db::transaction`]:
    /// READ COMMITTED on PostgreSQL whatever the database default, so concurrent increments
    /// queue on the row lock, and a bounded retry on transient conflicts).
    async fn count(&self, subject: &str) -> Result<Counted, DbErr> {
        let db = &self.db;
        let (limiter, window) = (self.limiter, self.window);
        db.transaction(|txn| async move {
            let clock = db.clock();
            let row = txn
                .query_one_raw(clock.statement(
                    COUNT_REQUEST,
                    [limiter.into(), subject.into(), clock.window(window)],
                ))
                .await?
                .ok_or_else(|| DbErr::RecordNotFound("rate-limit counter".into()))?;
            Ok(Counted {
                attempts: row.try_get("", "attempts")?,
                window_start: row.try_get("", "window_start")?,
                at: row.try_get("", "counted_at")?,
            })
        })
        .await
    }

    /// Deletes counters of windows that have ended. Returns how many were removed.
    pub async fn prune(&self) -> Result<u64, DbErr> {
        let clock = self.db.clock();
        let result = self
            .db
            .conn()
            .execute_raw(clock.statement(PRUNE_WINDOWS, [clock.window(self.window)]))
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
            match self.db.within_deadline(self.prune()).await {
                Ok(0) => {}
                Ok(removed) => {
                    tracing::debug!(removed, limiter = self.limiter, "pruned rate-limit windows")
                }
                Err(err) => tracing::warn!(error = %err, "pruning rate-limit windows failed"),
            }
        }
    }
}

/// One counted request, on the deciding clock.
struct Counted {
    /// Requests in the window so far, this one included.
    attempts: i64,
    /// When the window began.
    window_start: DateTime<Utc>,
    /// When the request was counted.
    at: DateTime<Utc>,
}
