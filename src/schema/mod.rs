//! The GraphQL schema: roots merged from one module per domain; resolvers call the service layer only.
//!
//! Resolvers await their service calls boxed (`Box::pin`): async-graphql moves each field's
//! future as it resolves it, a merged root nests one future per part, and a future is as large
//! as the largest call it awaits inline (a call that reaches the database holds kilobytes of
//! connection-pool state), so one such call made every field of its root that costly to move.

mod api_key;
mod argument_values;
mod coercion;
mod conditions;
mod context;
mod corrections;
mod delivery;
pub mod documents;
mod empty_selections;
mod endpoint;
mod error;
mod event;
mod expansion;
mod field_order;
pub mod in_time;
mod input_literals;
mod introspection;
pub mod json;
pub mod limits;
pub mod loaders;
mod nulls;
pub mod observed;
mod single_root;
mod submission;
mod subscription;
mod tenant;
mod typename;
mod variables;
mod verdicts;

use std::sync::Arc;

use async_graphql::{MergedObject, MergedSubscription, Schema};

use crate::state::AppState;

pub use endpoint::Endpoint;
pub use error::{ApiError, ApiResult};
pub use loaders::Loaders;

pub use limits::{MAX_QUERY_COMPLEXITY, MAX_QUERY_DEPTH};
pub use subscription::{OperationPlace, RunningOperations, MAX_SUBSCRIPTIONS_PER_CONNECTION};

/// Most directives on one field.
pub const MAX_DIRECTIVES_PER_FIELD: usize = 8;

/// Every query, merged from the domain modules.
#[derive(MergedObject, Default)]
#[graphql(name = "Query")]
pub struct QueryRoot(
    endpoint::EndpointQuery,
    submission::SubmissionQuery,
    delivery::DeliveryQuery,
    event::EventQuery,
    api_key::ApiKeyQuery,
    tenant::TenantQuery,
);

/// Every mutation, merged from the domain modules.
#[derive(MergedObject, Default)]
#[graphql(name = "Mutation")]
pub struct MutationRoot(
    endpoint::EndpointMutation,
    submission::SubmissionMutation,
    delivery::DeliveryMutation,
    event::EventMutation,
    api_key::ApiKeyMutation,
    tenant::TenantMutation,
);

/// Every subscription, merged from the domain modules.
#[derive(MergedSubscription, Default)]
#[graphql(name = "Subscription")]
pub struct SubscriptionRoot(subscription::DeliverySubscription);

/// Courier's executable schema.
pub type CourierSchema = Schema<QueryRoot, MutationRoot, SubscriptionRoot>;

/// Builds the schema with its limits; `state` is given to every resolver.
pub fn build(state: Option<AppState>) -> CourierSchema {
    build_with(state, Arc::default())
}

/// [`build`], keeping parsed documents in `documents`.
fn build_with(state: Option<AppState>, documents: Arc<documents::DocumentCache>) -> CourierSchema {
    let mut builder = Schema::build(
        QueryRoot::default(),
        MutationRoot::default(),
        SubscriptionRoot::default(),
    )
    .limit_directives(MAX_DIRECTIVES_PER_FIELD)
    .extension(limits::DocumentLimits::new(documents))
    .extension(observed::ObservedOperations(
        state.as_ref().map(|state| state.metrics.clone()),
    ))
    // Outside the nulls, so the fields they put back take their places too.
    .extension(field_order::FieldOrder)
    // Inside the order, whose answers then hold no placeholder.
    .extension(corrections::Corrections)
    .extension(nulls::FieldErrorNulls);
    if let Some(state) = state {
        builder = builder.data(Loaders::new(&state, false)).data(state);
    }
    builder.finish()
}

/// Gives every error of `response` a code: errors Courier raises carry theirs, so one
/// without a code was raised by the GraphQL layer itself over the request (a syntax,
/// validation or argument error), which is the client's input at fault. An error the
/// GraphQL layer reports twice word for word at the same place (`subscription {
/// __typename }` was refused twice over) is kept once.
pub fn ensure_codes(response: &mut async_graphql::Response) {
    if response.errors.len() > 1 {
        let mut seen = std::collections::HashSet::new();
        response.errors.retain(|error| {
            let place = serde_json::to_string(&(&error.locations, &error.path)).unwrap_or_default();
            seen.insert((error.message.clone(), place))
        });
    }
    for error in &mut response.errors {
        let extensions = error
            .extensions
            .get_or_insert_with(async_graphql::ErrorExtensionValues::default);
        if extensions.get("code").is_none() {
            extensions.set("code", "BAD_USER_INPUT");
        }
    }
}

/// The schema as the WebSocket transport runs it: queries and mutations within the
/// database's deadline, and every response's errors carrying a code, as over HTTP.
#[derive(Clone)]
pub struct CodedExecutor {
    /// The schema.
    pub schema: CourierSchema,
    /// The database whose deadline operations run within.
    pub db: crate::db::Db,
}

impl async_graphql::Executor for CodedExecutor {
    fn execute(
        &self,
        request: async_graphql::Request,
    ) -> impl std::future::Future<Output = async_graphql::Response> + Send {
        let (schema, db) = (self.schema.clone(), self.db.clone());
        async move {
            let mut response = in_time::execute_in_time(&schema, &db, request).await;
            ensure_codes(&mut response);
            response
        }
    }

    /// Every operation of a WebSocket comes here, queries and mutations too: those run
    /// within the database's deadline.
    fn execute_stream(
        &self,
        mut request: async_graphql::Request,
        session_data: Option<std::sync::Arc<async_graphql::Data>>,
    ) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = async_graphql::Response> + Send + 'static>>
    {
        use futures_util::StreamExt as _;
        // The place the connection's gate took for this operation, held by its stream.
        let place = session_data
            .as_ref()
            .and_then(|data| data.get(&std::any::TypeId::of::<RunningOperations>()))
            .and_then(|running| running.downcast_ref::<RunningOperations>())
            .map(RunningOperations::held_until_dropped);
        if !in_time::subscribes(&mut request) {
            let (schema, db) = (self.schema.clone(), self.db.clone());
            return Box::pin(futures_util::stream::once(async move {
                let _place = place;
                let mut response =
                    in_time::execute_once_in_time(schema, &db, request, session_data).await;
                ensure_codes(&mut response);
                response
            }));
        }
        let stream = async_graphql::Executor::execute_stream(&self.schema, request, session_data);
        Box::pin(stream.map(move |mut response| {
            let _place = &place;
            ensure_codes(&mut response);
            response
        }))
    }
}

/// The SDL `courier schema` prints and `schema.graphql` holds.
pub fn sdl() -> String {
    // With `@specifiedBy` on the scalars that have it, as introspection shows them.
    build(None).sdl_with_options(async_graphql::SDLExportOptions::new().include_specified_by())
}

/// Runs `query` with `variables` (as the operation named `operation`, if any) on `schema`.
#[cfg(test)]
async fn run_request(
    schema: &CourierSchema,
    query: &str,
    variables: serde_json::Value,
    operation: Option<&str>,
) -> async_graphql::Response {
    let mut request = async_graphql::Request::new(query)
        .variables(async_graphql::Variables::from_json(variables));
    if let Some(operation) = operation {
        request = request.operation_name(operation);
    }
    schema.execute(request).await
}
