//! Claims after an outage: once a claim finds the database out of reach, this process
//! claims nothing more (neither its claiming loop nor a submission) until the database
//! answers again and [`SETTLE`] more has passed, and its recorder is told the moment it
//! answers.
//!
//! Why: a webhook answered while the database was out of reach leaves its outcome held by
//! the recorder, and after an outage longer than the lease every such delivery is due again.
//! Were claims to start as soon as the database answers, a claim (in this process or in
//! another that saw the same outage) would retake those leases and send the webhooks a
//! second time while the answers waited to be written. Pausing every process that saw the
//! outage, and writing held outcomes at once, lets them be recorded first. A process that
//! saw no outage (only another one lost the database) claims as usual: the other process
//! may be gone for good, and its deliveries are retaken after their lease as always.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::db::Db;

/// How long claims stay paused once the database answers again: at least the recorder's
/// longest pause between tries (see [`super::recorder`]), so that outcomes a process holds
/// are written even if it missed being told.
pub(super) const SETTLE: Duration = Duration::from_secs(2);
const _: () = assert!(super::recorder::MAX_BACKOFF.as_nanos() <= SETTLE.as_nanos());

/// How often the database is looked at while it is out of reach.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The longest one look may wait for an answer.
const LOOK_WITHIN: Duration = Duration::from_secs(1);

/// Whether claims are paused after an outage, and a signal each time the database answers
/// again. Shared by the claiming loop, the claims at submit and the recorder.
pub(super) struct Recovery {
    pausing: AtomicBool,
    back: watch::Sender<u64>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            pausing: AtomicBool::new(false),
            back: watch::Sender::new(0),
        }
    }
}

impl Recovery {
    /// Whether claims are paused now.
    pub(super) fn pausing(&self) -> bool {
        self.pausing.load(Ordering::Acquire)
    }

    /// A receiver whose `changed()` resolves the next time the database answers again
    /// after an outage.
    pub(super) fn watch_back(&self) -> watch::Receiver<u64> {
        self.back.subscribe()
    }

    /// After a claim found the database out of reach: pauses claims, waits until `db`
    /// answers (looking every [`LOOK_EVERY`]), tells the recorder, then waits [`SETTLE`]
    /// before claims resume. Returns early, unpaused, on `shutdown`.
    pub(super) async fn wait_for(&self, db: &Db, shutdown: &CancellationToken) {
        self.pausing.store(true, Ordering::Release);
        self.until_back(db, shutdown).await;
        self.pausing.store(false, Ordering::Release);
    }

    async fn until_back(&self, db: &Db, shutdown: &CancellationToken) {
        loop {
            let look = tokio::select! {
                looked = db.within(LOOK_WITHIN, db.ping()) => looked,
                () = shutdown.cancelled() => return,
            };
            if look.is_ok() {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(LOOK_EVERY) => {}
                () = shutdown.cancelled() => return,
            }
        }
        self.back.send_modify(|times| *times += 1);
        tracing::info!(
            settle_ms = SETTLE.as_millis() as u64,
            "the database answers again: outcomes held through the outage are written before claims resume"
        );
        tokio::select! {
            () = tokio::time::sleep(SETTLE) => {}
            () = shutdown.cancelled() => {}
        }
    }
}
