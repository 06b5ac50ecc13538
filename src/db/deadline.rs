//! Deadlines on database work: a database that stops answering is reported within seconds
//! (as `SERVICE_UNAVAILABLE`), and a connection abandoned at a deadline never pins the pool.
//!
//! What sqlx does with abandoned work: dropping a query future (or a transaction) returns
//! its connection to the pool through a background check that pings it, which first drains
//! whatever the abandoned statement still has to say, and closes the connection if that
//! fails. So the next user never gets a connection in the middle of someone else's
//! statement. That check has no deadline of its own, though: on a silent network it waits
//! as long as TCP does (minutes), holding a pool slot all that time. [`check_on_release`]
//! bounds it while deadlines are being missed. A connection idle for longer than
//! [`PING_WHEN_IDLE_FOR`] is pinged when it is taken from the pool, within the acquire
//! timeout, and dropped if it does not answer; one that came back moments ago answered that
//! ping on its way back, so it is handed out as it is ([`ping_if_idle`]: a round trip less
//! per use of the pool while it is busy).
//!
//! sqlx offers no TCP keepalive or socket timeout: what bounds a silent connection is the
//! check above. (Over TLS that needs sqlx-core 0.9.1 or later: 0.9.0 flushed a TLS stream
//! by reading from the peer, so a silent TLS connection could not be closed, and kept its
//! slot until the kernel gave up on it.)

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sea_orm::{DbErr, RuntimeErr};
use sqlx::pool::PoolConnectionMetadata;

use super::Db;

/// How long database work may wait before it is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Waiting for a connection from the pool, opening one included (TCP connect, TLS,
    /// start-up): a database that stopped answering is usually noticed here first.
    pub acquire: Duration,
    /// All the database work of one request, or of one step of a background task.
    pub work: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            acquire: Duration::from_secs(3),
            work: Duration::from_secs(5),
        }
    }
}

/// How long after a missed deadline returning connections are still checked under one.
const SUSPICIOUS_FOR: Duration = Duration::from_secs(60);

/// When database work last missed its deadline, shared by a pool and every clone of its [`Db`].
#[derive(Debug)]
pub(super) struct MissedDeadlines {
    since: Instant,
    /// Milliseconds from `since` to the last miss, plus one; 0: never.
    last: AtomicU64,
}

impl Default for MissedDeadlines {
    fn default() -> Self {
        MissedDeadlines {
            since: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl MissedDeadlines {
    fn record(&self) {
        let at = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last.store(at + 1, Ordering::Relaxed);
    }

    /// Whether a deadline was missed lately, so connections may be stuck mid-statement.
    fn recent(&self) -> bool {
        self.recent_at(self.since.elapsed())
    }

    /// [`MissedDeadlines::recent`], `now` counted from `since`.
    fn recent_at(&self, now: Duration) -> bool {
        match self.last.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let now = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
                now.saturating_sub(last - 1) <= SUSPICIOUS_FOR.as_millis() as u64
            }
        }
    }
}

/// How long a connection may sit in the pool before it is pinged when next taken.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);

/// The pool's `before_acquire` hook, in place of sqlx's ping on every acquire
/// (`test_before_acquire`): only a connection idle for over [`PING_WHEN_IDLE_FOR`] is
/// pinged. An error makes sqlx close it and try another.
pub(super) fn ping_if_idle<C: sqlx::Connection>(
) -> impl for<'c> Fn(&'c mut C, PoolConnectionMetadata) -> BoxFuture<'c, Result<bool, sqlx::Error>>
       + Send
       + Sync
       + 'static {
    move |conn, meta| {
        Box::pin(async move {
            if meta.idle_for > PING_WHEN_IDLE_FOR {
                conn.ping().await?;
            }
            Ok(true)
        })
    }
}

/// The pool's `after_release` hook. While deadlines are being missed, a connection coming
/// back must answer a ping within `limit` or be closed (the pool then opens a fresh one in
/// its place), instead of holding its slot for as long as the network stays silent. In
/// normal operation it costs nothing: sqlx's own check on release is all that runs.
pub(super) fn check_on_release<C: sqlx::Connection>(
    missed: Arc<MissedDeadlines>,
    limit: Duration,
) -> impl for<'c> Fn(&'c mut C, PoolConnectionMetadata) -> BoxFuture<'c, Result<bool, sqlx::Error>>
       + Send
       + Sync
       + 'static {
    move |conn, _meta| {
        let suspicious = missed.recent();
        Box::pin(async move {
            if !suspicious {
                return Ok(true);
            }
            match tokio::time::timeout(limit, conn.ping()).await {
                Ok(Ok(())) => Ok(true),
                // An error makes sqlx close the connection without a goodbye.
                Ok(Err(err)) => Err(err),
                Err(_) => Err(no_answer(limit)),
            }
        })
    }
}

impl Db {
    /// The deadlines this pool was opened with.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Runs `work`, giving it up after `limit` with an error that classifies as
    /// unavailable ([`crate::db::is_unavailable`]); while the database is found out of reach
    /// (see [`super::availability`]), turns it away at once with such an error. The work is
    /// dropped at the deadline: a transaction rolls back, and its connection returns to the
    /// pool only after answering a ping (see the module docs). A statement already sent may
    /// still complete on the server, as with any lost reply.
    pub async fn within<T, E: From<DbErr>>(
        &self,
        limit: Duration,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        if self.availability.unreachable() {
            return Err(E::from(super::availability::turned_away()));
        }
        // Pinned here, so the work is dropped (and its connection released) only on return,
        // after a miss is recorded: the connection is then checked on its way back.
        let mut work = std::pin::pin!(work);
        match tokio::time::timeout(limit, &mut work).await {
            Ok(result) => result,
            Err(_) => {
                self.missed.record();
                Err(E::from(deadline_missed(limit)))
            }
        }
    }

    /// [`Db::within`], but the deadline counts from the last progress `work` reported: work
    /// that keeps committing batches runs as long as it needs, and a database that stops
    /// answering is still given up on `limit` after the last batch.
    pub async fn within_progress<T, E: From<DbErr>>(
        &self,
        limit: Duration,
        progress: &Progress,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        if self.availability.unreachable() {
            return Err(E::from(super::availability::turned_away()));
        }
        let mut work = std::pin::pin!(work);
        loop {
            let until = progress.last() + limit;
            match tokio::time::timeout_at(until.into(), &mut work).await {
                Ok(result) => return result,
                Err(_) if progress.last() + limit > Instant::now() => continue,
                Err(_) => {
                    self.missed.record();
                    return Err(E::from(deadline_missed(limit)));
                }
            }
        }
    }

    /// [`Db::within`] the work deadline ([`Timeouts::work`]): for one request's database
    /// work, or one step of a background task.
    pub async fn within_deadline<T, E: From<DbErr>>(
        &self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.within(self.timeouts.work, work).await
    }
}

/// Progress reported by long work (a bulk replay's committed batches), which moves its
/// deadline on (see [`Db::within_progress`]). Clones share the same record.
#[derive(Clone, Debug)]
pub struct Progress {
    since: Instant,
    /// Milliseconds from `since` to the last progress.
    last: Arc<AtomicU64>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            since: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Progress {
    /// Records that the work moved on now.
    pub fn made(&self) {
        let elapsed = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(elapsed, Ordering::Relaxed);
    }

    /// When the work last moved on (its start, if never).
    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// The error for work given up at a deadline: like a socket timeout, since that is what it
/// stands for (the driver offers no socket timeouts of its own).
pub fn deadline_missed(limit: Duration) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(Arc::new(no_answer(limit))))
}

fn no_answer(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the database did not answer within {limit:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_deadlines_are_recent_for_a_while() {
        let missed = MissedDeadlines::default();
        assert!(!missed.recent(), "nothing missed yet");
        missed.record();
        assert!(missed.recent());
        let later = missed.since.elapsed() + SUSPICIOUS_FOR * 2;
        assert!(!missed.recent_at(later), "a miss long ago is forgotten");
    }
}
