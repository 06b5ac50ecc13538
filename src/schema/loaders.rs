//! DataLoaders for nested fields: a page of deliveries with their endpoints, submissions
//! and attempts costs one query per kind of thing, not one per row. No caching: every
//! load reads the database, so subscribers see current state.

use std::collections::HashMap;
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, Loader};
use entity::{delivery_attempt, endpoint, submission, webhook_delivery};
use uuid::Uuid;

use super::error::ApiError;
use crate::service::deliveries::StateCounts;
use crate::state::AppState;

/// How long a loader waits to gather keys from sibling fields before querying.
const BATCH_WINDOW: Duration = Duration::from_millis(1);

/// Every loader, given to the schema as data.
pub struct Loaders {
    /// Endpoints by id.
    pub endpoints: DataLoader<EndpointLoader>,
    /// Submissions by id.
    pub submissions: DataLoader<SubmissionLoader>,
    /// Deliveries by submission id.
    pub deliveries_by_submission: DataLoader<DeliveryBySubmissionLoader>,
    /// Attempts by delivery id.
    pub attempts: DataLoader<AttemptsLoader>,
    /// Per-state counts by endpoint id.
    pub counts: DataLoader<CountsLoader>,
}

impl Loaders {
    /// Loaders over `state`'s services.
    pub fn new(state: &AppState) -> Self {
        fn loader<T: Loader<Uuid>>(inner: T) -> DataLoader<T> {
            DataLoader::new(inner, tokio::spawn).delay(BATCH_WINDOW)
        }
        Loaders {
            endpoints: loader(EndpointLoader(state.clone())),
            submissions: loader(SubmissionLoader(state.clone())),
            deliveries_by_submission: loader(DeliveryBySubmissionLoader(state.clone())),
            attempts: loader(AttemptsLoader(state.clone())),
            counts: loader(CountsLoader(state.clone())),
        }
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
        let rows = self.0.deliveries.load_submissions(keys).await?;
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
