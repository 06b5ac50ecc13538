//! The GraphQL schema: roots merged from one module per domain; resolvers call the service layer only.

mod delivery;
mod endpoint;
mod error;
pub mod json;
pub mod loaders;
mod scalars;
mod submission;
mod subscription;

use async_graphql::{MergedObject, MergedSubscription, Schema};

use crate::state::AppState;

pub use endpoint::Endpoint;
pub use error::{ApiError, ApiResult};
pub use loaders::Loaders;

/// Deepest selection a query may make.
pub const MAX_QUERY_DEPTH: usize = 12;
/// Largest total complexity (roughly, fields selected) of one query.
pub const MAX_QUERY_COMPLEXITY: usize = 2_000;

/// Every query, merged from the domain modules.
#[derive(MergedObject, Default)]
#[graphql(name = "Query")]
pub struct QueryRoot(
    endpoint::EndpointQuery,
    submission::SubmissionQuery,
    delivery::DeliveryQuery,
);

/// Every mutation, merged from the domain modules.
#[derive(MergedObject, Default)]
#[graphql(name = "Mutation")]
pub struct MutationRoot(
    endpoint::EndpointMutation,
    submission::SubmissionMutation,
    delivery::DeliveryMutation,
);

/// Every subscription, merged from the domain modules.
#[derive(MergedSubscription, Default)]
#[graphql(name = "Subscription")]
pub struct SubscriptionRoot(subscription::DeliverySubscription);

/// Courier's executable schema.
pub type CourierSchema = Schema<QueryRoot, MutationRoot, SubscriptionRoot>;

/// Builds the schema with its limits; `state` is given to every resolver.
pub fn build(state: Option<AppState>) -> CourierSchema {
    let mut builder = Schema::build(
        QueryRoot::default(),
        MutationRoot::default(),
        SubscriptionRoot::default(),
    )
    .limit_depth(MAX_QUERY_DEPTH)
    .limit_complexity(MAX_QUERY_COMPLEXITY)
    .extension(crate::metrics::GraphqlMetrics);
    if let Some(state) = state {
        builder = builder.data(Loaders::new(&state, false)).data(state);
    }
    builder.finish()
}

/// The SDL `courier schema` prints and `schema.graphql` holds.
pub fn sdl() -> String {
    build(None).sdl()
}
