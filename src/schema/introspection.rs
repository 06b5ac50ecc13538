//! Introspection as the spec has it where async-graphql answers otherwise: the schema's
//! `description` is `null`, Courier's schema having none (async-graphql answers every
//! `__schema { description }` with its own words about `__Schema`, so a client that built
//! the schema from introspection printed a description `schema.graphql` does not have).

use std::collections::{HashMap, HashSet};

use async_graphql::parser::types::{
    ExecutableDocument, FragmentDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Positioned, Value};

use super::single_root::selected_operation;

/// Whether a document of text `query` may read the schema's description.
pub fn may_describe(query: &str) -> bool {
    query.contains("__schema")
}

/// Sets every `__schema { description }` of `data`, the result of `document`'s operation
/// named `operation_name` (or its first), to `null`.
pub fn no_schema_description(
    data: &mut Value,
    document: &ExecutableDocument,
    operation_name: Option<&str>,
) {
    let (Some((_, operation)), Value::Object(root)) =
        (selected_operation(document, operation_name), data)
    else {
        return;
    };
    let fragments = &document.fragments;
    for (key, schema_set) in fields_named(&operation.node.selection_set.node, fragments, "__schema")
    {
        let Some(Value::Object(schema)) = root.get_mut(key.as_str()) else {
            continue;
        };
        for (key, _) in fields_named(schema_set, fragments, "description") {
            if let Some(description) = schema.get_mut(key.as_str()) {
                *description = Value::Null;
            }
        }
    }
}

/// The response keys and selection sets of the fields named `name` that `set` selects at
/// its level, fragments expanded (each once).
fn fields_named<'a>(
    set: &'a SelectionSet,
    fragments: &'a HashMap<Name, Positioned<FragmentDefinition>>,
    name: &str,
) -> Vec<(&'a Name, &'a SelectionSet)> {
    fn walk<'a>(
        set: &'a SelectionSet,
        fragments: &'a HashMap<Name, Positioned<FragmentDefinition>>,
        name: &str,
        spread: &mut HashSet<&'a str>,
        found: &mut Vec<(&'a Name, &'a SelectionSet)>,
    ) {
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) if field.node.name.node == name => {
                    found.push((
                        &field.node.response_key().node,
                        &field.node.selection_set.node,
                    ));
                }
                Selection::Field(_) => {}
                Selection::InlineFragment(inline) => {
                    walk(
                        &inline.node.selection_set.node,
                        fragments,
                        name,
                        spread,
                        found,
                    );
                }
                Selection::FragmentSpread(fragment) => {
                    let fragment_name = &fragment.node.fragment_name.node;
                    if spread.insert(fragment_name.as_str()) {
                        if let Some(fragment) = fragments.get(fragment_name) {
                            walk(
                                &fragment.node.selection_set.node,
                                fragments,
                                name,
                                spread,
                                found,
                            );
                        }
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(set, fragments, name, &mut HashSet::new(), &mut found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(query: &str, data: serde_json::Value) -> serde_json::Value {
        let document = async_graphql::parser::parse_query(query).expect("a document");
        let mut data = Value::from_json(data).expect("a value");
        no_schema_description(&mut data, &document, None);
        data.into_json().expect("JSON")
    }

    #[test]
    fn the_schema_description_is_null_however_it_is_asked_for() {
        assert_eq!(
            described(
                "{ s: __schema { d: description queryType { name } } }",
                serde_json::json!({ "s": { "d": "words", "queryType": { "name": "Query" } } })
            ),
            serde_json::json!({ "s": { "d": null, "queryType": { "name": "Query" } } })
        );
        assert_eq!(
            described(
                "{ ...F } fragment F on Query { __schema { ... on __Schema { description } } }",
                serde_json::json!({ "__schema": { "description": "words" } })
            ),
            serde_json::json!({ "__schema": { "description": null } })
        );
        // A field of another name aliased `description` keeps its value.
        assert_eq!(
            described(
                "{ __schema { description: queryType { name } } }",
                serde_json::json!({ "__schema": { "description": { "name": "Query" } } })
            ),
            serde_json::json!({ "__schema": { "description": { "name": "Query" } } })
        );
    }
}
