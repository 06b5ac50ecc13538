//! One page of a `deliveries` listing as a statement: every filter, in the listing's order,
//! read from an index in that order. A set of endpoints (a tenant's, a partner key's list)
//! is read endpoint by endpoint on PostgreSQL ([`super::set_page`]): a quiet tenant's page
//! never walks everyone's history looking for its rows, and a tenant of thousands of
//! endpoints is two statements, each planned once.

use entity::webhook_delivery::DeliveryState;
use entity::{endpoint, submission, webhook_delivery};
use sea_orm::sea_query::{Expr, ExprTrait as _, SimpleExpr};
use sea_orm::{
    ColumnTrait, Condition, DbBackend, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait, Statement,
};

use super::set_page::SetRead;
use super::{state_filter, Deliveries, DeliveryFilter};
use crate::auth::Identity;
use crate::error::{Error, Result};
use crate::service::access::{self, Access};
use crate::service::pagination::PageRequest;
use crate::service::time_range;

/// One page of a listing, as it is to be read.
pub(super) struct Listing {
    /// How the page is read.
    pub read: Read,
    /// Whether an index serves the page in the listing's order, so that the planner is
    /// to read it so and never sort (see [`crate::db::Db::begin_listing`]). Not for an
    /// event's deliveries (a few, found by the event and sorted), nor for deliveries
    /// pending or processing (the backlog, read from its own small index and sorted,
    /// where the listing's order would walk all of history looking for them).
    pub in_order: bool,
}

/// How a page is read: in one statement, or, over a set of endpoints on PostgreSQL, in
/// two ([`SetRead`]).
pub(super) enum Read {
    /// The page's statement.
    Statement(Statement),
    /// The page of a set, in two reads.
    Set(Box<SetRead>),
}

impl Read {
    /// Whether the page is read in more than one statement, each made from what the one
    /// before found: then they must see one snapshot (a row that stopped matching between
    /// them would cut the page short, and end the listing early), and, their texts varying
    /// with what was found, are not kept prepared.
    pub fn in_steps(&self) -> bool {
        matches!(self, Read::Set(_))
    }
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
                // Keyset on (creation time, id), from where the cursor stands: the time it
                // carries, or (a cursor from before they carried one) the time of the row
                // it names, a row outside the caller's scope answered as a missing one.
                let at = match page.after_at {
                    Some(at) => at,
                    None => {
                        let gone =
                            || Error::bad_input("after names a delivery that no longer exists");
                        let from = self.load(after).await?.ok_or_else(gone)?;
                        if !self.access.allows(caller, from.endpoint_id).await? {
                            return Err(gone());
                        }
                        from.created_at
                    }
                };
                // As one row comparison, which an index on (creation time, id) takes as
                // where to start reading: written as `created_at < at OR (= at AND id <
                // after)`, it is a filter, and every page reads all the rows before it.
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
            read: Read::Statement(statement),
            in_order,
        };
        if set.is_empty() {
            return Ok(listing(query.limit(limit).build(backend)));
        }
        let condition = set.into_iter().fold(Condition::all(), Condition::add);
        let endpoints = endpoint::Entity::find().filter(condition.clone());
        if backend != DbBackend::Postgres || of_an_event {
            // SQLite has no history at this scale, nor an event that many deliveries: the
            // set as a filter.
            let ids = endpoints.select_only().column(endpoint::Column::Id);
            let in_set = webhook_delivery::Column::EndpointId.in_subquery(ids.into_query());
            return Ok(listing(query.filter(in_set).limit(limit).build(backend)));
        }
        Ok(Listing {
            read: Read::Set(Box::new(SetRead::new(query, condition, by_time, limit))),
            in_order,
        })
    }
}
