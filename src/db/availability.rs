//! Whether the database can be reached, as a connection of its own finds it (PostgreSQL):
//! in a serving process, while it cannot, database work is answered unavailable at once
//! instead of queueing for the pool; while migrations run, one that stays out of reach
//! ends them with an error instead of a wait for ever on a connection gone silent.
//!
//! Why: the pool opens a connection on behalf of the request waiting longest, within what
//! is left of that request's wait. Under load, once the database refused or dropped
//! connections for a few seconds, the requests at the head of the queue had waited almost
//! their whole acquire timeout, so every new connection got milliseconds: too little for a
//! TLS handshake, and the pool never filled again. Every request answered 503 until the
//! load stopped. With work turned away at once while the probe finds the database out of
//! reach, no such queue forms, and once the probe connects again the next requests open
//! their connections with their whole wait ahead of them.
//!
//! Each outage found is counted, and each return told: the worker's claims wait after an
//! outage, and a claim that waited through one rolls back.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sea_orm::{ConnAcquireErr, DbErr};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Timeouts;

/// How often the probe looks.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Whether the database was last found out of reach, and when it was last found back.
/// Shared by a pool and every clone of its `Db`.
#[derive(Debug)]
pub(super) struct Availability {
    unreachable: AtomicBool,
    /// How many times the database has been found out of reach (see [`Availability::outages`]).
    outages: AtomicU64,
    /// Counts the times the database was found back after being out of reach, and tells
    /// each (see [`Availability::returns`]).
    returned: watch::Sender<Option<Instant>>,
}

impl Default for Availability {
    fn default() -> Self {
        Availability {
            unreachable: AtomicBool::new(false),
            outages: AtomicU64::new(0),
            returned: watch::Sender::new(None),
        }
    }
}

impl Availability {
    /// Whether database work should be turned away now.
    pub(super) fn unreachable(&self) -> bool {
        self.unreachable.load(Ordering::Relaxed)
    }

    /// How many times the probe has found the database out of reach: work that reads a
    /// different count at its end than at its start has spanned an outage.
    pub(super) fn outages(&self) -> u64 {
        self.outages.load(Ordering::Acquire)
    }

    /// When the database was last found back after being out of reach, and a receiver
    /// told each time it is.
    pub(super) fn returns(&self) -> watch::Receiver<Option<Instant>> {
        self.returned.subscribe()
    }

    /// Notes what the probe found, logging a change.
    fn found(&self, reachable: bool, why: &str) {
        let was_unreachable = self.unreachable.swap(!reachable, Ordering::Relaxed);
        match (was_unreachable, reachable) {
            (false, false) => {
                self.outages.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(
                    reason = why,
                    "the database is out of reach: database work is answered unavailable at \
                     once until it is back"
                );
            }
            (true, true) => {
                tracing::info!("the database is reachable again");
                self.returned.send_replace(Some(Instant::now()));
            }
            _ => {}
        }
    }
}

/// The error work turned away meanwhile gets: unavailable, and certainly not committed.
pub(super) fn turned_away() -> DbErr {
    DbErr::ConnectionAcquire(ConnAcquireErr::Timeout)
}

/// Probes the database every [`PROBE_EVERY`] through a connection of its own (pinged while
/// it answers, replaced when it does not, each look within the deadlines), until
/// `shutdown`.
pub(super) async fn watch(
    availability: Arc<Availability>,
    options: PgConnectOptions,
    timeouts: Timeouts,
    shutdown: CancellationToken,
) {
    probe(options, timeouts, &shutdown, |look| {
        match look {
            Look::Reachable => availability.found(true, ""),
            // A server that refuses connections serves no work either.
            Look::Refused(why) | Look::Silent(why) => availability.found(false, why),
        }
        ControlFlow::Continue(())
    })
    .await;
}

/// Returns, with what the last look found, once the database has been out of reach look
/// after look for `limit`: work that is waiting on it (a migration's statement, whose
/// connection may have gone silent) can give up instead of waiting for ever. A server that
/// answers a new connection with an error (too many clients, starting up, credentials
/// refused) is not out of reach: the work's own connection may well be fine.
pub(super) async fn out_of_reach_for(
    options: PgConnectOptions,
    timeouts: Timeouts,
    limit: Duration,
) -> String {
    let mut since: Option<Instant> = None;
    let mut last = String::new();
    probe(options, timeouts, &CancellationToken::new(), |look| {
        let Look::Silent(why) = look else {
            since = None;
            return ControlFlow::Continue(());
        };
        last = why.to_owned();
        if since.get_or_insert_with(Instant::now).elapsed() >= limit {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .await;
    last
}

/// What one look at the database found.
enum Look<'a> {
    /// It answered.
    Reachable,
    /// It answered a new connection with an error, saying why.
    Refused(&'a str),
    /// Nothing answered in time, or the network failed, and why.
    Silent(&'a str),
}

/// Looks at the database every [`PROBE_EVERY`] through a connection of its own (pinged
/// while it answers, replaced when it does not, each look within the deadlines), telling
/// `found` what each look found until `found` breaks or `shutdown`.
async fn probe(
    options: PgConnectOptions,
    timeouts: Timeouts,
    shutdown: &CancellationToken,
    mut found: impl FnMut(Look<'_>) -> ControlFlow<()>,
) {
    let mut probe: Option<PgConnection> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
        if let Some(connection) = probe.as_mut() {
            match tokio::time::timeout(timeouts.work, connection.ping()).await {
                Ok(Ok(())) => {
                    if found(Look::Reachable).is_break() {
                        return;
                    }
                    continue;
                }
                // Dropped without a goodbye: a silent peer would hold a polite close.
                Ok(Err(_)) | Err(_) => probe = None,
            }
        }
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = tokio::time::timeout(timeouts.acquire, PgConnection::connect_with(&options)) => opened,
        };
        let look = match opened {
            Ok(Ok(connection)) => {
                probe = Some(connection);
                found(Look::Reachable)
            }
            Ok(Err(err @ sqlx::Error::Database(_))) => found(Look::Refused(&err.to_string())),
            Ok(Err(err)) => found(Look::Silent(&err.to_string())),
            Err(_) => found(Look::Silent("no answer to a new connection in time")),
        };
        if look.is_break() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outage_is_counted_once_and_each_return_told() {
        let availability = Availability::default();
        let returns = availability.returns();
        assert_eq!(availability.outages(), 0);
        availability.found(true, "");
        assert_eq!(availability.outages(), 0, "reachable all along");
        availability.found(false, "silent");
        availability.found(false, "still silent");
        assert_eq!(availability.outages(), 1, "one outage, looked at twice");
        assert!(availability.unreachable());
        availability.found(true, "");
        assert!(returns.borrow().is_some(), "the return is told");
        availability.found(false, "silent again");
        assert_eq!(availability.outages(), 2);
    }
}
