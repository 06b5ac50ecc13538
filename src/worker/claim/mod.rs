//! Claiming due deliveries (race 1): each due row goes to exactly one worker, whatever the
//! number of processes, only with a fresh claim token and lease, and within its endpoint's
//! cap, rate limit and pause, with free slots shared round robin across endpoints (the rules
//! are in [`crate::service::flow`]).
//!
//! A claim is one transaction: lock the turns of the ready endpoints, longest waiting first
//! (`FOR UPDATE SKIP LOCKED`: claims for one endpoint take turns across processes); claim
//! each one's due rows in due order, as many as its share and its free slots allow (counted
//! by this second statement, which starts after the locks are held and so sees every claim
//! committed before it); read what that left (on PostgreSQL in that same statement, see
//! [`postgres`]); and set each endpoint's next turn (on PostgreSQL in the statement that
//! sends the claim's notifications).
//!
//! Ordering lines need nothing here: a delivery waiting behind its line's head has no due
//! time, so only heads are ever claimed (see [`crate::service::lines`]).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{DatabaseTransaction, DbBackend, DbErr, QueryResult};
use uuid::Uuid;

mod at_submit;
mod postgres;
mod release;
mod sqlite;
mod warm;

pub(crate) use self::at_submit::{claimed_in_store, left_full};

pub use self::release::{release, release_in_background};
pub use self::warm::{warm_claiming_loop, warm_statements};

use self::sqlite::claim_sqlite;
use super::ended::Snapshot;
use super::share;
use super::targets::{self, load_targets, Targets};
use super::turns::{self, Commit, FollowUp, Turns};
use crate::bus::{ChangeBus, Staged, StateChange};
use crate::crypto::sealing::SecretKeys;
use crate::db::Db;
use crate::service::flow::{self, Facts, Turn};

/// Most endpoints one claim takes turns from.
const MAX_TURNS: u32 = 32;

/// The cap on requests in flight of an endpoint that sets none, when the caller names none.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 32;

/// What a claim adds to a delivery's attempts in this cycle: one for a `processing` row
/// whose lease ran out (`{state}`, its state before the claim), since its request was
/// made and no outcome of it was recorded (its process died, or the receiver answered
/// slower than the lease); nothing for a `pending` one. So a receiver slower than the
/// lease gets at most the cycle's attempts, not one request per lease forever (see
/// [`Claim::attempts_spent`]). The sum is bounded by [`ClaimRequest::attempts_per_cycle`].
const RETAKEN: &str = "CASE WHEN {state} = 'processing' THEN 1 ELSE 0 END";

/// [`RETAKEN`] for a row whose state before the claim is the SQL `state`.
pub(super) fn retaken(state: &str) -> String {
    crate::db::sql::fill(RETAKEN, &[("state", state)])
}

/// [`ClaimRequest::attempts_per_cycle`] as the claim statements' bound (the largest `int4`
/// for none).
pub(super) fn attempts_bound(request: &ClaimRequest) -> i32 {
    request
        .attempts_per_cycle
        .map_or(i32::MAX, |most| i32::try_from(most).unwrap_or(i32::MAX))
}

/// A delivery this worker now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The delivery.
    pub delivery_id: Uuid,
    /// The token every later write must present.
    pub claim_token: Uuid,
    /// The state before the claim (`pending`, or `processing` for an expired lease).
    pub previous_state: DeliveryState,
    /// Attempts already made in this cycle.
    pub cycle_attempts: i32,
    /// The endpoint to deliver to.
    pub endpoint_id: Uuid,
    /// The submission to deliver.
    pub submission_id: Uuid,
    /// When the delivery was created (for end-to-end latency).
    pub created_at: DateTime<Utc>,
    /// When this claim's lease runs out.
    pub lease_expires_at: DateTime<Utc>,
    /// The ordering key whose line this delivery heads, if it has one.
    pub ordering_key: Option<String>,
    /// Its event type, if it has one (a failed operational event is not announced again).
    pub event_type: Option<String>,
}

impl Claim {
    /// Whether this claim retook an expired lease after every attempt of the cycle was
    /// made (`per_cycle`): the claim counted the lost request as an attempt, and another
    /// would exceed the cycle, so the delivery ends `FAILED` without a request.
    pub fn attempts_spent(&self, per_cycle: u32) -> bool {
        self.previous_state == DeliveryState::Processing
            && u32::try_from(self.cycle_attempts).unwrap_or(0) >= per_cycle
    }
}

/// What to claim.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    /// The most deliveries to claim (the worker's free slots).
    pub limit: u32,
    /// How long each claim holds its delivery.
    pub lease: Duration,
    /// The cap of endpoints that set none (`COURIER_ENDPOINT_MAX_IN_FLIGHT`).
    pub default_max_in_flight: u32,
    /// This process's requests that ended and wait to be recorded (see
    /// [`super::ended`]): not in flight at their receivers any more.
    pub ended: Snapshot,
    /// Look only at this endpoint's turn (a submission claiming its own fresh delivery,
    /// see [`super::handoff`]); `None`: every ready endpoint's.
    pub only: Option<Uuid>,
    /// What each endpoint holds of this process's slots (see [`super::share`]): an
    /// endpoint holding its whole share is left to other processes' claims.
    pub shares: share::Snapshot,
    /// Endpoints whose secret this process could not open lately (see
    /// [`super::unopened`]): left to other processes' claims.
    pub left_alone: Vec<Uuid>,
    /// The attempts of a cycle under this process's retry schedule. A claim that retakes
    /// an expired lease counts the lost request as an attempt, never past these: a claim
    /// that found them spent made no request (see [`Claim::attempts_spent`]), so retaking
    /// it, when its outcome was not recorded within its own lease, adds none. `None`: no
    /// bound.
    pub attempts_per_cycle: Option<u32>,
    /// This process's count of outages (see [`Db::outages`]) when the claim was found free
    /// to go (see [`super::recovery`]): a claim that has waited through an outage since,
    /// for a connection or on a statement the network held back, rolls back rather than
    /// commit. `None`: counted as the claim begins.
    pub outages: Option<u64>,
}

/// What a claim did.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The deliveries now held.
    pub claims: Vec<Claim>,
    /// Whether some endpoint is ready for another claim at once (more is due than this
    /// claim could take).
    pub more: bool,
    /// Whether it took some endpoint's turn out of the ready ones (it found nothing to
    /// take there now, or took all there was): so a claim at once gets further, to the
    /// endpoints behind it.
    pub advanced: bool,
    /// Whether an endpoint it was asked to revisit was held by another transaction.
    pub missed_revisit: bool,
    /// The endpoints whose turn this claim took, and for each it left full, its cap and
    /// how many requests this claim started for it.
    pub visited: Vec<(Uuid, Option<(u32, u32)>)>,
    /// What is left to do once it has committed.
    follow_up: FollowUp,
    /// The PostgreSQL rows of the claims (with what to send).
    rows: Vec<QueryResult>,
    /// The endpoints' next turns, written by [`settle`].
    turns: Vec<(Uuid, Turn)>,
    /// The ended requests the claim knew of (see [`Claimed::seen`]).
    seen: Vec<Uuid>,
    /// How long until the soonest turn this claim set ahead (see [`Claimed::next_turn_in`]).
    next_turn_in: Option<Duration>,
}

impl Claimed {
    /// A claim of nothing whose follow-up looks again at `endpoint_id` (see [`FollowUp`]).
    pub fn looking_again(endpoint_id: Uuid, default_max_in_flight: u32) -> Self {
        let mut claimed = Claimed::default();
        claimed.follow_up.slept.push(endpoint_id);
        claimed.follow_up.default_max_in_flight = default_max_in_flight;
        claimed
    }

    /// The ended requests this claim left out of in-flight counts: any other that ended
    /// meanwhile, it counted in flight (see [`super::ended::EndedRequests::visited`]).
    pub fn seen(&self) -> &[Uuid] {
        &self.seen
    }

    /// How long until the soonest turn this claim set ahead of now (a rate limit's next
    /// start, a pause's end, a retry's due time, a lease's expiry): the worker looks again
    /// then rather than at its next poll.
    pub fn next_turn_in(&self) -> Option<Duration> {
        self.next_turn_in
    }

    /// The claim's follow-up (see [`FollowUp`]), to run once it has committed without
    /// delaying its requests.
    pub fn follow_up(&mut self) -> FollowUp {
        std::mem::take(&mut self.follow_up)
    }
}

/// Claims up to `limit` due deliveries for `lease` under the default cap, publishes
/// `PROCESSING` for each that was `pending` (retaking an expired lease changes no state),
/// and runs the claim's follow-up.
pub async fn claim_due(
    db: &Db,
    bus: &ChangeBus,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claim>, DbErr> {
    let request = ClaimRequest {
        limit,
        lease,
        default_max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        ended: Snapshot::default(),
        only: None,
        shares: share::Snapshot::default(),
        left_alone: Vec::new(),
        attempts_per_cycle: None,
        outages: None,
    };
    let mut claimed = claim(db, bus, request).await?;
    claimed.follow_up().run(db, bus).await?;
    Ok(claimed.claims)
}

/// [`claim`], with what to send for each claim. On PostgreSQL it comes back from the claim
/// itself; on SQLite it is read right after. The follow-up is left to the caller.
pub async fn claim_due_with_targets(
    db: &Db,
    bus: &ChangeBus,
    keys: &SecretKeys,
    request: ClaimRequest,
) -> Result<(Claimed, Targets), ClaimError> {
    let mut claimed = claim(db, bus, request).await?;
    match targets_of(db, keys, &mut claimed).await {
        Ok(targets) => Ok((claimed, targets)),
        Err(err) => Err(ClaimError::Load(claimed, err)),
    }
}

/// What to send for each of `claimed`'s claims, once it has committed: on PostgreSQL from
/// the rows the claim returned, on SQLite read now.
pub(crate) async fn targets_of(
    db: &Db,
    keys: &SecretKeys,
    claimed: &mut Claimed,
) -> Result<Targets, DbErr> {
    let rows = std::mem::take(&mut claimed.rows);
    match db.backend() {
        DbBackend::Postgres => targets::from_rows(keys, &claimed.claims, &rows),
        _ => load_targets(db, keys, &claimed.claims).await,
    }
}

/// Why [`claim_due_with_targets`] failed.
#[derive(Debug)]
pub enum ClaimError {
    /// Nothing was claimed (or the claim was not confirmed: its rows are reclaimed after
    /// their lease).
    Claim(DbErr),
    /// These were claimed, but what to send could not be read: release them.
    Load(Claimed, DbErr),
}

impl From<DbErr> for ClaimError {
    fn from(err: DbErr) -> Self {
        ClaimError::Claim(err)
    }
}

/// Claims under `request` in one transaction (see the module docs) and publishes the
/// state changes once it commits.
pub async fn claim(db: &Db, bus: &ChangeBus, request: ClaimRequest) -> Result<Claimed, DbErr> {
    if request.limit == 0 {
        return Ok(Claimed::default());
    }
    let request = &request;
    let outages = request.outages.unwrap_or_else(|| db.outages());
    let (claimed, staged) = db
        .transaction(|txn| async move {
            let (mut claimed, changes) = claim_in(&txn, db, request, Commit::Relaxed).await?;
            let staged = settle(&txn, db, bus, &mut claimed, changes).await?;
            super::recovery::no_outage_since(db, outages)?;
            Ok((claimed, staged))
        })
        .await?;
    staged.committed();
    Ok(claimed)
}

/// A claimed row and when the claim changed it.
pub(super) type Taken = (Claim, DateTime<Utc>);

/// The first three steps of a claim inside its transaction, and the state changes to
/// publish (`PENDING` -> `PROCESSING`; retaking an expired lease changes no state). The
/// caller ends it with [`settle`], which writes the turns. `commit`: whether the
/// transaction waits for its WAL flush at commit (see [`Commit`]).
pub(crate) async fn claim_in(
    txn: &DatabaseTransaction,
    db: &Db,
    request: &ClaimRequest,
    commit: Commit,
) -> Result<(Claimed, Vec<StateChange>), DbErr> {
    let most = request.limit.min(MAX_TURNS);
    let ended = &request.ended;
    let mut except = request.shares.full();
    if !request.left_alone.is_empty() {
        except.extend(&request.left_alone);
        except.sort();
        except.dedup();
    }
    let among = match request.only {
        Some(_) => None,
        None => request.shares.only_trusted(),
    };
    let turns = match request.only {
        Some(endpoint_id) => Turns::Of(endpoint_id),
        None => Turns::Ready {
            revisit: &ended.revisit,
            except: &except,
            among: among.as_deref(),
        },
    };
    let (standings, now) =
        turns::lock_turns(txn, db, most, turns, request.default_max_in_flight, commit).await?;
    let mut claimed = Claimed {
        seen: ended.ended.clone(),
        ..Claimed::default()
    };
    claimed.follow_up.default_max_in_flight = request.default_max_in_flight;
    // An endpoint left out for holding its share was not missed: it was not asked for.
    let asked =
        |id: &Uuid| !except.contains(id) && among.as_ref().is_none_or(|among| among.contains(id));
    claimed.missed_revisit = request.only.is_none()
        && ended
            .revisit
            .iter()
            .any(|id| asked(id) && !standings.iter().any(|s| s.endpoint_id == *id));
    if standings.is_empty() {
        if let Some(endpoint_id) = request.only {
            // A claim at submit that found its endpoint's turn held by another claim, or
            // set ahead by one: that claim could not see this submission, and may put the
            // endpoint to sleep with it due. Once this commits, look again.
            claimed.follow_up.slept.push(endpoint_id);
        }
        return Ok((claimed, Vec::new()));
    }
    let mut wants = flow::wants(&standings, now, request.limit, |endpoint_id| {
        request.shares.room(endpoint_id)
    });
    let endpoints: Vec<Uuid> = standings.iter().map(|s| s.endpoint_id).collect();
    request.shares.fit(&endpoints, &mut wants);
    let (taken, rows, facts) = match db.backend() {
        DbBackend::Postgres => {
            let here = postgres::claim(txn, db, &standings, &wants, request).await?;
            (here.taken, here.rows, here.facts)
        }
        _ => {
            let taken = claim_sqlite(txn, db, &standings, &wants, request).await?;
            let mut per_endpoint: HashMap<Uuid, u32> = HashMap::new();
            for (claim, _) in &taken {
                *per_endpoint.entry(claim.endpoint_id).or_default() += 1;
            }
            let ids: Vec<Uuid> = standings.iter().map(|s| s.endpoint_id).collect();
            let facts = turns::facts(txn, db, &ids, &per_endpoint, &ended.ended).await?;
            (taken, Vec::new(), facts)
        }
    };

    // Endpoints given less than they could take for want of room in the shares, with work
    // still due and a free slot of their own cap, wait for it: the heavy share is split
    // among its contenders meanwhile. (One at its cap waits for nothing the shares hold.)
    let could = flow::wants(&standings, now, request.limit, |_| u32::MAX);
    request
        .shares
        .note_waiting(&endpoints, &wants, &could, |endpoint_id| {
            let cap = standings
                .iter()
                .find(|standing| standing.endpoint_id == endpoint_id)
                .map_or(0, |standing| i64::from(standing.max_in_flight));
            facts.get(&endpoint_id).is_some_and(|facts| {
                facts.due_at.is_some_and(|due_at| due_at <= now) && facts.in_flight < cap
            })
        });
    let changes = taken
        .iter()
        .filter(|(claim, _)| claim.previous_state != DeliveryState::Processing)
        .map(|(claim, at)| StateChange {
            delivery_id: claim.delivery_id,
            endpoint_id: claim.endpoint_id,
            previous_state: Some(claim.previous_state),
            state: DeliveryState::Processing,
            at: *at,
        })
        .collect();
    let mut next = Vec::with_capacity(standings.len());
    for standing in &standings {
        let facts = facts.get(&standing.endpoint_id).copied().unwrap_or(Facts {
            taken: 0,
            due_at: None,
            in_flight: 0,
            lease_min: None,
        });
        let turn = flow::next_turn(standing, &facts, now);
        let full = facts.in_flight >= i64::from(standing.max_in_flight);
        // A full endpoint this claim started requests for is looked at again when enough
        // of them end (see `super::ended`); any other that sleeps, once this commits.
        if standing.disabled {
            claimed.follow_up.disabled.push(standing.endpoint_id);
        } else if turn.asleep(now) && !(full && facts.taken > 0) {
            claimed.follow_up.slept.push(standing.endpoint_id);
        }
        claimed.visited.push((
            standing.endpoint_id,
            full.then_some((standing.max_in_flight, facts.taken)),
        ));
        claimed.more |= turn.ready(now);
        claimed.advanced |= !turn.ready(now);
        if let Some(ahead) = turn.turn_at.and_then(|at| (at - now).to_std().ok()) {
            if !ahead.is_zero() {
                claimed.next_turn_in = Some(claimed.next_turn_in.map_or(ahead, |t| t.min(ahead)));
            }
        }
        next.push((standing.endpoint_id, turn));
    }
    // Other endpoints may be ready beyond the turns this claim took, unless it looked at
    // one endpoint only (a claim at submit: the others have wake-ups of their own).
    claimed.more |= request.only.is_none() && standings.len() as u32 == most;
    claimed.turns = next;
    claimed.claims = taken.into_iter().map(|(claim, _)| claim).collect();
    claimed.rows = rows;
    Ok((claimed, changes))
}

/// The last step of a claim begun with [`claim_in`]: writes its endpoints' next turns and
/// stages `changes` (the claim's, after any of the caller's), in one statement on
/// PostgreSQL.
pub(crate) async fn settle(
    txn: &DatabaseTransaction,
    db: &Db,
    bus: &ChangeBus,
    claimed: &mut Claimed,
    changes: Vec<StateChange>,
) -> Result<Staged, DbErr> {
    let next = std::mem::take(&mut claimed.turns);
    turns::set_turns_and_stage(txn, db, bus, &next, changes).await
}

pub(super) fn claim_from(row: &QueryResult, previous_state: DeliveryState) -> Result<Taken, DbErr> {
    let token: Option<Uuid> = row.try_get("", "claim_token")?;
    let lease: Option<DateTime<Utc>> = row.try_get("", "claim_expires_at")?;
    let (Some(claim_token), Some(lease_expires_at)) = (token, lease) else {
        return Err(DbErr::Custom(
            "a claimed row came back without its claim".into(),
        ));
    };
    let claim = Claim {
        delivery_id: row.try_get("", "id")?,
        claim_token,
        previous_state,
        cycle_attempts: row.try_get("", "cycle_attempts")?,
        endpoint_id: row.try_get("", "endpoint_id")?,
        submission_id: row.try_get("", "submission_id")?,
        created_at: row.try_get("", "created_at")?,
        lease_expires_at,
        ordering_key: row.try_get("", "ordering_key")?,
        event_type: row.try_get("", "event_type")?,
    };
    Ok((claim, row.try_get("", "updated_at")?))
}
