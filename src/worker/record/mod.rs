//! Recording what happened (race 2), for many attempts in one transaction: each
//! transition is fenced by its own claim token, and every attempt is kept, numbered for
//! its delivery's lifetime under the delivery's row lock. A line's head that settles hands
//! its line on in the same transaction (see [`crate::service::lines`]).

use sea_orm::ActiveEnum as _;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

mod endpoint_locks;
mod pause;
mod statements;

use self::endpoint_locks::EndpointLocks;
use self::pause::{pause, Paused};
pub use self::statements::RECORDED_ATTEMPTS_POSTGRES;
use self::statements::{
    ATTEMPT_COLUMNS, FENCED_TRANSITIONS, INSERT_ATTEMPTS, LOCK_DELIVERIES, RECORDED_ATTEMPTS,
    TRANSITION_COLUMNS,
};
use super::claim::Claim;
use super::dispatch::{AttemptOutcome, OutcomeKind};
use super::health::{self, HealthPolicy, Settled};
use super::schedule::NextStep;
use crate::bus::{ChangeBus, Staged, StateChange};
use crate::db::parking::with_parking;
use crate::db::sql::{fill, Rows};
use crate::db::Db;
use crate::service::deliveries::tally::Tally;
use crate::service::flow::{wake_endpoints, MAX_PAUSE};
use crate::service::lines;
use crate::service::operational::{self, Operational};
use crate::service::recent_health;

/// One finished attempt, ready to record.
#[derive(Debug, Clone)]
pub struct FinishedAttempt {
    /// The claim that made it.
    pub claim: Claim,
    /// What the endpoint did.
    pub outcome: AttemptOutcome,
    /// What happens next, if the claim still holds.
    pub step: NextStep,
    /// When the request started.
    pub started_at: DateTime<Utc>,
    /// When the outcome was known.
    pub finished_at: DateTime<Utc>,
}

impl FinishedAttempt {
    /// Whether a request was made: a spent cycle ends without one (see
    /// [`OutcomeKind::LeaseSpent`]), and is then no attempt of its own.
    fn requested(&self) -> bool {
        self.outcome.kind != OutcomeKind::LeaseSpent
    }

    /// The state this attempt leads to if its claim still holds, and for a retry, after how
    /// long it is due (counted on the database's clock when recorded).
    fn transition(&self) -> (DeliveryState, Option<Duration>) {
        match self.step {
            NextStep::Delivered => (DeliveryState::Delivered, None),
            NextStep::Failed => (DeliveryState::Failed, None),
            NextStep::RetryAfter(delay) => (DeliveryState::Pending, Some(delay)),
        }
    }
}

/// What recording an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The attempt's lifetime number.
    pub number: i32,
    /// The delivery's new state, or `None` when the claim had been superseded.
    pub new_state: Option<DeliveryState>,
    /// When the next attempt is due, for a retry.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// Records `attempts` and, for each whose claim still holds, its delivery's transition,
/// all in one transaction, applying the outcomes to their endpoints' health under `policy`
/// in the same transaction (see [`super::health`]). Every attempt is recorded; a
/// superseded one is marked so. Results come back in the order of `attempts`.
pub async fn record(
    db: &Db,
    bus: &ChangeBus,
    policy: HealthPolicy,
    attempts: &[FinishedAttempt],
) -> Result<Vec<Recorded>, DbErr> {
    // Two claims on one delivery (a newer one superseded an older) go in separate
    // transactions, in order, so each transaction has one claim per delivery.
    let mut seen = std::collections::HashSet::new();
    if let Some(split) = attempts
        .iter()
        .position(|a| !seen.insert(a.claim.delivery_id))
    {
        let mut results = Box::pin(record(db, bus, policy, &attempts[..split])).await?;
        results.extend(Box::pin(record(db, bus, policy, &attempts[split..])).await?);
        return Ok(results);
    }
    record_unique(db, bus, policy, attempts).await
}

/// [`record`] for attempts on distinct deliveries.
async fn record_unique(
    db: &Db,
    bus: &ChangeBus,
    policy: HealthPolicy,
    attempts: &[FinishedAttempt],
) -> Result<Vec<Recorded>, DbErr> {
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let (results, staged, disabled, paused) = db
        .transaction(|txn| async move { record_in(&txn, db, bus, policy, attempts).await })
        .await?;
    staged.committed();
    health::log_disabled(&disabled);
    for pause in paused {
        let paused_until = pause
            .until
            .map(|until| until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        tracing::warn!(endpoint_id = %pause.endpoint_id, paused_until,
            wait_ms = u64::try_from(pause.wait.as_millis()).unwrap_or(u64::MAX),
            "endpoint paused: it asked to be left alone (Retry-After); its deliveries wait in place");
    }
    // Each settled claim freed a slot of its endpoint, and a retry is due again later: the
    // endpoints are woken once this has committed (a waker that looks after its commit
    // cannot miss a claim putting the endpoint to sleep meanwhile), in a statement of its
    // own, so no claim finds their turns locked for the length of the recording. The
    // sweep makes up for a wake-up lost here.
    let freed: Vec<Uuid> = attempts
        .iter()
        .zip(&results)
        .filter(|(_, recorded)| recorded.new_state.is_some())
        .map(|(attempt, _)| attempt.claim.endpoint_id)
        .collect();
    if let Err(err) = wake_endpoints(db.conn(), db.backend(), &freed).await {
        tracing::warn!(error = %crate::error::error_chain(&err),
            "waking endpoints after recording failed; the sweep will");
    }
    Ok(results)
}

/// The work of [`record_unique`] inside its transaction.
async fn record_in(
    txn: &DatabaseTransaction,
    db: &Db,
    bus: &ChangeBus,
    policy: HealthPolicy,
    attempts: &[FinishedAttempt],
) -> Result<(Vec<Recorded>, Staged, Vec<health::Disabled>, Vec<Paused>), DbErr> {
    let backend = db.backend();
    let mut ids: Vec<Uuid> = attempts.iter().map(|a| a.claim.delivery_id).collect();
    ids.sort();
    ids.dedup();
    let (id_list, id_values) = Db::id_list(backend, 1, &ids, false);

    // The endpoint rows this recording writes, locked in id order before any is touched,
    // and before the deliveries themselves, as replays and disables take them (see
    // `endpoint_locks`).
    let locked = EndpointLocks::of(attempts).lock(txn, backend).await?;

    let mut due: HashMap<Uuid, Option<DateTime<Utc>>> = HashMap::new();
    for row in txn
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            format!(
                "{}{}",
                fill(LOCK_DELIVERIES, &[("ids", &id_list)]),
                db.lock_rows()
            ),
            id_values.clone(),
        ))
        .await?
    {
        due.insert(row.try_get("", "id")?, row.try_get("", "next_attempt_at")?);
    }
    let mut highest: HashMap<Uuid, i32> = HashMap::new();
    let mut already: HashMap<Uuid, (i32, bool)> = HashMap::new();
    for row in txn
        .query_all_raw(match backend {
            DbBackend::Postgres => Statement::from_sql_and_values(
                backend,
                RECORDED_ATTEMPTS_POSTGRES,
                [Value::from(ids.clone())],
            ),
            _ => Statement::from_sql_and_values(
                backend,
                fill(RECORDED_ATTEMPTS, &[("ids", &id_list)]),
                id_values,
            ),
        })
        .await?
    {
        let delivery: Uuid = row.try_get("", "delivery_id")?;
        let token: Uuid = row.try_get("", "claim_token")?;
        let number: i32 = row.try_get("", "number")?;
        let superseded: bool = row.try_get("", "superseded")?;
        let top = highest.entry(delivery).or_default();
        *top = (*top).max(number);
        already.insert(token, (number, superseded));
    }

    // Attempts not yet recorded, with their transitions and lifetime numbers.
    let mut fresh = Vec::new();
    for (index, attempt) in attempts.iter().enumerate() {
        if already.contains_key(&attempt.claim.claim_token) {
            continue;
        }
        let (state, delay) = attempt.transition();
        let top = highest.entry(attempt.claim.delivery_id).or_default();
        // A spent cycle takes no number: the late answer of its last request takes it.
        if attempt.requested() {
            *top += 1;
        }
        fresh.push((index, *top, state, delay));
    }
    if fresh.is_empty() {
        let staged = bus.stage(txn, Vec::new()).await?;
        return Ok((
            finish(attempts, Vec::new(), &already, &due)?,
            staged,
            Vec::new(),
            Vec::new(),
        ));
    }

    // Each delivery appears once per batch, so a returned id names the claim that held:
    // its new due time and the database's time of the change.
    let clock = db.clock();
    let mut rows = Rows::new(backend, TRANSITION_COLUMNS);
    for (index, _, state, delay) in &fresh {
        let attempt = &attempts[*index];
        rows.push([
            Value::from(attempt.claim.delivery_id),
            Value::from(attempt.claim.claim_token),
            Value::from(state.to_value()),
            clock.after(delay.unwrap_or_default()),
            Value::from(attempt.outcome.error.clone().unwrap_or_default()),
            Value::from(i32::from(attempt.requested())),
        ])?;
    }
    let (rows, values) = rows.render(1);
    let sql = fill(
        &with_parking(backend, FENCED_TRANSITIONS),
        &[("rows", &rows)],
    );
    let mut applied: HashMap<Uuid, (Option<DateTime<Utc>>, DateTime<Utc>)> = HashMap::new();
    for row in txn.query_all_raw(clock.statement(&sql, values)).await? {
        applied.insert(
            row.try_get("", "id")?,
            (
                row.try_get("", "next_attempt_at")?,
                row.try_get("", "updated_at")?,
            ),
        );
    }
    let holds = |claim: &Claim| applied.get(&claim.delivery_id);

    let mut rows = Rows::new(backend, ATTEMPT_COLUMNS);
    let requested = fresh
        .iter()
        .filter(|(index, ..)| attempts[*index].requested());
    for (index, number, ..) in requested.clone() {
        let attempt = &attempts[*index];
        let outcome = &attempt.outcome;
        rows.push([
            Value::from(crate::db::ids::new_id()),
            Value::from(attempt.claim.delivery_id),
            Value::from(*number),
            Value::from(attempt.claim.claim_token),
            Value::from(attempt.started_at),
            Value::from(attempt.finished_at),
            Value::from(outcome.status.map_or(0, i32::from)),
            Value::from(outcome.error.clone().unwrap_or_default()),
            Value::from(i32::try_from(outcome.duration.as_millis()).unwrap_or(i32::MAX)),
            Value::from(holds(&attempt.claim).is_none()),
            Value::from(
                outcome
                    .answer
                    .as_ref()
                    .map(|a| a.body.clone())
                    .unwrap_or_default(),
            ),
            Value::from(
                outcome
                    .answer
                    .as_ref()
                    .map(|a| a.headers.clone())
                    .unwrap_or_default(),
            ),
        ])?;
    }
    if !rows.is_empty() {
        let (rows, values) = rows.render(1);
        let sql = fill(INSERT_ATTEMPTS, &[("rows", &rows)]);
        txn.execute_raw(Statement::from_sql_and_values(backend, sql, values))
            .await?;
    }
    // Every attempt counts toward its endpoint's last hour (`Endpoint.health`), written
    // last (see below).
    let mut minutes = recent_health::Minutes::new();
    for (index, ..) in requested {
        let attempt = &attempts[*index];
        let outcome = &attempt.outcome;
        minutes.add(
            attempt.claim.endpoint_id,
            attempt.finished_at,
            outcome
                .status
                .is_some_and(|status| (200..300).contains(&status)),
            i64::try_from(outcome.duration.as_millis()).unwrap_or(i64::MAX),
        );
    }

    let mut changes = Vec::new();
    let mut results: Vec<Option<Recorded>> = vec![None; attempts.len()];
    for (index, number, state, _) in &fresh {
        let claim = &attempts[*index].claim;
        let held = holds(claim).copied();
        if let Some((_, at)) = held {
            changes.push(StateChange {
                delivery_id: claim.delivery_id,
                endpoint_id: claim.endpoint_id,
                previous_state: Some(DeliveryState::Processing),
                state: *state,
                at,
            });
        }
        results[*index] = Some(Recorded {
            number: *number,
            new_state: held.map(|_| *state),
            next_attempt_at: held.and_then(|(next, _)| next),
        });
    }
    // The endpoints' health moves with their deliveries' outcomes, in this transaction.
    let settled: Vec<Settled> = fresh
        .iter()
        .filter(|(index, ..)| holds(&attempts[*index].claim).is_some())
        .map(|(index, _, state, _)| Settled {
            endpoint_id: attempts[*index].claim.endpoint_id,
            state: *state,
            gone: health::is_gone(&attempts[*index].outcome),
            at: attempts[*index].finished_at,
        })
        .collect();
    // A delivery of an operational event that fails or asks to wait is not announced
    // again, so two alerting endpoints cannot feed each other events.
    let operational_delivery = |claim: &Claim| {
        claim
            .event_type
            .as_deref()
            .is_some_and(operational::is_operational)
    };
    // A `Retry-After` on 429 or 503 pauses the whole endpoint, on every process (and the
    // pause is announced unless only operational deliveries asked for it).
    let mut pauses: BTreeMap<Uuid, (Duration, bool)> = BTreeMap::new();
    for (index, ..) in &fresh {
        let attempt = &attempts[*index];
        if let Some(wait) = attempt.outcome.retry_after.filter(|wait| !wait.is_zero()) {
            let (pause, told) = pauses.entry(attempt.claim.endpoint_id).or_default();
            *pause = (*pause).max(wait.min(MAX_PAUSE));
            *told |= !operational_delivery(&attempt.claim);
        }
    }
    let mut paused = Vec::with_capacity(pauses.len());
    let mut events = Vec::new();
    for (endpoint_id, (wait, told)) in pauses {
        if let Some(pause) = pause(txn, db, endpoint_id, wait).await? {
            if let (true, false, Some(until)) = (told, pause.extended, pause.until) {
                events.push(Operational::Paused { endpoint_id, until });
            }
            paused.push(pause);
        }
    }
    // Each delivery that ended its cycle failed is told to operators.
    events.extend(
        fresh
            .iter()
            .map(|(index, _, state, _)| (&attempts[*index].claim, *state))
            .filter(|(claim, state)| {
                holds(claim).is_some()
                    && *state == DeliveryState::Failed
                    && !operational_delivery(claim)
            })
            .map(|(claim, _)| Operational::DeliveryFailed {
                delivery_id: claim.delivery_id,
                endpoint_id: claim.endpoint_id,
            }),
    );
    // Endpoint rows are locked above (failure runs, disables, pauses, the listeners of
    // these events) before any ordering line below, the order every submit takes them in.
    // The failures and pauses are told before the disables they cause (listeners hear of
    // an endpoint's events in the order they were made).
    let mut announced = operational::publish(txn, backend, &events).await?;
    let (disabled, disables_announced) =
        health::settle(txn, backend, policy, &settled, locked.as_ref()).await?;
    announced.extend(disables_announced);
    // A head that settled hands its line to the next delivery waiting in it.
    let lines_settled: Vec<(Uuid, String)> = fresh
        .iter()
        .map(|(index, _, state, _)| (&attempts[*index].claim, *state))
        .filter(|(claim, state)| {
            holds(claim).is_some()
                && matches!(state, DeliveryState::Delivered | DeliveryState::Failed)
        })
        .filter_map(|(claim, _)| {
            claim
                .ordering_key
                .clone()
                .map(|key| (claim.endpoint_id, key))
        })
        .collect();
    lines::hand_on(txn, backend, &lines_settled).await?;
    // A head whose attempt ended in a retry gives its line to an earlier delivery replayed
    // while it was in flight: the head finished its attempt, the replayed one goes next.
    let retried_keyed: Vec<Uuid> = fresh
        .iter()
        .map(|(index, _, state, _)| (&attempts[*index].claim, *state))
        .filter(|(claim, state)| {
            *state == DeliveryState::Pending
                && claim.ordering_key.is_some()
                && holds(claim).is_some()
        })
        .map(|(claim, _)| claim.delivery_id)
        .collect();
    lines::yield_to_earlier(txn, backend, &retried_keyed).await?;
    // Delivered counts move with the deliveries, in this transaction.
    let mut tally = Tally::new();
    for done in &settled {
        tally.moved(
            done.endpoint_id,
            Some(DeliveryState::Processing),
            Some(done.state),
        );
    }
    tally.write(txn, backend).await?;
    // The health minutes after every endpoint row this transaction locks (failure runs,
    // disables, pauses, the listeners of operational events): written before them, a
    // minute's row inserted here could be waited on by a recorder holding an endpoint
    // this transaction then waits for, a deadlock.
    minutes.write(txn, backend).await?;
    changes.extend(announced);
    let staged = bus.stage(txn, changes).await?;
    Ok((
        finish(attempts, results, &already, &due)?,
        staged,
        disabled,
        paused,
    ))
}

/// Fills in the results of attempts that an earlier try of this batch already recorded.
fn finish(
    attempts: &[FinishedAttempt],
    mut results: Vec<Option<Recorded>>,
    already: &HashMap<Uuid, (i32, bool)>,
    due: &HashMap<Uuid, Option<DateTime<Utc>>>,
) -> Result<Vec<Recorded>, DbErr> {
    results.resize(attempts.len(), None);
    attempts
        .iter()
        .zip(results.iter_mut())
        .map(|(attempt, result)| match result.take() {
            Some(recorded) => Ok(recorded),
            None => {
                let (number, superseded) = already
                    .get(&attempt.claim.claim_token)
                    .copied()
                    .ok_or_else(|| {
                        DbErr::Custom("an attempt was neither new nor recorded".into())
                    })?;
                let (state, _) = attempt.transition();
                let next_at = due.get(&attempt.claim.delivery_id).copied().flatten();
                Ok(Recorded {
                    number,
                    new_state: (!superseded).then_some(state),
                    next_attempt_at: if superseded { None } else { next_at },
                })
            }
        })
        .collect()
}
