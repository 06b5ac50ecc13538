//! One page of a listing over a set of endpoints on PostgreSQL (a tenant's, a partner key's
//! list), read in work that does not grow with the set's history: one index descent for
//! each endpoint of the set, and up to a page's worth of index entries from each endpoint
//! that can hold a row of the page (at most a page of them).
//!
//! Two reads, each one statement planned once whatever the set's size: a lateral join
//! from the endpoints, reading each one's rows from its own index (a quiet endpoint's
//! from its own, never found by walking everyone's newest rows). First each endpoint's
//! newest delivery the listing takes (its head), and of those the page's worth of newest:
//! only their endpoints can hold a row of the page (an endpoint whose newest row is older
//! than a page's worth of other endpoints' newest rows has none in it). When a full page
//! of heads is found, the oldest of them is a threshold: a page of rows lies at or above
//! it, so the page does. Then those endpoints' newest rows down to the threshold, a page's
//! worth at most of each, read from the index alone (ids and times), of which the page's
//! worth of newest are the page, read whole. (A statement of one branch per endpoint,
//! merged, read fewer index entries but took 0.2 ms to plan per branch: 10 ms for a page
//! over 50 endpoints, five times the time of reading it this way.)
//! Both must see one snapshot ([`crate::db::Db::begin_listing`]): a head that stopped
//! matching before the second read would leave it short of a page, ending the listing.
//! Neither is kept prepared on its connection: their texts change with the endpoints
//! they name (a partner key's list, the heads found).

use chrono::{DateTime, Utc};
use entity::{endpoint, webhook_delivery};
use sea_orm::sea_query::{
    Alias, Asterisk, Condition, Expr, ExprTrait as _, JoinType, Order, Query, SelectStatement,
    SimpleExpr,
};
use sea_orm::{
    ColumnTrait as _, ConnectionTrait, DbBackend, QueryFilter, QuerySelect, QueryTrait as _,
    Select, Statement,
};
use uuid::Uuid;

use crate::error::Result;

/// One endpoint's newest listed delivery, as the reads name it.
const HEAD: &str = "head";
/// The endpoint, the row's id and its creation time, as the reads name them.
const ENDPOINT_ID: &str = "endpoint_id";
const HEAD_ID: &str = "head_id";
const HEAD_AT: &str = "head_at";
/// The newest rows of the endpoints read, in the second read, and each read whole.
const NEWEST: &str = "newest";
const ROW: &str = "whole";

/// A page of a listing over a set of endpoints, to be read in two statements.
pub(super) struct SetRead {
    /// Every filter of the listing but the endpoints, in the listing's order.
    listing: Select<webhook_delivery::Entity>,
    /// The endpoints, as a condition on the `endpoints` table.
    set: Condition,
    /// Whether the listing is ordered by creation time, then id (else by id).
    by_time: bool,
    /// Rows to read (the page and one more).
    limit: u64,
}

/// One endpoint's newest listed delivery.
pub(super) struct Head {
    endpoint_id: Uuid,
    id: Uuid,
    /// Its creation time, in a listing by time.
    at: Option<DateTime<Utc>>,
}

impl SetRead {
    /// The page of `listing` (every filter but the endpoints, ordered by creation time then
    /// id with `by_time`, else by id) over the endpoints `set` selects.
    pub(super) fn new(
        listing: Select<webhook_delivery::Entity>,
        set: Condition,
        by_time: bool,
        limit: u64,
    ) -> Self {
        Self {
            listing,
            set,
            by_time,
            limit,
        }
    }

    /// The first read: the `limit` newest heads, newest first.
    pub(super) fn heads_statement(&self, backend: DbBackend) -> Statement {
        backend.build(&self.newest_of_each(self.listing.clone(), self.set.clone(), 1))
    }

    /// Runs the first read on `conn`.
    pub(super) async fn heads(&self, conn: &impl ConnectionTrait) -> Result<Vec<Head>> {
        let rows = conn
            .query_all_raw(self.heads_statement(conn.get_database_backend()))
            .await?;
        rows.iter()
            .map(|row| {
                Ok(Head {
                    endpoint_id: row.try_get("", ENDPOINT_ID)?,
                    id: row.try_get("", HEAD_ID)?,
                    at: if self.by_time {
                        Some(row.try_get("", HEAD_AT)?)
                    } else {
                        None
                    },
                })
            })
            .collect()
    }

    /// The second read: the page, from the endpoints of `heads` (the first read's rows),
    /// each read down to the oldest head when there is a full page of them.
    pub(super) fn page_statement(&self, heads: &[Head], backend: DbBackend) -> Statement {
        let mut listing = self.listing.clone();
        let full = u64::try_from(heads.len()).is_ok_and(|found| found >= self.limit);
        if let (true, Some(oldest)) = (full, heads.last()) {
            listing = listing.filter(self.at_or_above(oldest));
        }
        if heads.is_empty() {
            return backend.build(
                &listing
                    .filter(Expr::cust("false"))
                    .limit(self.limit)
                    .into_query(),
            );
        }
        let endpoints = Condition::all()
            .add(endpoint::Column::Id.is_in(heads.iter().map(|head| head.endpoint_id)));
        // The page's rows read whole, one by one in the order of their ids' read (a join
        // the planner could run as a walk of the table's own order, to spare a sort of
        // the page under the in-order settings, is a lateral lookup by id instead).
        let (newest, row) = (Alias::new(NEWEST), Alias::new(ROW));
        let mut whole = Query::select();
        whole
            .column(Asterisk)
            .from(webhook_delivery::Entity)
            .and_where(
                Expr::col((webhook_delivery::Entity, webhook_delivery::Column::Id))
                    .equals((newest.clone(), Alias::new(HEAD_ID))),
            );
        let mut page = Query::select();
        page.column((row.clone(), Asterisk))
            .from_subquery(
                self.newest_of_each(listing, endpoints, self.limit),
                newest.clone(),
            )
            .join_lateral(JoinType::InnerJoin, whole, row, Condition::all());
        if self.by_time {
            page.order_by((newest.clone(), Alias::new(HEAD_AT)), Order::Desc);
        }
        page.order_by((newest, Alias::new(HEAD_ID)), Order::Desc);
        backend.build(&page)
    }

    /// The `self.limit` newest of the rows of `listing` read for each endpoint that
    /// `endpoints` selects, at most `each` of each endpoint's, newest first: each endpoint's
    /// id, and its rows' ids and (by time) creation times, read from its own index.
    fn newest_of_each(
        &self,
        listing: Select<webhook_delivery::Entity>,
        endpoints: Condition,
        each: u64,
    ) -> SelectStatement {
        let mut rows = listing.select_only();
        if self.by_time {
            rows = rows.column(webhook_delivery::Column::CreatedAt);
        }
        let rows = rows
            .column(webhook_delivery::Column::Id)
            .filter(
                Expr::col((
                    webhook_delivery::Entity,
                    webhook_delivery::Column::EndpointId,
                ))
                .equals((endpoint::Entity, endpoint::Column::Id)),
            )
            .limit(each)
            .into_query();
        let head = Alias::new(HEAD);
        let mut newest = Query::select();
        newest
            .expr_as(
                Expr::col((endpoint::Entity, endpoint::Column::Id)),
                Alias::new(ENDPOINT_ID),
            )
            .expr_as(
                Expr::col((head.clone(), webhook_delivery::Column::Id)),
                Alias::new(HEAD_ID),
            );
        if self.by_time {
            newest.expr_as(
                Expr::col((head.clone(), webhook_delivery::Column::CreatedAt)),
                Alias::new(HEAD_AT),
            );
        }
        newest
            .from(endpoint::Entity)
            .join_lateral(JoinType::InnerJoin, rows, head.clone(), Condition::all())
            .cond_where(endpoints);
        if self.by_time {
            newest.order_by(
                (head.clone(), webhook_delivery::Column::CreatedAt),
                Order::Desc,
            );
        }
        newest
            .order_by((head, webhook_delivery::Column::Id), Order::Desc)
            .limit(self.limit);
        newest
    }

    /// "At or above `head`" in the listing's order.
    fn at_or_above(&self, head: &Head) -> SimpleExpr {
        match head.at {
            Some(at) if self.by_time => Expr::tuple([
                Expr::col(webhook_delivery::Column::CreatedAt),
                Expr::col(webhook_delivery::Column::Id),
            ])
            .gte(Expr::tuple([Expr::value(at), Expr::value(head.id)])),
            _ => webhook_delivery::Column::Id.gte(head.id),
        }
    }
}
