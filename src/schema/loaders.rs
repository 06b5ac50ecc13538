//! DataLoaders for nested fields: a page of deliveries with their endpoints, submissions
//! and attempts costs one query per kind of thing, not one per row.
//!
//! Each HTTP request gets its own caching set, which list resolvers prime in bulk (so the
//! page's nested fields never depend on batch timing). The schema-wide fallback, used by
//! WebSocket operations, does not cache, so subscribers always read current state.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, HashMapCache, Loader};
use async_graphql::Context;
use entity::{delivery_attempt, endpoint, event, submission, webhook_delivery};
use uuid::Uuid;

use super::error::ApiError;
use crate::error::Error;
use crate::service::deliveries::StateCounts;
use crate::service::recent_health::RecentHealth;
use crate::state::AppState;

/// How long a loader waits to gather keys from sibling fields before querying.
const BATCH_WINDOW: Duration = Duration::from_millis(1);

type Cached<T> = DataLoader<T, HashMapCache>;

/// One request's caching loaders, built the first time a resolver needs them (most
/// mutations never do).
#[derive(Default)]
pub struct RequestLoaders(std::sync::OnceLock<Loaders>);

impl RequestLoaders {
    /// The loaders, built on first use.
    pub fn get(&self, state: &AppState) -> &Loaders {
        self.0.get_or_init(|| Loaders::new(state, true))
    }
}

/// Loaders primed ahead of time for the nested fields of one object (a subscription's
/// changes read ahead, see [`super::subscription`]), or none: the request's own.
#[derive(Clone, Default)]
pub struct ReadAhead(Option<Arc<Loaders>>);

impl ReadAhead {
    /// Nested fields read what `loaders` hold.
    pub fn primed(loaders: Option<Arc<Loaders>>) -> Self {
        ReadAhead(loaders)
    }

    /// The loaders nested fields read: the primed ones, else the request's.
    pub fn loaders<'a>(&'a self, ctx: &Context<'a>) -> Result<&'a Loaders, Error> {
        match &self.0 {
            Some(primed) => Ok(primed),
            None => super::context::loaders(ctx),
        }
    }
}

/// Every loader.
pub struct Loaders {
    /// Endpoints by id.
    pub endpoints: Cached<EndpointLoader>,
    /// Submissions by id.
    pub submissions: Cached<SubmissionLoader>,
    /// Deliveries by submission id.
    pub deliveries_by_submission: Cached<DeliveryBySubmissionLoader>,
    /// Attempts by delivery id.
    pub attempts: Cached<AttemptsLoader>,
    /// Per-state counts by endpoint id.
    pub counts: Cached<CountsLoader>,
    /// Events by id.
    pub events: Cached<EventLoader>,
    /// The last hour's health by endpoint id.
    pub health: Cached<HealthLoader>,
}

impl Loaders {
    /// Loaders over `state`'s services; `cached` only for one request's lifetime.
    pub fn new(state: &AppState, cached: bool) -> Self {
        fn loader<T: Loader<Uuid>>(inner: T, cached: bool) -> Cached<T> {
            let loader = DataLoader::with_cache(inner, tokio::spawn, HashMapCache::default())
                .delay(BATCH_WINDOW);
            loader.enable_all_cache(cached);
            loader
        }
        Loaders {
            endpoints: loader(EndpointLoader(state.clone()), cached),
            submissions: loader(SubmissionLoader(state.clone()), cached),
            deliveries_by_submission: loader(DeliveryBySubmissionLoader(state.clone()), cached),
            attempts: loader(AttemptsLoader(state.clone()), cached),
            counts: loader(CountsLoader(state.clone()), cached),
            events: loader(EventLoader(state.clone()), cached),
            health: loader(HealthLoader(state.clone()), cached),
        }
    }

    /// Loads, in one statement per kind, what a list's nested fields will ask for, so
    /// those fields read this request's cache. `selected` says which fields the query uses.
    pub async fn prime_deliveries(
        &self,
        rows: &[webhook_delivery::Model],
        selected: &Selected,
    ) -> Result<(), ApiError> {
        let endpoints: Vec<Uuid> = rows.iter().map(|row| row.endpoint_id).collect();
        if selected.endpoints {
            self.endpoints.load_many(endpoints.iter().copied()).await?;
        }
        if selected.counts {
            self.counts.load_many(endpoints.iter().copied()).await?;
        }
        if selected.submissions {
            let submissions = self
                .submissions
                .load_many(rows.iter().map(|row| row.submission_id))
                .await?;
            self.deliveries_by_submission
                .feed_many(rows.iter().map(|row| (row.submission_id, row.clone())))
                .await;
            if selected.events {
                let events: Vec<Uuid> = submissions.values().filter_map(|s| s.event_id).collect();
                if !events.is_empty() {
                    self.events.load_many(events).await?;
                }
            }
        }
        if selected.attempts {
            self.attempts
                .load_many(rows.iter().map(|row| row.id))
                .await?;
        }
        Ok(())
    }
}

/// Which nested fields of a list's nodes a query selects.
#[derive(Debug, Default, Clone, Copy)]
pub struct Selected {
    /// `endpoint` (or, for endpoint lists, the nodes themselves).
    pub endpoints: bool,
    /// `endpoint.deliveryCounts` (or `deliveryCounts` of endpoint nodes).
    pub counts: bool,
    /// `submission`.
    pub submissions: bool,
    /// `attempts`.
    pub attempts: bool,
    /// `submission.payload` or `submission.event` (a published submission's event).
    pub events: bool,
}

impl Selected {
    /// What the nodes of a delivery connection select.
    pub fn of_delivery_nodes(ctx: &async_graphql::Context<'_>) -> Self {
        let look = ctx.look_ahead();
        let mut selected = Selected::default();
        for node in [look.field("edges").field("node"), look.field("nodes")] {
            selected.add(Self::under_delivery(&node));
        }
        selected
    }

    /// What `delivery`, a selection of a `Delivery`, selects under it.
    fn under_delivery(delivery: &async_graphql::Lookahead<'_>) -> Self {
        Selected {
            counts: delivery.field("endpoint").field("deliveryCounts").exists(),
            ..Self::of_delivery_fields(delivery)
        }
    }

    /// What `delivery`, a selection of a `Delivery`, selects that a delivery carrying
    /// primed loaders ([`ReadAhead`]) reads through them: its endpoint, submission and
    /// attempts, and its submission's endpoint and event (what lies deeper, such as an
    /// endpoint's counts, reads the request's).
    pub fn of_delivery_fields(delivery: &async_graphql::Lookahead<'_>) -> Self {
        let submission = delivery.field("submission");
        Selected {
            endpoints: delivery.field("endpoint").exists() || submission.field("endpoint").exists(),
            counts: false,
            submissions: submission.exists(),
            attempts: delivery.field("attempts").exists(),
            events: submission.field("payload").exists() || submission.field("event").exists(),
        }
    }

    /// Whether anything is selected.
    pub fn any(&self) -> bool {
        self.endpoints || self.counts || self.submissions || self.attempts || self.events
    }

    fn add(&mut self, other: Selected) {
        self.endpoints |= other.endpoints;
        self.counts |= other.counts;
        self.submissions |= other.submissions;
        self.attempts |= other.attempts;
        self.events |= other.events;
    }

    /// Whether the nodes of an endpoint connection select `deliveryCounts`.
    pub fn counts_of_endpoint_nodes(ctx: &async_graphql::Context<'_>) -> bool {
        let look = ctx.look_ahead();
        look.field("edges")
            .field("node")
            .field("deliveryCounts")
            .exists()
            || look.field("nodes").field("deliveryCounts").exists()
    }
}

/// Loads endpoints.
pub struct EndpointLoader(AppState);
/// Loads submissions.
pub struct SubmissionLoader(AppState);
/// Loads the delivery of each submission.
pub struct DeliveryBySubmissionLoader(AppState);
/// Loads the attempts of each delivery.
pub struct AttemptsLoader(AppState);
/// Loads per-state counts of each endpoint.
pub struct CountsLoader(AppState);
/// Loads events by id.
pub struct EventLoader(AppState);
/// Loads the last hour's health by endpoint id.
pub struct HealthLoader(AppState);

impl Loader<Uuid> for EndpointLoader {
    type Value = endpoint::Model;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let rows = self.0.endpoints.load_many(keys).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

impl Loader<Uuid> for SubmissionLoader {
    type Value = submission::Model;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let rows = self.0.submissions.load_many(keys).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

impl Loader<Uuid> for DeliveryBySubmissionLoader {
    type Value = webhook_delivery::Model;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let rows = self.0.deliveries.load_for_submissions(keys).await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.submission_id, row))
            .collect())
    }
}

impl Loader<Uuid> for AttemptsLoader {
    type Value = Vec<delivery_attempt::Model>;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let mut by_delivery: HashMap<Uuid, Self::Value> =
            keys.iter().map(|key| (*key, Vec::new())).collect();
        for attempt in self.0.deliveries.attempts_of(keys).await? {
            by_delivery
                .entry(attempt.delivery_id)
                .or_default()
                .push(attempt);
        }
        Ok(by_delivery)
    }
}

impl Loader<Uuid> for CountsLoader {
    type Value = StateCounts;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        Ok(self.0.deliveries.counts(keys).await?)
    }
}

impl Loader<Uuid> for HealthLoader {
    type Value = RecentHealth;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        Ok(self.0.endpoints.recent_health(keys).await?)
    }
}

impl Loader<Uuid> for EventLoader {
    type Value = event::Model;
    type Error = ApiError;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let events = self.0.fanout.load_many(keys).await?;
        Ok(events.into_iter().map(|event| (event.id, event)).collect())
    }
}
