//! One page of a `deliveries` listing as a statement: every filter, in the listing's order,
//! read from an index in that order. A set of endpoints (a tenant's, a partner key's list)
//! is read endpoint by endpoint on PostgreSQL, a page from each, and the pages merged: a
//! quiet tenant's page never walks everyone's history looking for its rows.

use entity::webhook_delivery::DeliveryState;
use entity::{endpoint, submission, webhook_delivery};
use sea_orm::sea_query::{
    Alias, Asterisk, Expr, ExprTrait as _, Query, SelectStatement, SimpleExpr, UnionType,
};
use sea_orm::{
    ColumnTrait, Condition, DbBackend, EntityTrait, Order, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait, Statement,
};
use uuid::Uuid;

use super::{state_filter, Deliveries, DeliveryFilter};
use crate::auth::Identity;
use crate::error::{Error, Result};
use crate::service::access::{self, Access};
use crate::service::pagination::PageRequest;
use crate::service::time_range;

/// The first endpoint's page, in a set listing's statement.
const FIRST: &str = "first_page";
/// The endpoints' pages together, in a set listing's statement.
const PAGE: &str = "page";

/// One page of a listing, as it is to be run.
pub(super) struct Listing {
    /// The page's statement.
    pub statement: Statement,
    /// Whether an index serves the page in the listing's order, so that the planner is
    /// to read it so and never sort (see [`crate::db::Db::begin_listing`]). Not for an
    /// event's deliveries (a few, found by the event and sorted), nor for deliveries
    /// pending or processing (the backlog, read from its own small index and sorted,
    /// where the listing's order would walk all of history looking for them).
    pub in_order: bool,
}

impl Deliveries {
    /// One page of a listing, refusing a filter outside the caller's scope.
    pub(super) async fn listing(
        &self,
        caller: &Identity,
        filter: DeliveryFilter,
        page: &PageRequest,
    ) -> Result<Listing> {
        time_range::validate(
            filter.created_after,
            filter.created_before,
            "filter.createdAfter",
            "filter.createdBefore",
        )?;
        let event_type = filter
            .event_type
            .as_deref()
            .map(crate::service::event_types::validate)
            .transpose()?;
        // A listing by time is ordered by creation time (ids follow it closely, not
        // exactly), so that the time index serves both the range and the order.
        let by_time = filter.created_after.is_some() || filter.created_before.is_some();
        let mut query = webhook_delivery::Entity::find();
        if by_time {
            query = query.order_by_desc(webhook_delivery::Column::CreatedAt);
        }
        query = query.order_by_desc(webhook_delivery::Column::Id);
        // The endpoints it reads: one, or a set (the caller's scope, a tenant), or all.
        let mut set: Vec<SimpleExpr> = Vec::new();
        match filter.endpoint_id {
            Some(endpoint) => {
                self.access.require(caller, endpoint).await?;
                query = query.filter(webhook_delivery::Column::EndpointId.eq(endpoint));
            }
            None => set.extend(Access::endpoints_condition(caller)),
        }
        if let Some(tenant) = filter.tenant_id {
            // A tenant the caller may not read is refused like anything outside its scope.
            self.access.require_tenant(caller, tenant)?;
            match filter.endpoint_id {
                Some(_) => {
                    query = query.filter(access::in_tenant(
                        webhook_delivery::Column::EndpointId,
                        tenant,
                    ))
                }
                None => set.push(endpoint::Column::TenantId.eq(tenant)),
            }
        }
        if let Some(state) = filter.state {
            let for_endpoints = filter.endpoint_id.is_some() || !set.is_empty();
            query = query.filter(Expr::cust(state_filter::in_state(state, for_endpoints)));
        }
        if let Some(after) = filter.created_after {
            query = query.filter(webhook_delivery::Column::CreatedAt.gte(after));
        }
        if let Some(before) = filter.created_before {
            query = query.filter(webhook_delivery::Column::CreatedAt.lt(before));
        }
        if let Some(event_type) = event_type {
            query = query.filter(webhook_delivery::Column::EventType.eq(event_type));
        }
        // An event's deliveries are one per endpoint it reached: few, and found by the event.
        let of_an_event = filter.event_id.is_some();
        let in_order = !of_an_event
            && !matches!(
                filter.state,
                Some(DeliveryState::Pending | DeliveryState::Processing)
            );
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
                // As one row comparison, which an index on (creation time, id) takes as
                // where to start reading: written as `created_at < at OR (= at AND id <
                // after)`, it is a filter, and every page reads all the rows before it.
                let at = from.created_at;
                query.filter(
                    Expr::tuple([
                        Expr::col(webhook_delivery::Column::CreatedAt),
                        Expr::col(webhook_delivery::Column::Id),
                    ])
                    .lt(Expr::tuple([Expr::value(at), Expr::value(after)])),
                )
            } else {
                query.filter(webhook_delivery::Column::Id.lt(after))
            };
        }
        let limit = page.fetch_limit();
        let backend = self.db.backend();
        let listing = |statement| Listing {
            statement,
            in_order,
        };
        if set.is_empty() {
            return Ok(listing(query.limit(limit).build(backend)));
        }
        let endpoints = endpoint::Entity::find()
            .select_only()
            .column(endpoint::Column::Id)
            .filter(set.into_iter().fold(Condition::all(), Condition::add));
        if backend != DbBackend::Postgres || of_an_event {
            // SQLite has no history at this scale, nor an event that many deliveries: the
            // set as a filter.
            let in_set = webhook_delivery::Column::EndpointId.in_subquery(endpoints.into_query());
            return Ok(listing(query.filter(in_set).limit(limit).build(backend)));
        }
        // Each endpoint's page is planned for that endpoint (a quiet one read from its own
        // index, not found by walking the newest rows of everyone), so the ids go in the
        // statement; a lateral join would plan every endpoint as an average one.
        let ids: Vec<Uuid> = endpoints
            .order_by_asc(endpoint::Column::Id)
            .into_tuple()
            .all(self.db.conn())
            .await?;
        Ok(listing(
            backend.build(&pages_merged(query, &ids, by_time, limit)),
        ))
    }
}

/// `listing` (every filter but the endpoints) as one page for each of `endpoints`, each
/// read from that endpoint's index in the listing's order, merged into the page. With no
/// endpoint, a statement that finds nothing.
fn pages_merged(
    listing: sea_orm::Select<webhook_delivery::Entity>,
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
