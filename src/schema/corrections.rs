//! One schema extension for the corrections Courier makes where async-graphql answers
//! otherwise than the spec: `__typename` held to the rules ([`super::typename`]), objects
//! whose every selection is left out answered `{}` ([`super::empty_selections`]), the
//! schema's description answered `null` ([`super::introspection`]), and one wrong argument
//! refused once ([`one_refusal_per_argument`]). One extension, not four: async-graphql
//! calls every extension's hooks for every field of every request (measured alternately
//! with and without it, a submit's CPU differed within this machine's noise).

use std::sync::{Arc, Mutex, PoisonError};

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextSubscribe,
    NextValidation,
};
use async_graphql::futures_util::stream::{BoxStream, StreamExt};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Response, ServerError, ServerResult, ValidationResult, Variables};

use super::empty_selections::{self, Placed};
use super::{introspection, typename};

/// The schema extension that makes the corrections.
pub struct Corrections;

impl ExtensionFactory for Corrections {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Corrected::default())
    }
}

/// One request's half of [`Corrections`]: what its results need. (Shared with the stream
/// of a subscription's events, which outlives the borrow.)
#[derive(Default)]
struct Corrected {
    /// The document with its placeholders, if it got any.
    placed: Arc<Mutex<Option<Placed>>>,
    /// The document, if it may read the schema's description.
    describes: Mutex<Option<ExecutableDocument>>,
}

#[async_graphql::async_trait::async_trait]
impl Extension for Corrected {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let mut document = next.run(ctx, query, variables).await?;
        // First, so that the placeholders see its `__typename`s as they will run.
        if query.contains("__typename") {
            typename::hold_to_the_rules(&mut document, &ctx.schema_env.registry)?;
        }
        if let Some(placed) = empty_selections::place(&mut document, query, variables) {
            *lock(&self.placed) = Some(placed);
        }
        if introspection::may_describe(query) {
            *lock(&self.describes) = Some(document.clone());
        }
        Ok(document)
    }

    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        next.run(ctx).await.map_err(one_refusal_per_argument)
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let mut response = next.run(ctx, operation_name).await;
        if let Some(placed) = lock(&self.placed).as_ref() {
            placed.remove_from(&mut response.data, operation_name);
        }
        if let Some(document) = lock(&self.describes).take() {
            introspection::no_schema_description(&mut response.data, &document, operation_name);
        }
        response
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let placed = self.placed.clone();
        let events = stream.map(move |mut response| {
            if let Some(placed) = lock(&placed).as_ref() {
                placed.remove_from(&mut response.data, None);
            }
            response
        });
        next.run(ctx, events.boxed())
    }
}

/// `errors` of validation without the second refusal of a wrong page size: validation
/// refuses `endpoints(first: "x")` as "Invalid value for argument", and then the query
/// budget, which reads `first`, as "Expected input type" at the field.
fn one_refusal_per_argument(mut errors: Vec<ServerError>) -> Vec<ServerError> {
    let refused_as_argument = errors
        .iter()
        .any(|error| error.message.starts_with("Invalid value for argument "));
    if refused_as_argument {
        errors.retain(|error| !error.message.starts_with("Expected input type "));
    }
    errors
}

/// `mutex` locked, whatever a holder that panicked left (each write is whole).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
