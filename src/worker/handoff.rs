//! Claims made outside the claiming loop, handed to this process's worker: a submission
//! stored while the worker has a slot to spare claims its own delivery as it is stored (see
//! [`crate::service::submissions::claiming`]), so the only commit before its request leaves
//! is the submission's own.
//!
//! The slot is reserved before the write begins, so a claim made at submit always has one
//! to start in. On PostgreSQL a submission without an ordering key is claimed by the
//! statement that stores it; any other by an ordinary claim (the same rules, statements,
//! lease and fence, see [`super::claim`]) in the transaction that stores it, limited to one
//! delivery and to the submission's endpoint. Either way, if the process dies before the
//! request leaves, the lease runs out and any worker takes the delivery again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sea_orm::{DatabaseTransaction, DbErr};
use tokio::sync::OwnedSemaphorePermit;
use uuid::Uuid;

use super::claim::{claim_in, settle, ClaimRequest, Claimed};
use super::recovery::no_outage_since;
use super::share::{Reserved, Snapshot};
use super::targets::Targets;
use super::turns::Commit;
use crate::bus::{ChangeBus, Staged, StateChange};
use crate::crypto::sealing::SecretKeys;
use crate::db::Db;
use crate::error::error_chain;

/// What a running worker offers for hand-offs.
pub(crate) trait Starter: Send + Sync {
    /// A free slot for a delivery of `endpoint_id`, if the worker has one to spare: it
    /// runs, is not stopping, no backlog waits for its slots (that work is shared round
    /// robin by the claiming loop), and the endpoint does not hold its whole share of them
    /// (see [`super::share`]).
    fn reserve(&self, endpoint_id: Uuid) -> Option<Slot>;
    /// A claim of one delivery of `endpoint_id`, under the worker's own settings and the
    /// shares as they were when its slot was reserved.
    fn request(&self, endpoint_id: Uuid, shares: Snapshot) -> ClaimRequest;
    /// The keys that open the endpoints' secrets.
    fn keys(&self) -> SecretKeys;
    /// Starts what `claimed` holds (at most one delivery) in `slot`, giving the slot back
    /// if it holds nothing, and runs the claim's follow-up. `at_submit`: the submission's
    /// write made the claim (rather than a claim right after it).
    fn start(
        &self,
        slot: OwnedSemaphorePermit,
        claimed: Claimed,
        targets: Targets,
        at_submit: bool,
    );
    /// A reserved slot was given back unused.
    fn released(&self);
    /// A claim at submit failed (see [`claim_at_submit`]).
    fn claim_failed(&self);
}

/// A slot reserved for a claim at submit: the slot, the shares as the reservation saw
/// them (before it counted itself), and its place in its endpoint's share, held until the
/// claim's request starts or nothing was claimed.
pub(crate) struct Slot {
    /// The worker's slot.
    pub slot: OwnedSemaphorePermit,
    /// The shares the claim is made under.
    pub shares: Snapshot,
    /// The reservation counted in its endpoint's share.
    pub held: Reserved,
    /// This process's count of outages when the slot was found free to claim with (see
    /// [`ClaimRequest::outages`]).
    pub outages: u64,
}

/// Where this process's worker, while it runs, takes claims made at submit. Without a
/// worker (an API-only process) nothing is reserved and every submission waits for a claim.
#[derive(Clone, Default)]
pub struct Handoff(Arc<Mutex<Option<Arc<dyn Starter>>>>);

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("attached", &self.starter().is_some())
            .finish()
    }
}

impl Handoff {
    fn starter(&self) -> Option<Arc<dyn Starter>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A slot of the local worker for a claim at submit of a delivery to `endpoint_id`, if
    /// it has one to spare.
    pub fn reserve(&self, endpoint_id: Uuid) -> Option<Reservation> {
        let starter = self.starter()?;
        let Slot {
            slot,
            shares,
            held,
            outages,
        } = starter.reserve(endpoint_id)?;
        Some(Reservation {
            slot: Some(slot),
            shares,
            held: Some(held),
            outages,
            starter,
        })
    }

    /// The worker takes hand-offs from now on.
    pub(crate) fn attach(&self, starter: Arc<dyn Starter>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(starter);
    }

    /// The worker stopped: no more reservations.
    pub(crate) fn detach(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// A slot of the local worker, held for one claim at submit. Dropped unused, the slot is
/// free again.
pub struct Reservation {
    slot: Option<OwnedSemaphorePermit>,
    shares: Snapshot,
    /// Counted in its endpoint's share until the claim's request has started (it then
    /// counts as a request under way) or the reservation is dropped.
    held: Option<Reserved>,
    /// See [`Slot::outages`].
    outages: u64,
    starter: Arc<dyn Starter>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").finish_non_exhaustive()
    }
}

impl Reservation {
    /// What to claim for a submission to `endpoint_id`: a claim that waits through an
    /// outage from the reservation on rolls back (see [`ClaimRequest::outages`]).
    pub fn request(&self, endpoint_id: Uuid) -> ClaimRequest {
        ClaimRequest {
            outages: Some(self.outages),
            ..self.starter.request(endpoint_id, self.shares.clone())
        }
    }

    /// The keys that open the endpoints' secrets.
    pub fn keys(&self) -> SecretKeys {
        self.starter.keys()
    }

    /// Counts a claim at submit that failed, its submission stored again without one.
    pub fn claim_failed(&self) {
        self.starter.claim_failed();
    }

    /// Starts what the committed claim made at submit holds in the reserved slot (given
    /// back if it holds nothing), and runs the claim's follow-up.
    pub fn start(self, claimed: Claimed, targets: Targets) {
        self.start_as(claimed, targets, true);
    }

    /// [`Reservation::start`] for an ordinary claim made right after the submission
    /// committed (counted among claims, not among claims at submit).
    pub fn start_after_submit(self, claimed: Claimed, targets: Targets) {
        self.start_as(claimed, targets, false);
    }

    fn start_as(mut self, claimed: Claimed, targets: Targets, at_submit: bool) {
        if let Some(slot) = self.slot.take() {
            self.starter.start(slot, claimed, targets, at_submit);
        }
        // Its request, if any, now counts in the share itself.
        self.held.take();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            drop(slot);
            self.starter.released();
        }
    }
}

/// Marks a claim at submit that failed, and with it the transaction it ran in (see
/// [`claim_at_submit`]): the caller then stores the submission again, without a claim.
#[derive(Debug, Default)]
pub(crate) struct FailedClaim(AtomicBool);

impl FailedClaim {
    /// Forgets an earlier try's failure (a transaction retried after a conflict).
    pub(crate) fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    /// Whether a try failed in its claim and no later try got as far as the transaction's
    /// first statement (a retry whose `BEGIN` failed leaves the mark: the submission is
    /// then stored again, which is safe, since nothing of any try committed).
    pub(crate) fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The claim of a submission's own endpoint inside the transaction that stored it (after
/// the statement that stored it, so the claim sees the new row), with `created` (the new
/// delivery's creation) staged before the claim's changes: one notification for both, so
/// no process is woken for a delivery already on its way. It runs with no savepoint of its
/// own (which would cost two round trips on every quiet submission): a claim that fails
/// fails the whole transaction, marked in `failed`, so nothing of it commits and the caller
/// stores the submission again, with the same ids, to wait for an ordinary claim.
pub(crate) async fn claim_at_submit(
    txn: &DatabaseTransaction,
    db: &Db,
    bus: &ChangeBus,
    request: &ClaimRequest,
    failed: &FailedClaim,
    created: StateChange,
) -> Result<(Claimed, Staged), DbErr> {
    let claimed = async {
        let (mut claimed, changes) = claim_in(txn, db, request, Commit::AsConfigured).await?;
        let mut all = Vec::with_capacity(changes.len() + 1);
        all.push(created);
        all.extend(changes);
        let staged = settle(txn, db, bus, &mut claimed, all).await?;
        if let Some(outages) = request.outages {
            no_outage_since(db, outages)?;
        }
        Ok((claimed, staged))
    };
    claimed.await.inspect_err(|err| {
        failed.0.store(true, Ordering::Relaxed);
        tracing::warn!(error = %error_chain(err), "claiming at submit failed; the submission is stored again to wait for a claim");
    })
}
