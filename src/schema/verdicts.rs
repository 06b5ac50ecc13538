//! Validation verdicts kept with their documents: a document that passed validation once
//! is not validated whole again when nothing a request varies can change the outcome. The
//! verdict (what validation measured: depth, cost, cache control) stands for every later
//! request of the same text; the one rule that reads the variables, the arguments' values,
//! runs for each (see [`super::argument_values`]). Validation was about a seventh of the
//! instructions of a `submit` (measured with callgrind, see the README).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use async_graphql::extensions::ExtensionContext;
use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::registry::{MetaType, Registry};
use async_graphql::{Request, ServerError, ValidationResult};

use super::argument_values::{refusals, takes_variable};
use super::conditions::has_conditions;
use super::documents::KnownDocument;

/// How validation goes for a request of a kept document, put in the request's data.
enum Validation {
    /// The document's verdict is kept: what validation measured, and what it refuses of
    /// this request's variables.
    Kept(ValidationResult, Vec<ServerError>),
    /// It runs whole; if the document passes, its verdict may be kept.
    ToKeep(Arc<KnownDocument>),
}

/// Readies the validation of `request`, whose document is `known` as kept (and runs as
/// parsed): with its verdict when there is one, the arguments' values checked now, while
/// the variables are at hand.
pub fn prepare(registry: &Registry, known: Arc<KnownDocument>, request: &mut Request) {
    let validation = match known.verdict() {
        Some(verdict) => Validation::Kept(
            *verdict,
            refusals(
                registry,
                &known.document,
                &request.variables,
                request.operation_name.as_deref(),
            ),
        ),
        None => Validation::ToKeep(known),
    };
    request.data.insert(validation);
}

/// Validates the request of `ctx`: by its document's kept verdict, or by `whole` (the full
/// validation), whose verdict is then kept if it may be.
pub async fn validate(
    ctx: &ExtensionContext<'_>,
    whole: impl Future<Output = Result<ValidationResult, Vec<ServerError>>>,
) -> Result<ValidationResult, Vec<ServerError>> {
    match ctx.data_opt::<Validation>() {
        Some(Validation::Kept(_, refusals)) if !refusals.is_empty() => Err(refusals.clone()),
        Some(Validation::Kept(verdict, _)) => Ok(*verdict),
        Some(Validation::ToKeep(known)) => {
            let measured = whole.await?;
            if may_be_kept(&ctx.schema_env.registry, &known.document) {
                known.keep_verdict(measured);
            }
            Ok(measured)
        }
        None => whole.await,
    }
}

/// Whether a verdict on `document` holds for every request of it: validation runs on the
/// document as parsed (no `@skip` or `@include`, which change by the variables what runs
/// and what it costs), and what it costs reads no variable.
fn may_be_kept(registry: &Registry, document: &ExecutableDocument) -> bool {
    !has_conditions(document) && !cost_reads_variables(registry, document)
}

/// Whether what validation measures of `document` (its cost) may depend on the variables:
/// some field priced by a function (a connection's `first`) takes a variable among its
/// arguments. Fields are matched by name alone, so a namesake counts too.
fn cost_reads_variables(registry: &Registry, document: &ExecutableDocument) -> bool {
    let priced: HashSet<&str> = registry
        .types
        .values()
        .filter_map(MetaType::fields)
        .flat_map(IndexMap::values)
        .filter(|field| field.compute_complexity.is_some())
        .map(|field| field.name.as_str())
        .collect();
    fn in_set(set: &SelectionSet, priced: &HashSet<&str>) -> bool {
        set.items.iter().any(|selection| match &selection.node {
            Selection::Field(field) => {
                (priced.contains(field.node.name.node.as_str())
                    && field
                        .node
                        .arguments
                        .iter()
                        .any(|(_, value)| takes_variable(&value.node)))
                    || in_set(&field.node.selection_set.node, priced)
            }
            Selection::InlineFragment(inline) => in_set(&inline.node.selection_set.node, priced),
            Selection::FragmentSpread(_) => false,
        })
    }
    !priced.is_empty()
        && (document
            .operations
            .iter()
            .any(|(_, operation)| in_set(&operation.node.selection_set.node, &priced))
            || document
                .fragments
                .values()
                .any(|fragment| in_set(&fragment.node.selection_set.node, &priced)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_graphql::{Request, Response, Variables};
    use serde_json::{json, Value as Json};

    use super::super::documents::DocumentCache;
    use super::super::{build_with, CourierSchema};

    async fn run(schema: &CourierSchema, query: &str, variables: Json) -> Response {
        let request = Request::new(query).variables(Variables::from_json(variables));
        schema.execute(request).await
    }

    #[tokio::test]
    async fn a_cost_read_from_variables_keeps_no_verdict() {
        let documents = Arc::new(DocumentCache::default());
        let schema = build_with(None, documents.clone());
        let kept = |query: &str| {
            let known = documents.get(query).expect("the document is kept");
            known.verdict().is_some()
        };
        let priced = "query($n: Int) {
            tenants(first: $n) { edges { node { endpoints(first: $n) { edges { cursor } } } } } }";
        let nested =
            "query($n: Int) { ... on Query { endpoints(first: $n) { edges { cursor } } } }";
        let literal =
            "query($a: ID!) { endpoint(id: $a) { id } endpoints(first: 5) { edges { cursor } } }";
        let conditional =
            "query($a: ID!, $b: Boolean!) { endpoint(id: $a) { id @include(if: $b) } }";
        for (query, variables) in [
            (priced, json!({ "n": 1 })),
            (nested, json!({ "n": 1 })),
            (literal, json!({ "a": "x" })),
            (conditional, json!({ "a": "x", "b": true })),
        ] {
            let response = run(&schema, query, variables).await;
            assert!(response.errors.iter().all(|error| !error.path.is_empty()));
        }
        assert!(!kept(priced), "the budget reads `first` from the variables");
        assert!(!kept(nested), "in a fragment too");
        assert!(
            kept(literal),
            "a literal `first` costs the same in every request"
        );
        assert!(!kept(conditional), "`@include` changes what runs");

        // Over the budget by a variable, after a request within it.
        let over = run(&schema, priced, json!({ "n": 100 })).await;
        assert!(over
            .errors
            .iter()
            .any(super::super::limits::is_limit_refusal));
    }
}
