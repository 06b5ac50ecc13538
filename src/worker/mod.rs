//! The delivery worker: claims due deliveries in batches, shared round robin across
//! endpoints within each endpoint's flow control (see [`claim`] and [`turns`]), sends each (at
//! most `COURIER_WORKER_CONCURRENCY` in flight), hands the outcomes to a recorder that writes
//! them in batches under each claim's fence, and on shutdown stops claiming and lets
//! in-flight requests finish within a grace period (see [`drain`]).
//!
//! A slot is held from the claim to the end of the request. The outcome then waits to be
//! recorded under a recording permit (twice as many permits as slots), so batches being
//! written do not keep the next requests from starting, and claimed but unrecorded
//! deliveries stay bounded (at most three times the concurrency).

pub mod answer;
mod attempt;
pub mod claim;
pub mod claimer;
pub mod dispatch;
mod drain;
pub mod ended;
mod endpoint_clients;
pub mod endpoints_until;
pub mod handoff;
pub mod health;
pub mod hold;
pub mod record;
mod recorder;
mod recovery;
pub mod retention;
pub mod retired_secrets;
pub mod retry_after;
mod running;
pub mod schedule;
pub mod share;
pub(crate) mod targets;
pub mod turns;
pub mod unopened;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_orm::DbErr;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::claim::{release, Claim, ClaimError, ClaimRequest, Claimed};
use self::claimer::Claimer;
use self::dispatch::{Dispatcher, DispatcherError};
use self::ended::EndedRequests;
use self::recorder::{Finished, Recorder};
use self::recovery::Recovery;
use self::running::Running;
use self::schedule::RetryPolicy;
use self::share::Shares;
use self::targets::{Found, Target, Targets};
use self::unopened::UnopenedEndpoints;
use crate::error::error_chain;
use crate::state::AppState;

/// Most deliveries claimed in one statement.
const MAX_CLAIM_BATCH: usize = 64;
/// The longest a claim waits for a backlog's slots to gather (see
/// [`Worker::min_backlog_claim`]) while some are free: slots that free slowly (held by a
/// slow or hanging receiver) are claimed as they are, so the endpoints they could serve
/// are not held back to the poll interval.
const GATHER_AT_MOST: Duration = Duration::from_millis(10);
/// How long to wait before asking again for an endpoint another transaction held.
const REVISIT_PAUSE: Duration = Duration::from_millis(2);
/// How often each worker sweeps every endpoint for due work that nothing woke (a backstop:
/// wake-ups are written with the work itself).
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// A delivery worker for one process.
pub struct Worker {
    state: AppState,
    dispatcher: Dispatcher,
    policy: RetryPolicy,
    slots: Arc<Semaphore>,
    recording: Arc<Semaphore>,
    concurrency: usize,
    ended: EndedRequests,
    /// What each endpoint holds of the slots (see [`share`]).
    shares: Arc<Shares>,
    /// The claims' own thread and connections, on PostgreSQL (see [`claimer`]).
    claimer: Option<Claimer>,
    /// Endpoints whose secret this process could not open lately (see [`unopened`]).
    unopened: UnopenedEndpoints,
    /// Whether claims wait after an outage (see [`recovery`]).
    recovery: Arc<Recovery>,
}

impl Worker {
    /// A worker using `state`'s settings, claiming through `claimer` if there is one (see
    /// [`Claimer::start`]). Fails only if the HTTP client cannot be built.
    pub fn new(state: AppState, claimer: Option<Claimer>) -> Result<Self, DispatcherError> {
        let config = &state.config;
        let dispatcher = Dispatcher::new(
            Duration::from_millis(config.request_timeout_ms),
            config.allow_private_destinations,
        )?;
        let policy = config.retry_policy();
        tracing::info!(
            attempts_per_cycle = policy.attempts_per_cycle(),
            cycle_span_secs = policy.span().as_secs(),
            delays = ?policy.nominal_delays(),
            "retry schedule"
        );
        let concurrency = config.worker_concurrency as usize;
        if config.lease().as_millis() <= u128::from(config.request_timeout_ms) {
            tracing::warn!(
                lease_secs = config.lease_secs,
                request_timeout_ms = config.request_timeout_ms,
                "the lease is not longer than the request timeout: slow requests will be reclaimed and sent twice"
            );
        }
        Ok(Worker {
            dispatcher,
            policy,
            slots: Arc::new(Semaphore::new(concurrency)),
            recording: Arc::new(Semaphore::new(2 * concurrency)),
            concurrency,
            ended: EndedRequests::default(),
            shares: Arc::new(Shares::new(concurrency, state.wakeup.clone())),
            claimer,
            unopened: UnopenedEndpoints::default(),
            recovery: Arc::new(Recovery::new(state.db.returns())),
            state,
        })
    }

    /// Runs until the shutdown token fires, then drains in-flight deliveries for up to
    /// the grace period. Whatever is still unfinished is left to be reclaimed after its lease.
    pub async fn run(self) {
        let this = Arc::new(self);
        let shutdown = this.state.shutdown.clone();
        let poll = Duration::from_millis(this.state.config.poll_interval_ms);
        // Bounded by the recording permits its items carry, each freed once recorded.
        let (results, inbox) = mpsc::channel(this.concurrency.max(1));
        let recorder =
            tokio::spawn(Recorder::new(this.state.clone(), this.recovery.clone()).run(inbox));
        let running = Arc::new(Running {
            worker: Arc::clone(&this),
            results: Mutex::new(Some(results)),
            tasks: TaskTracker::new(),
            abandon: CancellationToken::new(),
            backlogged: AtomicBool::new(false),
            reserved: std::sync::atomic::AtomicUsize::new(0),
            reservation_settled: tokio::sync::Notify::new(),
        });
        this.state.handoff.attach(running.clone());
        tracing::info!(concurrency = this.concurrency, "delivery worker started");
        // Whether the last claim took all it asked for: more is due than there are slots.
        let mut backlog = false;
        let mut last_sweep: Option<tokio::time::Instant> = None;
        // Since when free slots have been gathering for a claim.
        let mut gathering_since: Option<tokio::time::Instant> = None;
        loop {
            running.backlogged.store(backlog, Ordering::Relaxed);
            if last_sweep.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
                last_sweep = Some(tokio::time::Instant::now());
                // Off the claiming path: it may look at every endpoint.
                tokio::spawn(Arc::clone(&this).sweep());
            }
            if shutdown.is_cancelled() {
                break;
            }
            // After an outage, outcomes held through it are written first (see [`recovery`]);
            // a claim that waits through another from here on rolls back.
            let outages = this.state.db.outages();
            if let Some(wait) = this
                .recovery
                .wait_before_claiming(this.state.config.lease())
            {
                tokio::select! {
                    () = tokio::time::sleep(wait) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
            let free = this.slots.available_permits().min(MAX_CLAIM_BATCH);
            // With a backlog, slots are gathered into one claim rather than claimed as
            // each frees: every claim is a notifying commit and a few round trips, and a
            // stream of small ones keeps this loop, not the slots, the limit. Without one,
            // a free slot claims at once.
            let wanted = if backlog { this.min_backlog_claim() } else { 1 };
            if free < wanted {
                // Slots held by slow endpoints must not hold up the rest for long: what is
                // free is claimed soon, and with nothing free the poll looks again.
                let give_up = match free {
                    0 => tokio::time::Instant::now() + poll,
                    _ => {
                        *gathering_since.get_or_insert_with(tokio::time::Instant::now)
                            + GATHER_AT_MOST
                    }
                };
                tokio::select! {
                    () = this.state.wakeup.slot_freed() => continue,
                    () = tokio::time::sleep_until(give_up) => {
                        backlog = false;
                        continue;
                    }
                    () = shutdown.cancelled() => break,
                }
            }
            gathering_since = None;
            backlog = false;
            // The slots are held before claiming: a submission claiming at submit
            // reserves slots too, and must not take one a claimed delivery needs.
            let Ok(held) = this.slots.clone().try_acquire_many_owned(free as u32) else {
                continue;
            };
            // A claim waiting on a silent database does not hold up a shutdown: what it
            // took, if it committed, is reclaimed after its lease like anything unfinished.
            let claimed = tokio::select! {
                claimed = this.claim(free, outages) => claimed,
                () = shutdown.cancelled() => break,
            };
            match claimed {
                Ok((mut claimed, targets)) => {
                    // A ready endpoint whose rows someone else holds is no backlog: wait for
                    // a hint. But a claim that took nothing while putting endpoints to sleep
                    // (turns left ready with nothing due, as outcomes leave them) made way
                    // for the endpoints behind them: look again at once, not at the poll.
                    backlog = claimed.claims.len() == free
                        || (claimed.more && (!claimed.claims.is_empty() || claimed.advanced));
                    if claimed.missed_revisit && claimed.claims.is_empty() {
                        // A full endpoint with free slots was held by another transaction
                        // for a moment: look again shortly rather than at the next poll.
                        tokio::time::sleep(REVISIT_PAUSE).await;
                        backlog = true;
                    }
                    let follow_up = claimed.follow_up();
                    this.start(claimed.claims, targets, &running, Some(held));
                    this.follow_up(follow_up);
                }
                // Rolled back, or failed, as an outage began (see [`ClaimRequest::outages`]):
                // what it found is claimed once what was held through the outage is
                // written, not at the next poll.
                Err(err) if this.state.db.outages() != outages => {
                    tracing::info!(error = %error_chain(&err),
                        "a claim that waited through an outage took nothing; claiming again \
                         once outcomes held through it are written");
                    backlog = true;
                }
                // A database out of reach is an outage, a warning like every other failure
                // it causes; anything else is a fault.
                Err(err) if crate::db::is_unavailable(&err) => {
                    tracing::warn!(error = %error_chain(&err),
                        "claiming deliveries failed: the database is unavailable")
                }
                Err(err) => {
                    tracing::error!(error = %error_chain(&err), "claiming deliveries failed")
                }
            }
            if backlog {
                continue;
            }
            running.backlogged.store(false, Ordering::Relaxed);
            // A hint that came while the claim ran (enough of a full endpoint's requests
            // ended, work was submitted): claim again at once, without sleeping.
            if this.state.wakeup.take_hint() {
                continue;
            }
            // A turn set ahead where no claim of this process saw it (a submission woke an
            // endpoint its rate limit holds back, or another process set it) is looked at
            // when it comes too.
            match this
                .state
                .db
                .within_deadline(turns::soonest_turn(&this.state.db))
                .await
            {
                Ok(Some(after)) => this.state.wakeup.turn_after(after),
                Ok(None) => {}
                Err(err) => tracing::debug!(error = %error_chain(&err),
                    "reading the soonest turn failed; the poll will look"),
            }
            tokio::select! {
                () = this.state.wakeup.notified_or_turn(poll) => {}
                () = shutdown.cancelled() => break,
            }
        }
        this.state.handoff.detach();
        this.drain(&running, recorder).await;
    }

    /// Runs a claim's follow-up (see [`turns::FollowUp`]) off the claiming path.
    fn follow_up(&self, follow_up: turns::FollowUp) {
        if follow_up.is_empty() {
            return;
        }
        let state = self.state.clone();
        tokio::spawn(async move {
            match follow_up.run(&state.db, &state.bus).await {
                Ok(0) => {}
                Ok(_) => state.wakeup.hint(),
                Err(err) => tracing::warn!(error = %error_chain(&err),
                    "looking again at endpoints a claim put to sleep failed; the sweep will"),
            }
        });
    }

    /// The fewest free slots worth a claim while a backlog waits: a quarter of the slots,
    /// up to a full claim batch.
    fn min_backlog_claim(&self) -> usize {
        (self.concurrency / 4).clamp(1, MAX_CLAIM_BATCH)
    }

    /// Wakes every endpoint with due work that nothing woke (see [`turns::sweep`]), and the
    /// claiming loop when it did.
    async fn sweep(self: Arc<Self>) {
        let db = &self.state.db;
        let default_cap = self.state.config.endpoint_max_in_flight;
        match db.within_deadline(turns::sweep(db, default_cap)).await {
            Ok(0) => {}
            Ok(woken) => {
                tracing::debug!(woken, "the sweep woke endpoints with due work");
                self.state.wakeup.hint();
            }
            Err(err) => tracing::warn!(error = %error_chain(&err), "sweeping endpoints failed"),
        }
    }

    /// Claims up to `limit` due deliveries with what to send for each. A claim the database
    /// does not confirm within the deadline is given up; if it did happen, its rows are
    /// reclaimed after their lease. Claims whose targets could not be read are released.
    /// `outages`: this process's count when the claim was found free to go (see
    /// [`ClaimRequest::outages`]).
    async fn claim(&self, limit: usize, outages: u64) -> Result<(Claimed, Targets), DbErr> {
        let db = &self.state.db;
        let keys = self.state.config.secret_keys();
        let request = ClaimRequest {
            limit: limit as u32,
            lease: self.state.config.lease(),
            default_max_in_flight: self.state.config.endpoint_max_in_flight,
            ended: self.ended.snapshot(),
            only: None,
            shares: self.shares.snapshot(),
            left_alone: [self.unopened.snapshot(), self.state.held.snapshot()].concat(),
            attempts_per_cycle: Some(self.policy.attempts_per_cycle()),
            outages: Some(outages),
        };
        let began = std::time::Instant::now();
        let claiming = claimer::claim(self.claimer.as_ref(), db, &self.state.bus, keys, request);
        let claimed = db.within_deadline(claiming).await;
        match claimed {
            Ok((claimed, targets)) => {
                // Enough of a full endpoint's requests may have ended while this claim ran.
                let worth = self.ended.visited(
                    claimed.visited.iter().copied(),
                    claimed.seen(),
                    began.elapsed(),
                );
                worth.wake(&self.state.wakeup);
                if let Some(after) = claimed.next_turn_in() {
                    self.state.wakeup.turn_after(after);
                }
                let metrics = &self.state.metrics;
                metrics.claim_rounds.inc();
                metrics.claims.inc_by(claimed.claims.len() as u64);
                Ok((claimed, targets))
            }
            Err(ClaimError::Claim(err)) => Err(err),
            Err(ClaimError::Load(claimed, err)) => {
                tracing::error!(error = %error_chain(&err), "loading claimed deliveries failed; releasing them");
                let released = db.within_deadline(release(db, &self.state.bus, &claimed.claims));
                if let Err(err) = released.await {
                    // They stay `processing` and are reclaimed after their lease.
                    tracing::error!(error = %error_chain(&err), "releasing claims failed");
                }
                Ok((Claimed::default(), Targets::default()))
            }
        }
    }

    /// Starts one task per claim, each in one of the `held` slots (or a free one); the
    /// held slots left over are freed. Claims whose secret does not open here are handed
    /// back (see [`unopened`]).
    fn start(
        self: &Arc<Self>,
        claims: Vec<Claim>,
        mut targets: Targets,
        running: &Running,
        mut held: Option<OwnedSemaphorePermit>,
    ) {
        let mut unopened = Vec::new();
        for claim in claims {
            let target = match targets.take(claim.delivery_id) {
                Found::Ready(target) => Some(target),
                Found::Missing => None,
                Found::Unopened => {
                    unopened.push(claim);
                    continue;
                }
            };
            let slot = match held.take() {
                Some(mut permits) if permits.num_permits() > 1 => {
                    let one = permits.split(1);
                    held = Some(permits);
                    one
                }
                Some(permits) => Some(permits),
                None => self.slots.clone().try_acquire_owned().ok(),
            };
            let Some(slot) = slot else {
                tracing::error!(delivery_id = %claim.delivery_id, "no free slot for a claimed delivery");
                continue;
            };
            running.spawn(claim, target, slot);
        }
        self.hand_back_unopened(unopened);
    }

    /// Sends one claimed delivery in `slot`, then hands its outcome to the recorder.
    async fn send_and_report(
        self: Arc<Self>,
        claim: Claim,
        target: Option<Target>,
        slot: running::Sending,
        results: mpsc::Sender<Finished>,
    ) {
        let (delivery_id, endpoint_id) = (claim.delivery_id, claim.endpoint_id);
        if self.state.held.holds(endpoint_id) {
            // The endpoint asked to wait (or answered `410`) after this claim was made: the
            // request is not started, and the claim goes back, unsent and with no attempt.
            self.hand_back_held(claim);
            drop(slot);
            self.slot_freed();
            return;
        }
        let attempt = self.deliver(claim, target).await;
        let hold = if health::is_gone(&attempt.outcome) {
            // Asked never to be called again: no claim anywhere starts another request to
            // the endpoint before the recording disables it (and parks the rest) a moment
            // later. Were that recording lost, the hold ends with the delivery's lease.
            Some(self.state.config.lease())
        } else {
            // Asked to wait: no claim anywhere starts another request to the endpoint,
            // from now rather than from when this outcome is recorded.
            attempt.outcome.retry_after.filter(|wait| !wait.is_zero())
        };
        if let Some(wait) = hold {
            self.state.held.hold(endpoint_id, wait);
            hold::hold_turn(&self.state.db, endpoint_id, wait).await;
        }
        // No longer in flight at the receiver: this process's claims stop counting
        // it, and come back for an endpoint that was full (see `ended::Worth`).
        let (ended, worth) = self.ended.ended(delivery_id, endpoint_id);
        worth.wake(&self.state.wakeup);
        // The semaphore is never closed; were it, the outcome would be retried
        // after its lease like any unrecorded one.
        let Ok(permit) = self.recording.clone().acquire_owned().await else {
            return;
        };
        drop(slot);
        self.slot_freed();
        // The recorder only stops after every sender is gone, so this cannot fail
        // while the worker runs.
        let _ = results
            .send(Finished {
                attempt,
                _permit: permit,
                _ended: ended,
            })
            .await;
    }

    /// Wakes the claiming loop for a freed slot.
    fn slot_freed(&self) {
        self.state.wakeup.free_slot();
    }
}
