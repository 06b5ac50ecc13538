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
use async_graphql::{Request, ServerError, ServerResult, ValidationResult};

use super::argument_values::{refusals, takes_variable, Refusals};
use super::conditions::has_conditions;
use super::documents::{KnownDocument, Verdict};

/// How validation goes for a request, put in the request's data.
enum Validation {
    /// By the document's kept verdict: what validation measured, and what it refuses of
    /// this request's variables.
    Kept(ValidationResult, Refusals),
    /// Whole; then the refusals of arguments taking a variable the request omits, which
    /// validation does not check. If the document is kept and its verdict undecided, what
    /// becomes of the verdict is decided once the document passes.
    Whole(Option<Arc<KnownDocument>>, Vec<ServerError>),
}

/// Readies the validation of `request`, whose document is `known` as kept when it is (and
/// runs as parsed): the arguments' values are checked now, while the variables are at hand.
pub fn prepare(
    registry: &Registry,
    known: Option<Arc<KnownDocument>>,
    request: &mut Request,
) -> ServerResult<()> {
    let variables = std::mem::take(&mut request.variables);
    let operation_name = request.operation_name.clone();
    let found = request
        .parsed_query()
        .map(|document| refusals(registry, document, &variables, operation_name.as_deref()));
    request.variables = variables;
    let found = found?;
    let validation = match known.as_deref().and_then(KnownDocument::verdict) {
        Some(Verdict::Kept(verdict)) => Validation::Kept(*verdict, found),
        // Validated whole, as ever.
        Some(Verdict::Withheld) => Validation::Whole(None, found.omitted),
        None => Validation::Whole(known, found.omitted),
    };
    request.data.insert(validation);
    Ok(())
}

/// Validates the request of `ctx`: by its document's kept verdict, or by `whole` (the full
/// validation), after which what becomes of a kept document's verdict is decided once.
pub async fn validate(
    ctx: &ExtensionContext<'_>,
    whole: impl Future<Output = Result<ValidationResult, Vec<ServerError>>>,
) -> Result<ValidationResult, Vec<ServerError>> {
    let whole = async { whole.await.map_err(in_document_order) };
    match ctx.data_opt::<Validation>() {
        // Validation's own refusals first, as when it runs whole.
        Some(Validation::Kept(_, refusals)) if !refusals.given.is_empty() => {
            Err(in_document_order(refusals.given.clone()))
        }
        Some(Validation::Kept(_, refusals)) if !refusals.omitted.is_empty() => {
            Err(in_document_order(refusals.omitted.clone()))
        }
        Some(Validation::Kept(verdict, _)) => Ok(*verdict),
        Some(Validation::Whole(known, omitted)) => {
            let measured = whole.await?;
            if let Some(known) = known {
                known.decide(if may_be_kept(&ctx.schema_env.registry, &known.document) {
                    Verdict::Kept(measured)
                } else {
                    Verdict::Withheld
                });
            }
            if omitted.is_empty() {
                Ok(measured)
            } else {
                Err(in_document_order(omitted.clone()))
            }
        }
        None => whole.await,
    }
}

/// `errors` in the order of their places in the document (by line, then column; any
/// without a place last, as they came). Validation visits a document's fragments and
/// operations in no fixed order (the parser keeps them in hash maps), so the same
/// request's errors were listed in another order each time its document was parsed.
fn in_document_order(mut errors: Vec<ServerError>) -> Vec<ServerError> {
    errors.sort_by_key(|error| {
        error
            .locations
            .first()
            .map_or((usize::MAX, usize::MAX), |at| (at.line, at.column))
    });
    errors
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

    use serde_json::json;

    use super::super::documents::{DocumentCache, Verdict};
    use super::super::{build_with, run_request};

    #[tokio::test]
    async fn errors_come_in_the_order_of_their_places_in_the_document() {
        let query = "query { ...A ...B ...C }
            fragment C on Query { third }
            fragment A on Query { first }
            fragment B on Query { second }";
        for _ in 0..12 {
            // A schema of its own each time: the document is parsed afresh.
            let schema = build_with(None, Arc::new(DocumentCache::default()));
            let response = run_request(&schema, query, json!({}), None).await;
            let lines: Vec<usize> = response
                .errors
                .iter()
                .map(|error| error.locations.first().map_or(0, |at| at.line))
                .collect();
            assert_eq!(lines, [2, 3, 4], "{:?}", response.errors);
        }
    }

    #[tokio::test]
    async fn a_cost_read_from_variables_keeps_no_verdict() {
        let documents = Arc::new(DocumentCache::default());
        let schema = build_with(None, documents.clone());
        let kept = |query: &str| {
            let known = documents.get(query).expect("the document is kept");
            match known.verdict() {
                Some(Verdict::Kept(_)) => true,
                Some(Verdict::Withheld) => false,
                None => panic!("a request of {query} passed: the verdict is decided"),
            }
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
            let response = run_request(&schema, query, variables, None).await;
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
        let over = run_request(&schema, priced, json!({ "n": 100 }), None).await;
        assert!(over
            .errors
            .iter()
            .any(super::super::limits::is_limit_refusal));
    }
}
