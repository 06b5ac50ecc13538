//! The one part of validation that reads a request's variables: the values of the
//! arguments that take variables, checked against their types with the refusals
//! async-graphql's `ArgumentsOfCorrectType` rule words (`Invalid value for argument
//! "input.endpointId", expected type "ID"`). Done alone for a document whose verdict is
//! kept (see [`super::documents::Verdict`]), so that a request is refused alike whether its
//! document was validated whole or not; every other rule reads the document alone.
//!
//! And done where validation does not: validation leaves out an argument that takes a
//! variable the request omits, literals and all, so
//! `replayDeliveries(filter: {endpointId: $e, eventTyp: "order.paid"})` with `$e` left out
//! ran, its misspelt field dropped, as a replay of everything. Such an argument is checked
//! with the omitted variable as absent (a field not given, an item `null`).
//!
//! Literals alone passed when the verdict was kept; a document with `@skip` or `@include`
//! keeps none, and no other directive runs, so no directive's argument is left to check.

use async_graphql::parser::types::{ExecutableDocument, OperationType, Selection, SelectionSet};
use async_graphql::registry::{MetaType, MetaTypeName, Registry};
use async_graphql::{
    Name, QueryPathNode, QueryPathSegment, ServerError, Value as ConstValue, Variables,
};
use async_graphql_value::Value;

use super::coercion::{field_to_look_at, inline_type};

/// What [`refusals`] found, by the arguments' variables.
#[derive(Debug, Clone, Default)]
pub struct Refusals {
    /// Of arguments whose every variable the request gives: validation's own refusals.
    pub given: Vec<ServerError>,
    /// Of arguments taking a variable the request omits, which validation does not check.
    pub omitted: Vec<ServerError>,
}

/// The refusals of `variables` given to `document`, run as the operation named
/// `operation_name` (every operation when none is named, as validation does): one for each
/// field argument that takes a variable and whose value does not fit the argument's type.
pub fn refusals(
    registry: &Registry,
    document: &ExecutableDocument,
    variables: &Variables,
    operation_name: Option<&str>,
) -> Refusals {
    let mut walk = Walk {
        registry,
        variables,
        refusals: Refusals::default(),
    };
    // Validation visits fragments first, under no operation: with the request's variables.
    for fragment in document.fragments.values() {
        let on = fragment.node.type_condition.node.on.node.as_str();
        walk.selection_set(on, &fragment.node.selection_set.node);
    }
    for (name, operation) in document.operations.iter() {
        let unselected = matches!(
            (operation_name, name),
            (Some(selected), Some(name)) if selected != name.as_str()
        );
        if unselected {
            continue;
        }
        let root = match operation.node.ty {
            OperationType::Query => Some(registry.query_type.as_str()),
            OperationType::Mutation => registry.mutation_type.as_deref(),
            OperationType::Subscription => registry.subscription_type.as_deref(),
        };
        if let Some(root) = root {
            walk.selection_set(root, &operation.node.selection_set.node);
        }
    }
    walk.refusals
}

/// Whether `value` is or holds a variable.
pub fn takes_variable(value: &Value) -> bool {
    match value {
        Value::Variable(_) => true,
        Value::List(items) => items.iter().any(takes_variable),
        Value::Object(fields) => fields.values().any(takes_variable),
        _ => false,
    }
}

/// Whether every variable `value` holds is among `variables`.
fn all_given(value: &Value, variables: &Variables) -> bool {
    match value {
        Value::Variable(name) => variables.contains_key(name),
        Value::List(items) => items.iter().all(|item| all_given(item, variables)),
        Value::Object(fields) => fields.values().all(|field| all_given(field, variables)),
        _ => true,
    }
}

/// A value where an argument takes one: as the document writes it, or as a variable gives it.
#[derive(Clone, Copy)]
enum Input<'a> {
    Literal(&'a Value),
    Given(&'a ConstValue),
}

/// The walk over a document's selections, and the refusals it found.
struct Walk<'a> {
    registry: &'a Registry,
    variables: &'a Variables,
    refusals: Refusals,
}

impl<'a> Walk<'a> {
    /// Checks the arguments of every field `set` selects on type `parent` and below it
    /// (fragment definitions are walked on their own, as validation walks them).
    fn selection_set(&mut self, parent: &str, set: &'a SelectionSet) {
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) => {
                    let Some(meta) = field_to_look_at(self.registry, parent, &field.node) else {
                        continue;
                    };
                    for (name, value) in &field.node.arguments {
                        // A variable omitted as the whole argument leaves the argument out.
                        let omitted_whole = matches!(&value.node,
                            Value::Variable(variable) if !self.variables.contains_key(variable));
                        if !takes_variable(&value.node) || omitted_whole {
                            continue;
                        }
                        let Some(argument) = meta.args.get(name.node.as_str()) else {
                            continue;
                        };
                        let given = all_given(&value.node, self.variables);
                        let path = QueryPathNode {
                            parent: None,
                            segment: QueryPathSegment::Name(&argument.name),
                        };
                        if let Some(reason) =
                            self.invalid(&argument.ty, Input::Literal(&value.node), &path)
                        {
                            let refusal = ServerError::new(
                                format!("Invalid value for argument {reason}"),
                                Some(name.pos),
                            );
                            if given {
                                self.refusals.given.push(refusal);
                            } else {
                                self.refusals.omitted.push(refusal);
                            }
                        }
                    }
                    let child = MetaTypeName::concrete_typename(&meta.ty);
                    self.selection_set(child, &field.node.selection_set.node);
                }
                Selection::InlineFragment(inline) => {
                    let on = inline_type(parent, &inline.node);
                    self.selection_set(on, &inline.node.selection_set.node);
                }
                Selection::FragmentSpread(_) => {}
            }
        }
    }

    /// `input` with a variable read: an omitted one reads as `null` (in an input object, a
    /// field given an omitted variable is left out before this).
    fn read(&self, input: Input<'a>) -> Input<'a> {
        match input {
            Input::Literal(Value::Variable(name)) => {
                Input::Given(self.variables.get(name).unwrap_or(&ConstValue::Null))
            }
            other => other,
        }
    }

    /// Whether `value` is a variable the request omits.
    fn omitted(&self, value: &Value) -> bool {
        matches!(value, Value::Variable(name) if !self.variables.contains_key(name))
    }

    /// Why `input` does not fit type `ty` (as the registry spells it) at `path`, in
    /// validation's words, or `None` when it fits.
    fn invalid(&self, ty: &str, input: Input<'a>, path: &QueryPathNode<'_>) -> Option<String> {
        let input = self.read(input);
        let null = matches!(
            input,
            Input::Literal(Value::Null) | Input::Given(ConstValue::Null)
        );
        match MetaTypeName::create(ty) {
            MetaTypeName::NonNull(inner) if null => {
                Some(at(path, format!("expected type \"{inner}\"")))
            }
            MetaTypeName::NonNull(inner) => self.invalid(inner, input, path),
            MetaTypeName::List(item) => match input {
                Input::Literal(Value::List(items)) => {
                    items.iter().enumerate().find_map(|(index, value)| {
                        self.invalid(item, Input::Literal(value), &indexed(path, index))
                    })
                }
                Input::Given(ConstValue::List(items)) => {
                    items.iter().enumerate().find_map(|(index, value)| {
                        self.invalid(item, Input::Given(value), &indexed(path, index))
                    })
                }
                _ if null => None,
                // A single value stands for a list of one.
                _ => self.invalid(item, input, path),
            },
            MetaTypeName::Named(_) if null => None,
            MetaTypeName::Named(name) => self.invalid_named(name, input, path),
        }
    }

    /// [`Walk::invalid`] for a named type and a value that is not null.
    fn invalid_named(
        &self,
        name: &str,
        input: Input<'a>,
        path: &QueryPathNode<'_>,
    ) -> Option<String> {
        match self.registry.types.get(name)? {
            MetaType::Scalar {
                is_valid: Some(is_valid),
                ..
            } => {
                let fits = match input {
                    Input::Given(value) => is_valid(value),
                    Input::Literal(value) => value
                        .clone()
                        .into_const_with(|variable| {
                            let given = self.variables.get(&variable).cloned();
                            Ok::<_, ()>(given.unwrap_or(ConstValue::Null))
                        })
                        .is_ok_and(|value| is_valid(&value)),
                };
                (!fits).then(|| at(path, format!("expected type \"{name}\"")))
            }
            MetaType::Enum {
                enum_values,
                name: enum_name,
                ..
            } => {
                let value = match input {
                    Input::Literal(Value::Enum(value)) => value.as_str(),
                    Input::Literal(Value::String(value)) => value.as_str(),
                    Input::Given(ConstValue::Enum(value)) => value.as_str(),
                    Input::Given(ConstValue::String(value)) => value.as_str(),
                    _ => return Some(at(path, format!("expected type \"{name}\""))),
                };
                (!enum_values.contains_key(value)).then(|| {
                    at(
                        path,
                        format!(
                            "enumeration type \"{enum_name}\" does not contain the value \"{value}\""
                        ),
                    )
                })
            }
            MetaType::InputObject {
                input_fields,
                name: object_name,
                oneof,
                ..
            } => {
                let fields: Vec<(&Name, Input<'a>)> = match input {
                    Input::Literal(Value::Object(fields)) => fields
                        .iter()
                        .filter(|(_, value)| !self.omitted(value))
                        .map(|(name, value)| (name, Input::Literal(value)))
                        .collect(),
                    Input::Given(ConstValue::Object(fields)) => fields
                        .iter()
                        .map(|(name, value)| (name, Input::Given(value)))
                        .collect(),
                    // Validation leaves a value of another kind to the resolver.
                    _ => return None,
                };
                if *oneof {
                    if fields.len() != 1 {
                        return Some(at(
                            path,
                            "Oneof input objects requires have exactly one field".to_owned(),
                        ));
                    }
                    if fields.first().is_some_and(|(_, value)| {
                        matches!(
                            self.read(*value),
                            Input::Literal(Value::Null) | Input::Given(ConstValue::Null)
                        )
                    }) {
                        return Some(at(
                            path,
                            "Oneof Input Objects require that exactly one field must be supplied and that field must not be null".to_owned(),
                        ));
                    }
                }
                for meta in input_fields.values() {
                    let given = fields
                        .iter()
                        .find(|(name, _)| name.as_str() == meta.name)
                        .map(|(_, value)| *value);
                    match given {
                        Some(value) => {
                            let here = QueryPathNode {
                                parent: Some(path),
                                segment: QueryPathSegment::Name(&meta.name),
                            };
                            if let Some(reason) = self.invalid(&meta.ty, value, &here) {
                                return Some(reason);
                            }
                        }
                        None if MetaTypeName::create(&meta.ty).is_non_null()
                            && meta.default_value.is_none() =>
                        {
                            return Some(at(
                                path,
                                format!(
                                    "field \"{}\" of type \"{}\" is required but not provided",
                                    meta.name, meta.ty
                                ),
                            ));
                        }
                        None => {}
                    }
                }
                // Of several unknown fields, validation names one of a hash set's, at
                // random; here the first written.
                fields
                    .iter()
                    .find(|(name, _)| !input_fields.contains_key(name.as_str()))
                    .map(|(name, _)| {
                        at(
                            path,
                            format!("unknown field \"{name}\" of type \"{object_name}\""),
                        )
                    })
            }
            _ => None,
        }
    }
}

/// `path` and item `index` of the list there.
fn indexed<'p>(path: &'p QueryPathNode<'p>, index: usize) -> QueryPathNode<'p> {
    QueryPathNode {
        parent: Some(path),
        segment: QueryPathSegment::Index(index),
    }
}

/// A refusal's reason, `problem` at `path`, as validation words it.
fn at(path: &QueryPathNode<'_>, problem: String) -> String {
    format!("\"{path}\", {problem}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_graphql::Response;
    use serde_json::{json, Value as Json};

    use super::super::documents::{DocumentCache, Verdict};
    use super::super::{build_with, run_request as run};

    const CREATE_KEY: &str =
        "mutation($input: CreateApiKeyInput!) { createApiKey(input: $input) { token } }";

    /// A refusal's message and where it points, as `(line, column)`.
    fn refusals_of(response: &Response) -> Vec<(String, Vec<(usize, usize)>)> {
        response
            .errors
            .iter()
            .map(|error| {
                let at = error.locations.iter().map(|pos| (pos.line, pos.column));
                (error.message.clone(), at.collect())
            })
            .collect()
    }

    /// Asserts that `bad` variables are refused alike by a process validating `query` whole
    /// (its first request of it) and by one that kept the verdict of a request of it with
    /// `good` variables, which passed validation (its errors are the resolvers': no state).
    async fn refused_alike(query: &str, good: Json, bad: Json, operation: Option<&str>) {
        let whole = run(
            &build_with(None, Arc::default()),
            query,
            bad.clone(),
            operation,
        )
        .await;
        assert!(!whole.errors.is_empty(), "{bad} is refused");

        let documents = Arc::new(DocumentCache::default());
        let schema = build_with(None, documents.clone());
        let passed = run(&schema, query, good.clone(), operation).await;
        assert!(
            passed.errors.iter().all(|error| !error.path.is_empty()),
            "{good} passes validation: {:?}",
            passed.errors
        );
        let known = documents.get(query).expect("the document is kept");
        assert!(
            matches!(known.verdict(), Some(Verdict::Kept(_))),
            "its verdict is kept"
        );

        let kept = run(&schema, query, bad.clone(), operation).await;
        assert_eq!(refusals_of(&kept), refusals_of(&whole), "{bad}");
        assert_eq!(kept.data, whole.data);
    }

    #[tokio::test]
    async fn variables_are_refused_alike_with_a_kept_verdict() {
        let good = json!({ "input": { "name": "k", "role": "ADMIN", "endpointIds": ["a"] } });
        for bad in [
            json!({ "input": { "name": "k" } }),
            json!({ "input": { "name": "k", "role": "OWNER" } }),
            json!({ "input": { "name": "k", "role": 5 } }),
            json!({ "input": { "name": 5, "role": "ADMIN" } }),
            json!({ "input": { "name": "k", "role": "ADMIN", "endpointIds": ["a", null] } }),
            json!({ "input": { "name": "k", "role": "ADMIN", "endpointIds": [true] } }),
            json!({ "input": { "name": "k", "role": "ADMIN", "owner": "me" } }),
            json!({ "input": { "name": null, "role": "ADMIN" } }),
            json!({ "input": 5 }),
        ] {
            refused_alike(CREATE_KEY, good.clone(), bad, None).await;
        }
    }

    #[tokio::test]
    async fn literals_around_variables_fragments_and_operations_are_refused_alike() {
        let mixed = "mutation($name: String!, $ids: [ID!]) {
            createApiKey(input: { name: $name, role: ADMIN, endpointIds: $ids }) { token } }";
        let good = json!({ "name": "k", "ids": ["a"] });
        refused_alike(
            mixed,
            good.clone(),
            json!({ "name": 5, "ids": ["a"] }),
            None,
        )
        .await;
        refused_alike(
            mixed,
            good,
            json!({ "name": "k", "ids": [1.5, null] }),
            None,
        )
        .await;

        let two = "mutation($a: CreateApiKeyInput!, $b: CreateApiKeyInput!) {
            a: createApiKey(input: $a) { token }
            b: createApiKey(input: $b) { token } }";
        let key = json!({ "name": "k", "role": "ADMIN" });
        let bad = json!({ "a": { "name": "k" }, "b": { "name": "k", "role": "NONE" } });
        refused_alike(two, json!({ "a": key, "b": key }), bad, None).await;

        let spread = "mutation($input: CreateApiKeyInput!) { ...Key }
            fragment Key on Mutation { createApiKey(input: $input) { token } }";
        let bad = json!({ "input": { "name": "k", "role": "NONE" } });
        refused_alike(spread, json!({ "input": key }), bad.clone(), None).await;

        let operations =
            "mutation A($input: CreateApiKeyInput!) { createApiKey(input: $input) { token } }
            mutation B($input: CreateApiKeyInput!) { b: createApiKey(input: $input) { token } }";
        refused_alike(operations, json!({ "input": key }), bad.clone(), Some("A")).await;
        refused_alike(operations, json!({ "input": key }), bad, Some("B")).await;
    }

    #[tokio::test]
    async fn literals_beside_an_omitted_variable_are_refused_as_beside_a_null() {
        let schema = build_with(None, Arc::default());
        let cases = [
            "mutation($e: ID) { replayDeliveries(filter: {endpointId: $e, eventTyp: \"paid\"}) { replayed } }",
            "mutation($e: ID) { createApiKey(input: {name: 5, role: ADMIN, tenantId: $e}) { token } }",
            "mutation($e: ID) { createApiKey(input: {name: \"k\", role: ADMIN, endpointIds: [\"a\", $e]}) { token } }",
        ];
        for query in cases {
            let omitted = run(&schema, query, json!({}), None).await;
            let fresh = format!("{query}\n# null");
            let null = run(&schema, &fresh, json!({ "e": null }), None).await;
            assert!(!null.errors.is_empty(), "{query}");
            assert!(null.errors.iter().all(|error| error.path.is_empty()));
            assert_eq!(refusals_of(&omitted), refusals_of(&null), "{query}");
        }
        // A fitting value beside the omitted variable passes validation.
        let fits = "mutation($e: ID) { replayDeliveries(filter: {endpointId: $e, eventType: \"paid\"}) { replayed } }";
        let ran = run(&schema, fits, json!({}), None).await;
        assert!(
            ran.errors.iter().all(|error| !error.path.is_empty()),
            "{:?}",
            ran.errors
        );
    }
}
