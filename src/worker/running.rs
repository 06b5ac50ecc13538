//! The worker while it runs: what starting a delivery needs (the recorder's inbox, the
//! tasks in flight), shared by the claiming loop and the claims submissions hand over (see
//! [`super::handoff`]).

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt as _;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::claim::{Claim, ClaimRequest, Claimed};
use super::handoff::{Slot, Starter};
use super::recorder::Finished;
use super::share::{Held, Snapshot};
use super::targets::{Found, Target, Targets};
use super::Worker;
use crate::crypto::sealing::SecretKeys;

/// The worker while it runs: what starting a delivery needs, shared by the claiming loop
/// and the claims submissions hand over (see [`handoff`]).
pub(super) struct Running {
    pub(super) worker: Arc<Worker>,
    /// The recorder's inbox; taken at shutdown, once nothing more starts.
    pub(super) results: Mutex<Option<mpsc::Sender<Finished>>>,
    /// The deliveries in flight.
    pub(super) tasks: TaskTracker,
    /// Fired when the grace period is over: the deliveries still in flight are dropped.
    pub(super) abandon: CancellationToken,
    /// Whether the last claim left a backlog: its slots go round robin, not to submits.
    pub(super) backlogged: AtomicBool,
    /// Slots reserved by submissions that have not handed them back yet.
    pub(super) reserved: AtomicUsize,
    /// Told each time a reservation is handed back (its delivery started, or its slot
    /// given back unused): shutdown waits for the last.
    pub(super) reservation_settled: tokio::sync::Notify,
}

impl Running {
    /// A reservation was handed back.
    fn settle_reservation(&self) {
        self.reserved.fetch_sub(1, Ordering::AcqRel);
        self.reservation_settled.notify_waiters();
    }

    /// Waits, until `deadline` at the latest, for every slot reserved by a submission to be
    /// handed back: a submission that reserved one before the stop may still be storing its
    /// claim, and the delivery it claims must start here (or its slot come back), not wait
    /// out its lease with nobody to send it. No slot is reserved once the stop has begun.
    pub(super) async fn reservations_settled(&self, deadline: tokio::time::Instant) {
        loop {
            // Made before the count is read, so a hand-back in between is not missed.
            let settled = self.reservation_settled.notified();
            if self.reserved.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return;
            }
        }
    }

    /// Sends `claim` in `slot` as a task of its own. After shutdown nothing starts: the
    /// delivery is reclaimed after its lease.
    pub(super) fn spawn(&self, claim: Claim, target: Option<Target>, slot: OwnedSemaphorePermit) {
        let results = self
            .results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(results) = results else {
            tracing::debug!(delivery_id = %claim.delivery_id, "stopping: a claimed delivery waits for its lease");
            return;
        };
        let (worker, abandon) = (Arc::clone(&self.worker), self.abandon.clone());
        let delivery_id = claim.delivery_id;
        let held = worker.shares.started(claim.endpoint_id);
        let slot = Sending::counted(slot, &worker.state.metrics.in_flight, held);
        self.tasks.spawn(async move {
            let sending =
                AssertUnwindSafe(Arc::clone(&worker).send_and_report(claim, target, slot, results))
                    .catch_unwind();
            tokio::select! {
                biased;
                () = abandon.cancelled() => {}
                sent = sending => {
                    if let Err(panic) = sent {
                        // Its slot went with the unwinding task; the delivery is retaken
                        // after its lease, like any whose outcome was never recorded.
                        tracing::error!(%delivery_id, panic = panic_message(&*panic),
                            "sending a delivery panicked; it is retried after its lease");
                        worker.slot_freed();
                    }
                }
            }
        });
    }
}

/// A delivery's slot while its request is under way, counted in the in-flight gauge and in
/// its endpoint's share for as long as it is held (dropped when the request ends, with the
/// task that unwinds, or with the task abandoned at shutdown).
pub(super) struct Sending {
    _slot: OwnedSemaphorePermit,
    _held: Held,
    gauge: Gauge,
}

impl Sending {
    /// `slot`, counted in `gauge` from now on, and `held` in its endpoint's share.
    fn counted(slot: OwnedSemaphorePermit, gauge: &Gauge, held: Held) -> Self {
        gauge.inc();
        Self {
            _slot: slot,
            _held: held,
            gauge: gauge.clone(),
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl Starter for Running {
    fn reserve(&self, endpoint_id: Uuid) -> Option<Slot> {
        let worker = &self.worker;
        // Counted before the wait after an outage is looked at (see [`ClaimRequest::outages`]).
        let outages = worker.state.db.outages();
        if !worker.state.config.claim_at_submit
            || worker.state.shutdown.is_cancelled()
            || self.backlogged.load(Ordering::Relaxed)
            || worker.unopened.contains(endpoint_id)
            || worker
                .recovery
                .wait_before_claiming(worker.state.config.lease())
                .is_some()
        {
            return None;
        }
        let shares = worker.shares.snapshot_of(endpoint_id);
        if shares.room(endpoint_id) == 0 {
            return None;
        }
        // At most a quarter of the slots wait on submissions at once (on SQLite each
        // waits for the write lock), so the claiming loop always has slots to share.
        let most = (worker.concurrency / 4).max(1);
        let taken = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            });
        if taken.is_err() {
            return None;
        }
        // A stop that began meanwhile may have found no reservation to wait for: none now.
        if worker.state.shutdown.is_cancelled() {
            self.settle_reservation();
            return None;
        }
        let Ok(slot) = worker.slots.clone().try_acquire_owned() else {
            self.settle_reservation();
            return None;
        };
        Some(Slot {
            slot,
            shares,
            held: worker.shares.reserved(endpoint_id),
            outages,
        })
    }

    fn request(&self, endpoint_id: Uuid, shares: Snapshot) -> ClaimRequest {
        let config = &self.worker.state.config;
        let mut ended = self.worker.ended.snapshot();
        ended.revisit.clear();
        ClaimRequest {
            limit: 1,
            lease: config.lease(),
            default_max_in_flight: config.endpoint_max_in_flight,
            ended,
            only: Some(endpoint_id),
            shares,
            left_alone: Vec::new(),
            attempts_per_cycle: Some(self.worker.policy.attempts_per_cycle()),
            outages: None,
        }
    }

    fn keys(&self) -> SecretKeys {
        self.worker.state.config.secret_keys()
    }

    fn start(
        &self,
        slot: OwnedSemaphorePermit,
        mut claimed: Claimed,
        mut targets: Targets,
        at_submit: bool,
    ) {
        let worker = &self.worker;
        let metrics = &worker.state.metrics;
        metrics.claims.inc_by(claimed.claims.len() as u64);
        if at_submit {
            metrics.claims_at_submit.inc_by(claimed.claims.len() as u64);
        }
        let mut claims = std::mem::take(&mut claimed.claims).into_iter();
        let (first, unopened) = match claims.next() {
            Some(claim) => match targets.take(claim.delivery_id) {
                Found::Ready(target) => (Some((claim, Some(target))), None),
                Found::Missing => (Some((claim, None)), None),
                Found::Unopened => (None, Some(claim)),
            },
            None => (None, None),
        };
        // Its endpoint is left alone before anything wakes the claiming loop, whose next
        // claim then passes it by.
        worker.hand_back_unopened(unopened.into_iter().collect());
        // A claim at submit takes one delivery: nothing is gained by waiting for more.
        let worth = worker.ended.visited(
            claimed.visited.iter().copied(),
            claimed.seen(),
            Duration::ZERO,
        );
        if claimed.more {
            worker.state.wakeup.hint();
        } else {
            worth.wake(&worker.state.wakeup);
        }
        if let Some(after) = claimed.next_turn_in() {
            worker.state.wakeup.turn_after(after);
        }
        worker.follow_up(claimed.follow_up());
        match first {
            Some((claim, target)) => {
                self.spawn(claim, target, slot);
                // A claim at submit asks for one; were there more, they take free slots.
                worker.start(claims.collect(), targets, self, None);
            }
            None => {
                drop(slot);
                worker.slot_freed();
                worker.start(claims.collect(), targets, self, None);
            }
        }
        // Settled once its delivery is among the tasks a stop waits for.
        self.settle_reservation();
    }

    fn released(&self) {
        self.settle_reservation();
        self.worker.slot_freed();
    }

    fn claim_failed(&self) {
        self.worker.state.metrics.claims_at_submit_failed.inc();
    }
}
