//! Deliveries: reading them and their attempts, listing for dashboards, and counts; replay
//! and resend live in [`replay`].

mod change_reads;
mod replay;
pub mod tally;

pub use self::change_reads::ChangeReads;
pub use self::replay::{ReplayFilter, REPLAY_BATCH};
pub use self::tally::StateCounts;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use entity::webhook_delivery::{self, DeliveryState};
use entity::{delivery_attempt, submission};
use sea_orm::sea_query::Expr;
use sea_orm::ActiveEnum as _;
use sea_orm::Condition;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
};
use uuid::Uuid;

use crate::auth::Identity;
use crate::bus::Wakeup;
use crate::bus::{ChangeBus, StateChange};
use crate::db::Db;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::service::access::{self, Access};
use crate::service::pagination::{Page, PageRequest};
use crate::service::time_range;

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
        let query = self.listing(caller, filter, &page).await?;
        let txn = self.db.begin_listing().await?;
        let rows = query.all(&txn).await?;
        txn.commit().await?;
        Ok(Page::from_overfetch(rows, &page))
    }

    /// The plan and the work of one page of [`Deliveries::list`], run as it runs
    /// (`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`, PostgreSQL only): for checking that a
    /// listing reads a page, not the history.
    pub async fn explain_listing(
        &self,
        caller: &Identity,
        filter: DeliveryFilter,
        page: &PageRequest,
    ) -> Result<serde_json::Value> {
        let statement = self
            .listing(caller, filter, page)
            .await?
            .build(self.db.backend());
        let explained = sea_orm::Statement::from_sql_and_values(
            statement.db_backend,
            format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", statement.sql),
            statement.values.map(|values| values.0).unwrap_or_default(),
        );
        let txn = self.db.begin_listing().await?;
        let plan = txn.query_one_raw(explained).await?;
        txn.commit().await?;
        let plan =
            plan.ok_or_else(|| Error::Database(sea_orm::DbErr::RecordNotFound("a plan".into())))?;
        Ok(plan.try_get("", "QUERY PLAN")?)
    }

    /// The query of one page of a listing, refusing a filter outside the caller's scope.
    async fn listing(
        &self,
        caller: &Identity,
        filter: DeliveryFilter,
        page: &PageRequest,
    ) -> Result<sea_orm::Select<webhook_delivery::Entity>> {
        time_range::validate(
            filter.created_after,
            filter.created_before,
            "filter.createdAfter",
            "filter.createdBefore",
        )?;
        if let Some(event_type) = &filter.event_type {
            crate::service::event_types::validate(event_type)?;
        }
        // A listing by time is ordered by creation time (ids follow it closely, not
        // exactly), so that the time index serves both the range and the order.
        let by_time = filter.created_after.is_some() || filter.created_before.is_some();
        let mut query = webhook_delivery::Entity::find();
        if by_time {
            query = query.order_by_desc(webhook_delivery::Column::CreatedAt);
        }
        query = query.order_by_desc(webhook_delivery::Column::Id);
        match filter.endpoint_id {
            Some(endpoint) => {
                self.access.require(caller, endpoint).await?;
                query = query.filter(webhook_delivery::Column::EndpointId.eq(endpoint));
            }
            None => {
                if let Some(in_scope) =
                    Access::endpoint_condition(caller, webhook_delivery::Column::EndpointId)
                {
                    query = query.filter(in_scope);
                }
            }
        }
        if let Some(state) = filter.state {
            // Written into the statement rather than bound, so that even a generic plan
            // can read the partial index of that state; the value is one of four words.
            query = query.filter(Expr::cust(format!("state = '{}'", state.to_value())));
        }
        if let Some(after) = filter.created_after {
            query = query.filter(webhook_delivery::Column::CreatedAt.gte(after));
        }
        if let Some(before) = filter.created_before {
            query = query.filter(webhook_delivery::Column::CreatedAt.lt(before));
        }
        if let Some(event_type) = filter.event_type {
            query = query.filter(webhook_delivery::Column::EventType.eq(event_type));
        }
        if let Some(tenant) = filter.tenant_id {
            // A tenant the caller may not read is refused like anything outside its scope.
            self.access.require_tenant(caller, tenant)?;
            query = query.filter(access::in_tenant(
                webhook_delivery::Column::EndpointId,
                tenant,
            ));
        }
        if let Some(event_id) = filter.event_id {
            let submissions = submission::Entity::find()
                .select_only()
                .column(submission::Column::Id)
                .filter(submission::Column::EventId.eq(event_id));
            query = query.filter(
                webhook_delivery::Column::SubmissionId.in_subquery(submissions.into_query()),
            );
        }
        if let Some(after) = page.after {
            query = if by_time {
                // Keyset on (creation time, id), from the row the cursor names; a row
                // outside the caller's scope is answered as a missing one.
                let gone = || Error::bad_input("after names a delivery that no longer exists");
                let from = self.load(after).await?.ok_or_else(gone)?;
                if !self.access.allows(caller, from.endpoint_id).await? {
                    return Err(gone());
                }
                let at = from.created_at;
                query.filter(
                    Condition::any()
                        .add(webhook_delivery::Column::CreatedAt.lt(at))
                        .add(
                            Condition::all()
                                .add(webhook_delivery::Column::CreatedAt.eq(at))
                                .add(webhook_delivery::Column::Id.lt(after)),
                        ),
                )
            } else {
                query.filter(webhook_delivery::Column::Id.lt(after))
            };
        }
        Ok(query.limit(page.fetch_limit()))
    }

    /// How many deliveries are due now (waiting to be claimed), for the queue-depth gauge.
    pub async fn due_count(&self) -> Result<i64> {
        const DUE_COUNT: &str = "SELECT COUNT(*) AS due FROM webhook_deliveries \
             WHERE state IN ('pending', 'processing') AND next_attempt_at <= {now}";
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
