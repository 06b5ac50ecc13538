//! Claims after an outage: this process claims nothing (neither its claiming loop nor a
//! submission claiming at submit) while its recorder holds outcomes the database could not
//! take, nor for [`SETTLE`] after its probe finds the database back from out of reach; and
//! the recorder writes what it holds the moment the probe finds the database back.
//!
//! Why: a webhook answered while the database was out of reach leaves its outcome held by
//! the recorder, and after an outage longer than the lease its delivery is due again. Were
//! claims to start as soon as the database answers, a claim (in this process, or in
//! another that saw the same outage) would retake that lease and send the webhook a second
//! time while its answer waited to be written. This process waits for exactly what it
//! holds; another process cannot know what this one holds, and waits [`SETTLE`], time
//! enough for the holder to be told and write it (a write that takes longer, on a database
//! slow to recover, can still lose that race: delivery stays at least once). A claim
//! that began before the outage was found and waited through it, for a connection or on a
//! statement the network held back, would slip past these waits: it rolls back instead of
//! committing (see [`super::claim::ClaimRequest::outages`], for the claiming loop's claims
//! and those at submit alike). A process
//! whose probe saw no outage (only another process lost the database) claims as usual: the
//! other process may be gone for good, and its deliveries are retaken after their lease as
//! always.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sea_orm::DbErr;
use tokio::sync::watch;

use crate::db::Db;

/// How long claims wait once the probe finds the database back after finding it out of
/// reach: time for every process that holds outcomes to be told at once and write them.
pub(super) const SETTLE: Duration = Duration::from_secs(2);

/// How often claims look again while they wait.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// What claims wait for after an outage. Shared by the claiming loop, the claims at submit
/// and the recorder.
pub(super) struct Recovery {
    /// How many outcomes the recorder is retrying because the database could not take
    /// them: read on every claim, so an atomic; changed only under `held_since`'s lock.
    held: AtomicUsize,
    /// Since when there have been any.
    held_since: Mutex<Option<Instant>>,
    /// When the probe last found the database back (see [`crate::db::Db::returns`]).
    returns: watch::Receiver<Option<Instant>>,
}

impl Recovery {
    /// Waiting on what `returns` says of the database's returns.
    pub(super) fn new(returns: watch::Receiver<Option<Instant>>) -> Self {
        Recovery {
            held: AtomicUsize::new(0),
            held_since: Mutex::new(None),
            returns,
        }
    }

    /// How long claims should wait before looking again, if they must wait now: while the
    /// recorder holds outcomes the database could not take (for at most `cap`, a lease,
    /// after which their deliveries would be retaken anyway), and for [`SETTLE`] after the
    /// database came back.
    pub(super) fn wait_before_claiming(&self, cap: Duration) -> Option<Duration> {
        if self.held.load(Ordering::Acquire) > 0 {
            let since = *self
                .held_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if since.is_some_and(|since| since.elapsed() < cap) {
                return Some(LOOK_AGAIN);
            }
        }
        let returned = (*self.returns.borrow())?;
        SETTLE
            .checked_sub(returned.elapsed())
            .filter(|left| !left.is_zero())
            .map(|left| left.min(LOOK_AGAIN))
    }

    /// Counts `outcomes` as held until the returned guard is dropped (written, or given up).
    pub(super) fn hold(&self, outcomes: usize) -> Holding<'_> {
        let mut since = self
            .held_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.held.fetch_add(outcomes, Ordering::AcqRel);
        since.get_or_insert_with(Instant::now);
        Holding {
            recovery: self,
            outcomes,
        }
    }
}

/// Outcomes counted as held (see [`Recovery::hold`]) while this lives.
pub(super) struct Holding<'a> {
    recovery: &'a Recovery,
    outcomes: usize,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        let recovery = self.recovery;
        let mut since = recovery
            .held_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if recovery.held.fetch_sub(self.outcomes, Ordering::AcqRel) == self.outcomes {
            *since = None;
        }
    }
}

/// Refuses to commit a claim (as unavailable: the caller rolls it back) when this process
/// has found the database out of reach since `outages` were counted, when the claim was
/// found free to go (see [`super::claim::ClaimRequest::outages`]). Such a claim began
/// before the wait after that outage, so it would retake leases whose answers are held
/// through it before they are written.
pub(crate) fn no_outage_since(db: &Db, outages: u64) -> Result<(), DbErr> {
    db.no_outage_since(outages).inspect_err(|_| {
        tracing::debug!("a claim that waited through an outage is rolled back");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(60);

    #[test]
    fn claims_wait_while_outcomes_are_held() {
        let (_returned, returns) = watch::channel(None);
        let recovery = Recovery::new(returns);
        assert_eq!(recovery.wait_before_claiming(LEASE), None);
        let first = recovery.hold(3);
        let second = recovery.hold(1);
        assert!(recovery.wait_before_claiming(LEASE).is_some());
        drop(first);
        assert!(
            recovery.wait_before_claiming(LEASE).is_some(),
            "one is still held"
        );
        drop(second);
        assert_eq!(recovery.wait_before_claiming(LEASE), None);
        // Held for longer than the cap, claims go on: the deliveries are due again anyway.
        let _held = recovery.hold(1);
        assert_eq!(recovery.wait_before_claiming(Duration::ZERO), None);
    }

    #[test]
    fn claims_wait_a_moment_after_the_database_is_back() {
        let (returned, returns) = watch::channel(None);
        let recovery = Recovery::new(returns);
        returned.send_replace(Some(Instant::now()));
        let wait = recovery.wait_before_claiming(LEASE);
        assert!(wait.is_some_and(|wait| wait <= LOOK_AGAIN), "{wait:?}");
        returned.send_replace(Instant::now().checked_sub(SETTLE));
        assert_eq!(recovery.wait_before_claiming(LEASE), None);
    }
}
