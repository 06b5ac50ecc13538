//! What every executed GraphQL operation leaves behind: its count and duration in the
//! metrics and, while tracing is on, its span (the one its resolvers, and so everything a
//! `submit` stores, run in).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery,
};
use async_graphql::parser::types::{ExecutableDocument, OperationType, Selection};
use async_graphql::{ServerResult, Value, Variables};
use tracing::Instrument as _;

use crate::metrics::{Metrics, OperationLabels};
use crate::telemetry::spans;

/// The trace context a caller sent with its request (its `traceparent`), given to the
/// request as data: the parent of the operation's span.
#[derive(Clone, Debug)]
pub struct CallerTrace(pub opentelemetry::Context);

/// async-graphql extension observing each executed operation: recorded in [`Metrics`]
/// (none: a schema built only to print its SDL) and traced.
pub struct ObservedOperations(pub Option<Arc<Metrics>>);

impl ExtensionFactory for ObservedOperations {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Observer {
            metrics: self.0.clone(),
            operations: Mutex::default(),
        })
    }
}

/// Per-request half of [`ObservedOperations`]: remembers the parsed operations until
/// execution.
struct Observer {
    metrics: Option<Arc<Metrics>>,
    operations: Mutex<Vec<ParsedOperation>>,
}

struct ParsedOperation {
    name: Option<String>,
    kind: &'static str,
    root_field: String,
}

#[async_graphql::async_trait::async_trait]
impl Extension for Observer {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let document = next.run(ctx, query, variables).await?;
        let parsed = document
            .operations
            .iter()
            .map(|(name, operation)| ParsedOperation {
                name: name.map(|n| n.to_string()),
                kind: match operation.node.ty {
                    OperationType::Query => "query",
                    OperationType::Mutation => "mutation",
                    OperationType::Subscription => "subscription",
                },
                root_field: operation
                    .node
                    .selection_set
                    .node
                    .items
                    .iter()
                    .find_map(|item| match &item.node {
                        Selection::Field(field) => Some(field.node.name.node.to_string()),
                        _ => None,
                    })
                    .unwrap_or_else(|| "fragment".to_owned()),
            })
            .collect();
        if let Ok(mut operations) = self.operations.lock() {
            *operations = parsed;
        }
        Ok(document)
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> async_graphql::Response {
        let started = Instant::now();
        let (kind, operation) = match self.operations.lock() {
            Ok(operations) => operations
                .iter()
                .find(|op| operation_name.is_none() || op.name.as_deref() == operation_name)
                .map(|op| (op.kind, op.root_field.clone()))
                .unwrap_or(("unknown", "unknown".to_owned())),
            Err(_) => ("unknown", "unknown".to_owned()),
        };
        // A subscription is executed once per event it sends, for as long as it lasts:
        // it has no span (each event would be a trace of its own). Anything else is named
        // by the document's operation name, or else by the root field it selects.
        let response = if kind == "subscription" {
            next.run(ctx, operation_name).await
        } else {
            let span = spans::operation(
                kind,
                Some(operation_name.unwrap_or(&operation)),
                ctx.data_opt::<CallerTrace>().map(|caller| &caller.0),
            );
            let response = next.run(ctx, operation_name).instrument(span.clone()).await;
            if let Some(error) = response.errors.first() {
                spans::operation_failed(&span, &error.message);
            }
            response
        };
        let Some(metrics) = &self.metrics else {
            return response;
        };
        let outcome = response
            .errors
            .first()
            .map(|error| {
                error
                    .extensions
                    .as_ref()
                    .and_then(|ext| ext.get("code"))
                    .and_then(|code| match code {
                        Value::String(code) => Some(code.clone()),
                        _ => None,
                    })
                    .unwrap_or_else(|| "error".to_owned())
            })
            .unwrap_or_else(|| "ok".to_owned());
        let labels = OperationLabels {
            kind: kind.to_owned(),
            operation,
            outcome,
        };
        metrics.graphql_operations.get_or_create(&labels).inc();
        metrics
            .graphql_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        response
    }
}
