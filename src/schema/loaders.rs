//! DataLoaders for nested fields: a page of deliveries with their endpoints, submissions
//! and attempts costs one query per kind of thing, not one per row.
//!
//! Each HTTP request gets its own caching set, which list resolvers prime in bulk (so the
//! page's nested fields never depend on batch timing). The schema-wide fallback, used by
//! WebSocket operations, does not cache, so subscribers always read current state; a
//! subscription primes a caching set of its own for the changes it reads together, which
//! their deliveries carry ([`ReadAhead`]).

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
    /// Whether they keep what they read (only then is priming worth its reads).
    cached: bool,
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
            cached,
        }
    }

    /// Reads, in one statement per kind (at once, without the loaders' wait to gather
    /// keys), what the nested fields of `rows` will ask for, into these loaders' caches, so
    /// those fields read no more. `selected` says which fields the query uses. Loaders
    /// that keep nothing are left alone: what they read would be read again.
    pub async fn prime_deliveries(
        &self,
        rows: &[webhook_delivery::Model],
        selected: &Selected,
    ) -> Result<(), Error> {
        if !self.cached {
            return Ok(());
        }
        let keys = |key: fn(&webhook_delivery::Model) -> Uuid| {
            let mut keys: Vec<Uuid> = rows.iter().map(key).collect();
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let endpoints = keys(|row| row.endpoint_id);
        let endpoints = async {
            if selected.endpoints {
                let found = self.endpoints.loader().read(&endpoints).await?;
                self.endpoints.feed_many(found).await;
            }
            if selected.counts {
                let found = self.counts.loader().read(&endpoints).await?;
                self.counts.feed_many(found).await;
            }
            Ok::<_, Error>(())
        };
        let submissions = async {
            if selected.submissions {
                let found = self
                    .submissions
                    .loader()
                    .read(&keys(|row| row.submission_id))
                    .await?;
                let mut events: Vec<Uuid> = found.values().filter_map(|s| s.event_id).collect();
                self.submissions.feed_many(found).await;
                self.deliveries_by_submission
                    .feed_many(rows.iter().map(|row| (row.submission_id, row.clone())))
                    .await;
                if selected.events && !events.is_empty() {
                    events.sort_unstable();
                    events.dedup();
                    let found = self.events.loader().read(&events).await?;
                    self.events.feed_many(found).await;
                }
            }
            Ok(())
        };
        let attempts = async {
            if selected.attempts {
                let found = self.attempts.loader().read(&keys(|row| row.id)).await?;
                self.attempts.feed_many(found).await;
            }
            Ok(())
        };
        tokio::try_join!(endpoints, submissions, attempts)?;
        Ok(())
    }
}

/// Which nested fields of deliveries (a list's nodes, a subscription's changes) a query
/// selects.
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

impl EndpointLoader {
    /// The endpoints of `keys` that exist.
    pub async fn read(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, endpoint::Model>, Error> {
        let rows = self.0.endpoints.load_many(keys).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

impl SubmissionLoader {
    /// The submissions of `keys` that exist.
    pub async fn read(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, submission::Model>, Error> {
        let rows = self.0.submissions.load_many(keys).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

impl DeliveryBySubmissionLoader {
    /// The delivery of each submission of `keys`, by submission.
    pub async fn read(
        &self,
        keys: &[Uuid],
    ) -> Result<HashMap<Uuid, webhook_delivery::Model>, Error> {
        let rows = self.0.deliveries.load_for_submissions(keys).await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.submission_id, row))
            .collect())
    }
}

impl AttemptsLoader {
    /// The attempts of each delivery of `keys` (none for one without any), by delivery.
    pub async fn read(
        &self,
        keys: &[Uuid],
    ) -> Result<HashMap<Uuid, Vec<delivery_attempt::Model>>, Error> {
        let mut by_delivery: HashMap<Uuid, Vec<delivery_attempt::Model>> =
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

impl CountsLoader {
    /// The per-state counts of each endpoint of `keys`.
    pub async fn read(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, StateCounts>, Error> {
        self.0.deliveries.counts(keys).await
    }
}

impl HealthLoader {
    /// The last hour's health of each endpoint of `keys`.
    pub async fn read(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, RecentHealth>, Error> {
        self.0.endpoints.recent_health(keys).await
    }
}

impl EventLoader {
    /// The events of `keys` that exist.
    pub async fn read(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, event::Model>, Error> {
        let events = self.0.fanout.load_many(keys).await?;
        Ok(events.into_iter().map(|event| (event.id, event)).collect())
    }
}

/// Each loader reads through its `read`.
macro_rules! loads_through_read {
    ($($loader:ty => $value:ty),* $(,)?) => {$(
        impl Loader<Uuid> for $loader {
            type Value = $value;
            type Error = ApiError;

            async fn load(
                &self,
                keys: &[Uuid],
            ) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
                Ok(self.read(keys).await?)
            }
        }
    )*};
}

loads_through_read! {
    EndpointLoader => endpoint::Model,
    SubmissionLoader => submission::Model,
    DeliveryBySubmissionLoader => webhook_delivery::Model,
    AttemptsLoader => Vec<delivery_attempt::Model>,
    CountsLoader => StateCounts,
    HealthLoader => RecentHealth,
    EventLoader => event::Model,
}
