//! One page of a listing over a set of endpoints on PostgreSQL (a tenant's, a partner key's
//! list), read in work that grows with the page, not with the set's history nor, beyond
//! one index descent each, with how many endpoints the set holds.
//!
//! Two reads. First each endpoint's newest delivery the listing takes (its head), and of
//! those the page's worth of newest: only their endpoints can hold a row of the page (an
//! endpoint whose newest row is older than a page's worth of other endpoints' newest rows
//! has none in it). When a full page of heads is found, the oldest of them is a threshold:
//! a page of rows lies at or above it, so the page does. Then each of those endpoints is
//! read from its own index, down to the threshold, and the reads merged. The first read is
//! one statement whatever the set's size (a lateral descent per endpoint); the second has
//! one branch per endpoint read, at most a page's worth, each planned for its endpoint (a
//! quiet one read from its own index, never found by walking everyone's newest rows).
//! Both must see one snapshot ([`crate::db::Db::begin_listing`]): a head that stopped
//! matching before the second read would leave it short of a page, ending the listing.
//! Neither is kept prepared on its connection: the second's text changes with how many
//! endpoints it reads, and the first's with a partner key's list.

use chrono::{DateTime, Utc};
use entity::{endpoint, webhook_delivery};
use sea_orm::sea_query::{
    Alias, Asterisk, Condition, Expr, ExprTrait as _, JoinType, Order, Query, SelectStatement,
    SimpleExpr, UnionType,
};
use sea_orm::{
    ColumnTrait as _, ConnectionTrait, DbBackend, QueryFilter, QuerySelect, QueryTrait as _,
    Select, Statement,
};
use uuid::Uuid;

use crate::error::Result;

/// One endpoint's newest listed delivery, joined to it in the first read.
const HEAD: &str = "head";
/// The endpoint, the head's id and its creation time, as the first read names them.
const ENDPOINT_ID: &str = "endpoint_id";
const HEAD_ID: &str = "head_id";
const HEAD_AT: &str = "head_at";
/// The first endpoint's page, in the second read.
const FIRST: &str = "first_page";
/// The endpoints' pages together, in the second read.
const PAGE: &str = "page";

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
        let mut head = self.listing.clone().select_only();
        if self.by_time {
            head = head.column(webhook_delivery::Column::CreatedAt);
        }
        let head = head
            .column(webhook_delivery::Column::Id)
            .filter(
                Expr::col((
                    webhook_delivery::Entity,
                    webhook_delivery::Column::EndpointId,
                ))
                .equals((endpoint::Entity, endpoint::Column::Id)),
            )
            .limit(1)
            .into_query();
        let head_table = Alias::new(HEAD);
        let mut heads = Query::select();
        heads
            .expr_as(
                Expr::col((endpoint::Entity, endpoint::Column::Id)),
                Alias::new(ENDPOINT_ID),
            )
            .expr_as(
                Expr::col((head_table.clone(), webhook_delivery::Column::Id)),
                Alias::new(HEAD_ID),
            );
        if self.by_time {
            heads.expr_as(
                Expr::col((head_table.clone(), webhook_delivery::Column::CreatedAt)),
                Alias::new(HEAD_AT),
            );
        }
        heads
            .from(endpoint::Entity)
            .join_lateral(
                JoinType::InnerJoin,
                head,
                head_table.clone(),
                Condition::all(),
            )
            .cond_where(self.set.clone());
        if self.by_time {
            heads.order_by(
                (head_table.clone(), webhook_delivery::Column::CreatedAt),
                Order::Desc,
            );
        }
        heads
            .order_by((head_table, webhook_delivery::Column::Id), Order::Desc)
            .limit(self.limit);
        backend.build(&heads)
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
        let endpoints: Vec<Uuid> = heads.iter().map(|head| head.endpoint_id).collect();
        backend.build(&pages_merged(listing, &endpoints, self.by_time, self.limit))
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

/// `listing` (every filter but the endpoints) as one page for each of `endpoints`, each
/// read from that endpoint's index in the listing's order, merged into the page. With no
/// endpoint, a statement that finds nothing.
fn pages_merged(
    listing: Select<webhook_delivery::Entity>,
    endpoints: &[Uuid],
    by_time: bool,
    limit: u64,
) -> SelectStatement {
    let page_of = |endpoint: Uuid| {
        listing
            .clone()
            .filter(webhook_delivery::Column::EndpointId.eq(endpoint))
            .limit(limit)
            .into_query()
    };
    let mut pages = endpoints.iter().map(|endpoint| page_of(*endpoint));
    let Some(first) = pages.next() else {
        return listing
            .filter(Expr::cust("false"))
            .limit(limit)
            .into_query();
    };
    // The first page as a subquery, so that its own order and limit stay its own; the
    // others are parenthesised by the union itself.
    let mut union = Query::select();
    union
        .column(Asterisk)
        .from_subquery(first, Alias::new(FIRST))
        .unions(pages.map(|page| (UnionType::All, page)));
    let page = Alias::new(PAGE);
    let mut merged = Query::select();
    merged
        .column((page.clone(), Asterisk))
        .from_subquery(union, page.clone());
    if by_time {
        merged.order_by(
            (page.clone(), webhook_delivery::Column::CreatedAt),
            Order::Desc,
        );
    }
    merged
        .order_by((page, webhook_delivery::Column::Id), Order::Desc)
        .limit(limit);
    merged
}
