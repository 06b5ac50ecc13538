//! Deliveries: reading them and their attempts, listing for dashboards, and counts; replay
//! and resend live in [`replay`].

mod change_reads;
mod due_gauge;
mod listing;
mod replay;
mod set_page;
mod state_filter;
pub mod tally;

pub use self::change_reads::ChangeReads;
pub use self::due_gauge::DUE_MEASURE_INTERVAL;
pub use self::replay::{ReplayFilter, REPLAY_BATCH};
pub use self::tally::StateCounts;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use entity::delivery_attempt;
use entity::webhook_delivery::{self, DeliveryState};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::auth::Identity;
use crate::bus::Wakeup;
use crate::bus::{ChangeBus, StateChange};
use crate::db::Db;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::service::access::Access;
use crate::service::pagination::{Page, PageRequest};

/// Which deliveries a listing shows.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    /// Only this endpoint's.
    pub endpoint_id: Option<Uuid>,
    /// Only those in this state.
    pub state: Option<DeliveryState>,
    /// Only those of submissions with this event type.
    pub event_type: Option<String>,
    /// Only those fanned out from this event.
    pub event_id: Option<Uuid>,
    /// Only those created at or after this moment.
    pub created_after: Option<DateTime<Utc>>,
    /// Only those created before this moment.
    pub created_before: Option<DateTime<Utc>>,
    /// Only those to endpoints of this tenant.
    pub tenant_id: Option<Uuid>,
}

/// Delivery operations.
#[derive(Clone, Debug)]
pub struct Deliveries {
    db: Db,
    access: Access,
    bus: ChangeBus,
    wakeup: Wakeup,
    metrics: Arc<Metrics>,
    change_reads: ChangeReads,
    due_gauge: due_gauge::MeasureGate,
}

impl Deliveries {
    /// Delivery operations on `db`.
    pub fn new(
        db: Db,
        access: Access,
        bus: ChangeBus,
        wakeup: Wakeup,
        metrics: Arc<Metrics>,
    ) -> Self {
        Deliveries {
            db,
            access,
            bus,
            wakeup,
            metrics,
            change_reads: ChangeReads::default(),
            due_gauge: due_gauge::MeasureGate::default(),
        }
    }

    /// The delivery a state change was of, as it is now, read once for every subscriber
    /// of that change that asks (see [`ChangeReads`]); no scope check (subscribers only
    /// hear of changes in their scope).
    pub async fn load_after(
        &self,
        change: &StateChange,
    ) -> Result<Option<webhook_delivery::Model>> {
        let read = self.change_reads.read_of(change);
        Ok(read
            .get_or_try_init(|| self.load(change.delivery_id))
            .await?
            .clone())
    }

    /// Reads the deliveries of `changes` not yet read for their subscribers in one
    /// statement, so that a subscriber with a run of changes waiting reads them together
    /// rather than one round trip each (see [`ChangeReads`]); what this does not read, a
    /// subscriber reads alone.
    pub async fn read_changes_ahead(&self, changes: &[&StateChange]) -> Result<()> {
        let unread: Vec<_> = changes
            .iter()
            .map(|change| (change.delivery_id, self.change_reads.read_of(change)))
            .filter(|(_, read)| !read.initialized())
            .collect();
        if unread.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<Uuid> = unread.iter().map(|(id, _)| *id).collect();
        ids.sort();
        ids.dedup();
        let found: HashMap<Uuid, webhook_delivery::Model> = webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::Id.is_in(ids))
            .all(self.db.conn())
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect();
        for (id, read) in unread {
            // Another subscriber reading it meanwhile sets it first: either read stands.
            let _ = read.set(found.get(&id).cloned());
        }
        Ok(())
    }

    /// The deliveries of `changes` as read for their subscribers so far (see
    /// [`Deliveries::read_changes_ahead`]), one for each change whose delivery was read
    /// and exists, in the order of the changes.
    pub fn changes_read(&self, changes: &[&StateChange]) -> Vec<webhook_delivery::Model> {
        changes
            .iter()
            .filter_map(|change| self.change_reads.read_of(change).get().cloned().flatten())
            .collect()
    }

    /// One delivery, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(
        &self,
        caller: &Identity,
        id: Uuid,
    ) -> Result<Option<webhook_delivery::Model>> {
        let found = self.load(id).await?;
        self.access
            .reveal(caller, found, |found| found.endpoint_id)
            .await
    }

    /// One delivery by id, with no scope check: for fields of rows already checked.
    pub async fn load(&self, id: Uuid) -> Result<Option<webhook_delivery::Model>> {
        Ok(webhook_delivery::Entity::find_by_id(id)
            .one(self.db.conn())
            .await?)
    }

    /// What `delivery` waits behind, if it waits in an ordering line: the line's head (the
    /// same endpoint's, so in the caller's scope whenever `delivery` is), with no scope check.
    pub async fn waiting_behind(
        &self,
        delivery: &webhook_delivery::Model,
    ) -> Result<Option<webhook_delivery::Model>> {
        let (true, Some(key)) = (delivery.waiting, &delivery.ordering_key) else {
            return Ok(None);
        };
        let head = crate::service::lines::head_of(
            self.db.conn(),
            self.db.backend(),
            delivery.endpoint_id,
            key,
        )
        .await?;
        match head {
            Some(id) if id != delivery.id => self.load(id).await,
            _ => Ok(None),
        }
    }

    /// The deliveries of these submissions, with no scope check.
    pub async fn load_for_submissions(
        &self,
        submission_ids: &[Uuid],
    ) -> Result<Vec<webhook_delivery::Model>> {
        Ok(webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::SubmissionId.is_in(submission_ids.iter().copied()))
            .all(self.db.conn())
            .await?)
    }

    /// Every attempt of these deliveries, by delivery and lifetime number.
    pub async fn attempts_of(&self, delivery_ids: &[Uuid]) -> Result<Vec<delivery_attempt::Model>> {
        Ok(delivery_attempt::Entity::find()
            .filter(delivery_attempt::Column::DeliveryId.is_in(delivery_ids.iter().copied()))
            .order_by_asc(delivery_attempt::Column::DeliveryId)
            .order_by_asc(delivery_attempt::Column::Number)
            .all(self.db.conn())
            .await?)
    }

    /// Deliveries the caller may see, newest first, keyset-paged by id.
    pub async fn list(
        &self,
        caller: &Identity,
        filter: DeliveryFilter,
        page: PageRequest,
    ) -> Result<Page<webhook_delivery::Model>> {
        let listing = self.listing(caller, filter, &page).await?;
        let txn = self
            .db
            .begin_listing(listing.in_order, listing.read.in_steps())
            .await?;
        let statement = match listing.read {
            listing::Read::Statement(statement) => statement,
            listing::Read::Set(set) => {
                let heads = set.heads(&txn).await?;
                set.page_statement(&heads, self.db.backend())
            }
        };
        let rows = webhook_delivery::Entity::find()
            .from_raw_sql(statement)
            .all(&txn)
            .await?;
        txn.commit().await?;
        Ok(Page::from_overfetch(rows, &page))
    }

    /// The plans and the work of one page of [`Deliveries::list`], run as it runs
    /// (`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`, PostgreSQL only): for checking that a
    /// listing reads a page, not the history. One plan for each statement the page runs,
    /// in the order it runs them (a statement whose answer the next is made from runs once
    /// more, unexplained, for that answer: in the page's one snapshot, the same).
    pub async fn explain_listing(
        &self,
        caller: &Identity,
        filter: DeliveryFilter,
        page: &PageRequest,
    ) -> Result<Vec<serde_json::Value>> {
        let listing = self.listing(caller, filter, page).await?;
        let txn = self
            .db
            .begin_listing(listing.in_order, listing.read.in_steps())
            .await?;
        let plans = match listing.read {
            listing::Read::Statement(statement) => vec![explain(&txn, statement).await?],
            listing::Read::Set(set) => {
                let heads = set.heads_statement(self.db.backend());
                let heads_plan = explain(&txn, heads).await?;
                let heads = set.heads(&txn).await?;
                let page = set.page_statement(&heads, self.db.backend());
                vec![heads_plan, explain(&txn, page).await?]
            }
        };
        txn.commit().await?;
        Ok(plans)
    }

    /// Sets the `courier_deliveries_due` gauge to [`Deliveries::due_count`], unless a count
    /// began less than [`DUE_MEASURE_INTERVAL`] ago (the gauge then keeps that count's value):
    /// one count at a time, however many scrapes arrive.
    pub async fn measure_due(&self) -> Result<()> {
        if let Some(due) = self
            .due_gauge
            .measure(DUE_MEASURE_INTERVAL, self.due_count())
            .await?
        {
            self.metrics.due_depth.set(due);
        }
        Ok(())
    }

    /// How many deliveries are due now (waiting to be claimed), for the queue-depth gauge;
    /// those of an endpoint paused by `Retry-After` are not counted.
    pub async fn due_count(&self) -> Result<i64> {
        // Those of an endpoint paused by `Retry-After` are held, not due: a backlog alert
        // must not fire for a receiver that asked for the pause.
        const DUE_COUNT: &str = "SELECT COUNT(*) AS due FROM webhook_deliveries d \
             WHERE {due(d)} \
             AND NOT EXISTS (SELECT 1 FROM endpoints e \
                             WHERE e.id = d.endpoint_id AND e.paused_until > {now})";
        let row = self
            .db
            .conn()
            .query_one_raw(self.db.clock().statement(DUE_COUNT, []))
            .await?;
        Ok(row
            .map(|row| row.try_get::<i64>("", "due"))
            .transpose()?
            .unwrap_or(0))
    }

    /// Per-state counts for each of these endpoints (no scope check), without counting
    /// history (see [`tally`]).
    pub async fn counts(&self, endpoint_ids: &[Uuid]) -> Result<HashMap<Uuid, StateCounts>> {
        Ok(tally::counts(&self.db, endpoint_ids).await?)
    }
}

/// `statement` run under `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` on `txn`: its plan.
async fn explain(
    txn: &crate::db::ListingTxn,
    statement: sea_orm::Statement,
) -> Result<serde_json::Value> {
    let explained = sea_orm::Statement::from_sql_and_values(
        statement.db_backend,
        format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", statement.sql),
        statement.values.map(|values| values.0).unwrap_or_default(),
    );
    let plan = txn
        .query_one_raw(explained)
        .await?
        .ok_or_else(|| Error::Database(sea_orm::DbErr::RecordNotFound("a plan".into())))?;
    Ok(plan.try_get("", "QUERY PLAN")?)
}
