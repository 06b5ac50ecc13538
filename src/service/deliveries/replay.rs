//! Starting a delivery's cycle again (race 4): replaying a `failed` one, resending a
//! `delivered` one, and replaying every failed delivery a filter matches, in batches.
//! Each is one conditional UPDATE per row: whoever's UPDATE matches wins, and a row that
//! another replay took first is simply not matched again.

use chrono::{DateTime, Utc};
use entity::endpoint;
use entity::webhook_delivery::{self, DeliveryState};
use sea_orm::{
    ActiveEnum as _, ConnectionTrait, DbBackend, EntityTrait as _, FromQueryResult,
    QueryFilter as _, QueryOrder as _, QuerySelect as _, Statement, Value,
};
use uuid::Uuid;

use super::tally::Tally;
use super::{state_filter, Deliveries};
use crate::auth::Identity;
use crate::bus::{Staged, StateChange};
use crate::db::parking::{lock_endpoints_of, with_parking};
use crate::db::sql::fill;
use crate::db::{Db, Progress};
use crate::error::{Error, Result};
use crate::service::access::{Access, Visible};
use crate::service::flow;
use crate::service::lines;
use crate::service::submissions::store::placed;
use crate::service::time_range;

/// The `SET` of a new cycle, one rule for every restart: pending, due now on the database's
/// clock (or parked while the endpoint is disabled), with a fresh count of attempts;
/// lifetime numbers continue. The same `webhook-id` (the delivery's id) goes out again.
macro_rules! new_cycle {
    () => {
        "SET state = 'pending', cycle_attempts = 0, updated_at = {now}, resume_at = NULL,
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
"
    };
}

/// A new cycle (`new_cycle!`) for one delivery in state `$2`. A delivery with an ordering
/// key then rejoins its line ([`lines::rejoin`]), as its head or waiting.
const RESTART: &str = concat!(
    "UPDATE webhook_deliveries\n",
    new_cycle!(),
    "WHERE id = $1 AND state = $2
RETURNING *"
);

/// [`RESTART`] on PostgreSQL, saying what it found: the row is locked first (`seen`, which
/// waits for a concurrent replay's commit and then reads what it wrote), the restart
/// matches only if that state is `$2`, and the one row returned holds the state it found
/// (`seen_state`) with the restarted row's columns, null when it did not match. A loser
/// so reports the state it lost to, not a later one (the winner's cycle may have ended
/// by the time a second read would run). No row: no such delivery.
const RESTART_REPORTING: &str = concat!(
    "WITH seen AS MATERIALIZED (
    SELECT id, state FROM webhook_deliveries WHERE id = $1 FOR UPDATE
), restarted AS (
    UPDATE webhook_deliveries
    ",
    new_cycle!(),
    "    FROM seen
    WHERE webhook_deliveries.id = seen.id AND seen.state = $2
    RETURNING webhook_deliveries.*
)
SELECT seen.state AS seen_state, restarted.*
FROM seen LEFT JOIN restarted ON restarted.id = seen.id"
);

/// On SQLite, the state a restart that matched nothing found: read in its transaction,
/// which holds the write lock its UPDATE took, so no other write came between.
const STATE_OF: &str = "SELECT state AS seen_state FROM webhook_deliveries WHERE id = $1";

/// The next batch of failed deliveries a bulk replay looks at: ids after the cursor `$1`,
/// in id order (the failed-only indexes), `{failed}` (see [`state_filter::in_state`]) and
/// narrowed by `{filters}`. Read without locks: the replay itself re-checks each row under
/// its lock.
const NEXT_FAILED: &str = "\
SELECT id FROM webhook_deliveries
WHERE {failed} AND id > $1{filters}
ORDER BY id LIMIT {limit}";

/// Locks those of the batch `{ids}` (a [`Db::id_list`]) still `failed`, in id order, so
/// concurrent replays of overlapping batches cannot deadlock; a row another replay took
/// meanwhile no longer matches once its lock is granted. With each, when it failed as its
/// lock finds it (one replayed and failed again meanwhile failed later than the batch read).
const LOCK_FAILED: &str = "SELECT id, updated_at FROM webhook_deliveries \
     WHERE id {ids} AND state = 'failed' ORDER BY id{lock}";

/// Replays the locked rows `{ids}` as [`RESTART`] does.
const REPLAY_LOCKED: &str = concat!(
    "UPDATE webhook_deliveries\n",
    new_cycle!(),
    "WHERE id {ids} AND state = 'failed'
RETURNING id, endpoint_id, updated_at, ordering_key"
);

/// Failed deliveries replayed per transaction: each batch commits on its own, so no lock is
/// held for longer than one batch takes, and claims and recording go on in between.
pub const REPLAY_BATCH: usize = 500;

/// After each batch a bulk replay rests as long as the batch took, so it takes at most
/// half of the database's time and claims for other endpoints keep most of theirs.
const REST_PER_BATCH: u32 = 1;

/// What one restart did.
enum Restart {
    /// It matched: the restarted row, and its announcement.
    Done(Box<webhook_delivery::Model>, Staged),
    /// The delivery was in this other state.
    Refused(DeliveryState),
    /// There is no such delivery.
    Missing,
}

/// Which failed deliveries a bulk replay takes.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    /// Only this endpoint's.
    pub endpoint_id: Option<Uuid>,
    /// Only those of submissions with this event type.
    pub event_type: Option<String>,
    /// Only those that failed at or after this moment.
    pub since: Option<DateTime<Utc>>,
    /// Only those that failed at or before this moment.
    pub until: Option<DateTime<Utc>>,
}

impl Deliveries {
    /// Replays a `failed` delivery: it becomes `pending`, due now, with a new cycle of
    /// attempts; lifetime attempt numbers continue. Any other state, including a replay
    /// that another caller won a moment ago, is `DELIVERY_NOT_REPLAYABLE`. Partners replay
    /// within their scope.
    #[tracing::instrument(skip_all, fields(delivery_id = %id))]
    pub async fn replay(&self, caller: &Identity, id: Uuid) -> Result<webhook_delivery::Model> {
        let replayed = self.restart(caller, id, DeliveryState::Failed).await?;
        self.metrics.replays.inc();
        tracing::info!("delivery replayed");
        Ok(replayed)
    }

    /// Sends a `delivered` delivery again: a new cycle, the same `webhook-id`, every earlier
    /// attempt kept. Any other state is `DELIVERY_NOT_REPLAYABLE`.
    #[tracing::instrument(skip_all, fields(delivery_id = %id))]
    pub async fn resend(&self, caller: &Identity, id: Uuid) -> Result<webhook_delivery::Model> {
        let resent = self.restart(caller, id, DeliveryState::Delivered).await?;
        self.metrics.resends.inc();
        tracing::info!("delivery resent");
        Ok(resent)
    }

    /// [`RESTART`] for a delivery in state `from`, within the caller's scope.
    async fn restart(
        &self,
        caller: &Identity,
        id: Uuid,
        from: DeliveryState,
    ) -> Result<webhook_delivery::Model> {
        if caller.visible() != Visible::Everything {
            // A delivery never changes endpoint, so its scope can be checked before the race.
            let found = self.load(id).await?;
            self.access
                .reveal(caller, found, |found| found.endpoint_id)
                .await?;
        }
        let (db, bus) = (&self.db, &self.bus);
        let restarted = db
            .transaction(|txn| async move {
                let postgres = db.backend() == DbBackend::Postgres;
                // The endpoint first, as bulk replays and recordings take it.
                lock_endpoints_of(&*txn, db.backend(), &[id]).await?;
                let template = if postgres { RESTART_REPORTING } else { RESTART };
                let sql = with_parking(db.backend(), template);
                let values = [Value::from(id), Value::from(from.to_value())];
                let row = txn
                    .query_one_raw(db.clock().statement(&sql, values))
                    .await?;
                let restarted_row = match row {
                    // PostgreSQL: the state it found, and the row if it matched.
                    Some(row) if postgres => {
                        let restarted: Option<Uuid> = row.try_get("", "id")?;
                        if restarted.is_none() {
                            let seen: DeliveryState = row.try_get("", "seen_state")?;
                            return Ok(Restart::Refused(seen));
                        }
                        row
                    }
                    Some(row) => row,
                    None if postgres => return Ok(Restart::Missing),
                    None => {
                        let seen = txn
                            .query_one_raw(db.clock().statement(STATE_OF, [Value::from(id)]))
                            .await?;
                        return Ok(match seen {
                            Some(seen) => Restart::Refused(seen.try_get("", "seen_state")?),
                            None => Restart::Missing,
                        });
                    }
                };
                let mut restarted = webhook_delivery::Model::from_query_result(&restarted_row, "")?;
                // A restarted delivery is unsettled again: it rejoins its line.
                let places = lines::rejoin(&*txn, db.backend(), &[restarted.id]).await?;
                if let Some(place) = places.get(&restarted.id) {
                    placed(&mut restarted, *place);
                }
                let staged = announce(
                    &*txn,
                    db,
                    bus,
                    from,
                    &[(restarted.id, restarted.endpoint_id, restarted.updated_at)],
                )
                .await?;
                Ok(Restart::Done(Box::new(restarted), staged))
            })
            .await?;
        let (restarted, staged) = match restarted {
            Restart::Done(restarted, staged) => (*restarted, staged),
            // Every loser is told the state the database settled on when it lost.
            Restart::Refused(state) => return Err(Error::NotReplayable { state, needs: from }),
            Restart::Missing => return Err(Error::NotFound("delivery")),
        };
        staged.committed();
        self.wakeup.hint();
        // The winner answers with the row its UPDATE wrote.
        Ok(restarted)
    }

    /// Replays every `failed` delivery `filter` matches within the caller's scope, in
    /// batches of [`REPLAY_BATCH`], each its own transaction; returns how many this call
    /// replayed. However many bulk and single replays run at once, on however many
    /// processes, each failed delivery is replayed by exactly one of them. Each committed
    /// batch is reported to `progress`. Deliveries that fail after the walk passed them
    /// are left for the next call.
    #[tracing::instrument(skip_all)]
    pub async fn replay_matching(
        &self,
        caller: &Identity,
        filter: &ReplayFilter,
        progress: Option<&Progress>,
    ) -> Result<u64> {
        time_range::validate(filter.since, filter.until, "filter.since", "filter.until")?;
        let filter = &ReplayFilter {
            event_type: filter
                .event_type
                .as_deref()
                .map(crate::service::event_types::validate)
                .transpose()?,
            ..filter.clone()
        };
        // The endpoints it walks, each through its own failed index: the one named, or
        // every endpoint in the caller's scope (a partner's list, a tenant's endpoints, as
        // they are now), or, for an admin, every failure at once.
        let endpoints: Vec<Option<Uuid>> = match filter.endpoint_id {
            Some(endpoint) => {
                self.access.require_existing(caller, endpoint).await?;
                vec![Some(endpoint)]
            }
            None => match Access::endpoints_condition(caller) {
                None => vec![None],
                Some(in_scope) => endpoint::Entity::find()
                    .select_only()
                    .column(endpoint::Column::Id)
                    .filter(in_scope)
                    .order_by_asc(endpoint::Column::Id)
                    .into_tuple::<Uuid>()
                    .all(self.db.conn())
                    .await?
                    .into_iter()
                    .map(Some)
                    .collect(),
            },
        };
        let mut replayed = 0u64;
        for endpoint_id in endpoints {
            let filter = ReplayFilter {
                endpoint_id,
                ..filter.clone()
            };
            replayed += self.replay_walk(&filter, progress).await?;
        }
        tracing::info!(replayed, "failed deliveries replayed in bulk");
        Ok(replayed)
    }

    /// Replays every failed delivery `filter` matches (of one endpoint, or of every
    /// endpoint), walking them in id order a batch at a time; returns how many.
    async fn replay_walk(&self, filter: &ReplayFilter, progress: Option<&Progress>) -> Result<u64> {
        let (filters, mut values) = conditions(filter);
        // One endpoint's failures are read from its own index.
        let failed = state_filter::in_state(DeliveryState::Failed, filter.endpoint_id.is_some());
        let next_failed = fill(
            NEXT_FAILED,
            &[
                ("failed", &failed),
                ("filters", &filters),
                ("limit", &REPLAY_BATCH.to_string()),
            ],
        );
        let mut cursor = Uuid::nil();
        let mut replayed = 0u64;
        loop {
            values[0] = Value::from(cursor);
            let rows = self
                .db
                .conn()
                .query_all_raw(Statement::from_sql_and_values(
                    self.db.backend(),
                    &next_failed,
                    values.clone(),
                ))
                .await?;
            let batch = rows
                .iter()
                .map(|row| row.try_get::<Uuid>("", "id"))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let Some(last) = batch.last() else {
                break;
            };
            cursor = *last;
            let batch_started = std::time::Instant::now();
            replayed += self.replay_batch(&batch, filter).await?;
            if let Some(progress) = progress {
                progress.made();
            }
            if batch.len() < REPLAY_BATCH {
                break;
            }
            tokio::time::sleep(batch_started.elapsed() * REST_PER_BATCH).await;
            if let Some(progress) = progress {
                progress.made();
            }
        }
        Ok(replayed)
    }

    /// Replays those of `ids` still failed, and failed within `window`'s `since` and
    /// `until`, in one transaction; returns how many.
    async fn replay_batch(&self, ids: &[Uuid], window: &ReplayFilter) -> Result<u64> {
        let (db, bus) = (&self.db, &self.bus);
        let backend = db.backend();
        let (replayed, staged) = db
            .transaction(|txn| async move {
                let (list, values) = Db::id_list(backend, 1, ids, false);
                // The endpoints first, as recordings take them (a delivery's endpoint never
                // changes, so the batch names them before its rows are locked).
                lock_endpoints_of(&*txn, backend, ids).await?;
                let lock = fill(LOCK_FAILED, &[("ids", &list), ("lock", db.lock_rows())]);
                // Under their locks, the failures still within the filter's window.
                let mut locked = Vec::with_capacity(ids.len());
                for row in txn
                    .query_all_raw(Statement::from_sql_and_values(backend, &lock, values))
                    .await?
                {
                    let failed_at = row.try_get::<DateTime<Utc>>("", "updated_at")?;
                    if window.since.is_none_or(|since| failed_at >= since)
                        && window.until.is_none_or(|until| failed_at <= until)
                    {
                        locked.push(row.try_get::<Uuid>("", "id")?);
                    }
                }
                if locked.is_empty() {
                    return Ok((0, bus.stage(&*txn, Vec::new()).await?));
                }
                let (list, values) = Db::id_list(backend, 1, &locked, false);
                let sql = fill(&with_parking(backend, REPLAY_LOCKED), &[("ids", &list)]);
                let mut replayed = Vec::with_capacity(locked.len());
                let mut keyed = Vec::new();
                for row in txn
                    .query_all_raw(db.clock().statement(&sql, values))
                    .await?
                {
                    let id = row.try_get::<Uuid>("", "id")?;
                    if row.try_get::<Option<String>>("", "ordering_key")?.is_some() {
                        keyed.push(id);
                    }
                    replayed.push((
                        id,
                        row.try_get::<Uuid>("", "endpoint_id")?,
                        row.try_get::<DateTime<Utc>>("", "updated_at")?,
                    ));
                }
                lines::rejoin(&*txn, backend, &keyed).await?;
                let staged = announce(&*txn, db, bus, DeliveryState::Failed, &replayed).await?;
                Ok((replayed.len() as u64, staged))
            })
            .await?;
        staged.committed();
        if replayed > 0 {
            self.metrics.replays.inc_by(replayed);
            self.wakeup.hint();
        }
        Ok(replayed)
    }
}

/// In the transaction that restarted them: takes the deliveries out of the `from` count,
/// wakes their endpoints, and stages their change from `from` to `pending` for subscribers.
async fn announce(
    txn: &impl ConnectionTrait,
    db: &Db,
    bus: &crate::bus::ChangeBus,
    from: DeliveryState,
    restarted: &[(Uuid, Uuid, DateTime<Utc>)],
) -> std::result::Result<Staged, sea_orm::DbErr> {
    let mut tally = Tally::new();
    for (_, endpoint_id, _) in restarted {
        tally.moved(*endpoint_id, Some(from), Some(DeliveryState::Pending));
    }
    tally.write(txn, db.backend()).await?;
    let endpoints: Vec<Uuid> = restarted.iter().map(|(_, endpoint, _)| *endpoint).collect();
    flow::wake_endpoints(txn, db.backend(), &endpoints).await?;
    let changes = restarted
        .iter()
        .map(|(delivery_id, endpoint_id, at)| StateChange {
            delivery_id: *delivery_id,
            endpoint_id: *endpoint_id,
            previous_state: Some(from),
            state: DeliveryState::Pending,
            at: *at,
        })
        .collect();
    bus.stage(txn, changes).await
}

/// The SQL narrowing [`NEXT_FAILED`] to `filter`, and its values from `$1` on; `$1`, the
/// cursor, is bound per batch.
fn conditions(filter: &ReplayFilter) -> (String, Vec<Value>) {
    let mut sql = String::new();
    let mut values = vec![Value::from(Uuid::nil())];
    if let Some(endpoint) = filter.endpoint_id {
        values.push(Value::from(endpoint));
        sql.push_str(&format!(" AND endpoint_id = ${}", values.len()));
    }
    if let Some(since) = filter.since {
        values.push(Value::from(since));
        sql.push_str(&format!(" AND updated_at >= ${}", values.len()));
    }
    if let Some(until) = filter.until {
        values.push(Value::from(until));
        sql.push_str(&format!(" AND updated_at <= ${}", values.len()));
    }
    if let Some(event_type) = &filter.event_type {
        values.push(Value::from(event_type.clone()));
        sql.push_str(&format!(" AND event_type = ${}", values.len()));
    }
    (sql, values)
}
