//! Start-up warm-up: the connections the first requests and claims will use are opened,
//! and their caches filled, before the process reports ready.
//!
//! A PostgreSQL connection costs a new server process, and that process's first statement
//! on each table reads the catalogs to learn the table and its indexes. Left to the first
//! requests, several of them pay this together (the submission, the claim, the loading of
//! targets and the recording each on a fresh connection) and the first deliveries after
//! start wait tens of milliseconds for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use sea_orm::DbBackend;
use tokio::sync::Notify;

use crate::db::Db;

/// Names every table on the hot paths (submit, claim, send, record, authenticate), so each
/// connection's server process loads them and their indexes once, now. Matches no row.
const WARM_UP: &str = "\
SELECT 1
FROM webhook_deliveries d
JOIN submissions s ON s.id = d.submission_id
JOIN endpoints e ON e.id = d.endpoint_id
LEFT JOIN delivery_attempts a ON a.delivery_id = d.id
LEFT JOIN events ev ON ev.id = s.event_id
WHERE d.id = '00000000-0000-0000-0000-000000000000'
  AND EXISTS (SELECT 1 FROM api_keys k WHERE k.id = d.id)
  AND EXISTS (SELECT 1 FROM rate_limit_counters r WHERE r.subject = e.name)";

/// Opens every connection of the pool at once and warms each one (PostgreSQL; SQLite
/// connections are cheap and local). Best effort within `limit`: a warm-up that fails or
/// runs out of time leaves the work to the first requests, as without it.
pub async fn warm_up(db: &Db, limit: Duration) {
    if db.backend() != DbBackend::Postgres {
        return;
    }
    let pool = db.conn().get_postgres_connection_pool();
    let size = pool.options().get_max_connections();
    let started = std::time::Instant::now();
    let warm = async {
        // Held together, so that each is a separate connection.
        let connections = join_all((0..size).map(|_| pool.acquire())).await;
        let mut held = Vec::with_capacity(connections.len());
        for connection in connections {
            match connection {
                Ok(connection) => held.push(connection),
                Err(err) => tracing::warn!(error = %err, "warming up: cannot open a connection"),
            }
        }
        let warmed = join_all(
            held.iter_mut()
                .map(|connection| sqlx::query(WARM_UP).execute(&mut **connection)),
        )
        .await;
        if let Some(Err(err)) = warmed.into_iter().find(Result::is_err) {
            tracing::warn!(error = %err, "warming up a connection failed");
        }
        held.len()
    };
    match tokio::time::timeout(limit, warm).await {
        Ok(connections) => tracing::debug!(
            connections,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "database connections warmed up"
        ),
        Err(_) => tracing::warn!("warming up the database connections took too long; going on"),
    }
}

/// Runs `work` once on every connection of the pool at the same time (PostgreSQL), each in
/// a transaction of its own that commits, for statements that prepare and plan themselves
/// on first use: each connection keeps its prepared statements and their plans, so the
/// first requests after start-up find them made. The transactions wait for each other
/// before they end, so no two share a connection; one that fails before its work is done
/// (no connection, a failed `BEGIN`) is counted in as it ends, so it holds no one up.
/// Best effort within `limit`.
pub async fn warm_statements<F, Fut>(db: &Db, limit: Duration, work: F)
where
    F: Fn(super::Txn) -> Fut,
    Fut: std::future::Future<Output = Result<(), sea_orm::DbErr>>,
{
    if db.backend() != DbBackend::Postgres {
        return;
    }
    let size = db
        .conn()
        .get_postgres_connection_pool()
        .options()
        .get_max_connections() as usize;
    let meeting = Meeting::new(size);
    let (work, meeting) = (&work, &meeting);
    let warm = join_all((0..size).map(|_| async move {
        let arrived = AtomicBool::new(false);
        let arrived = &arrived;
        let done = db
            .transaction(|txn| async move {
                let done = work(txn).await;
                meeting.arrive(arrived);
                meeting.all_in().await;
                done
            })
            .await;
        meeting.arrive(arrived);
        if let Err(err) = done {
            tracing::debug!(error = %err, "warming up statements on a connection failed");
        }
    }));
    if tokio::time::timeout(limit, warm).await.is_err() {
        tracing::debug!("warming up statements took too long; going on");
    }
}

/// Where the warm-up transactions wait for each other: each party counts itself in once,
/// and [`Meeting::all_in`] returns once every party has.
struct Meeting {
    /// Parties not yet counted in.
    left: AtomicUsize,
    /// Told when the last one is.
    complete: Notify,
}

impl Meeting {
    /// A meeting of `parties`.
    fn new(parties: usize) -> Self {
        Self {
            left: AtomicUsize::new(parties),
            complete: Notify::new(),
        }
    }

    /// Counts in the party whose flag is `arrived`, unless it was already.
    fn arrive(&self, arrived: &AtomicBool) {
        if !arrived.swap(true, Ordering::AcqRel) && self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.complete.notify_waiters();
        }
    }

    /// Waits until every party is counted in.
    async fn all_in(&self) {
        loop {
            let complete = self.complete.notified();
            tokio::pin!(complete);
            // Registered before the count is read, so the last arrival cannot be missed.
            complete.as_mut().enable();
            if self.left.load(Ordering::Acquire) == 0 {
                return;
            }
            complete.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_party_that_ends_without_its_work_holds_no_one_up() {
        let meeting = std::sync::Arc::new(Meeting::new(3));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let meeting = meeting.clone();
                tokio::spawn(async move {
                    let arrived = AtomicBool::new(false);
                    meeting.arrive(&arrived);
                    meeting.arrive(&arrived);
                    meeting.all_in().await;
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "the two wait for the third, and counting in twice counts once"
        );
        // The third never reaches its work: it is counted in as it ends.
        meeting.arrive(&AtomicBool::new(false));
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the meeting completes")
                .expect("the waiter ran");
        }
    }
}
