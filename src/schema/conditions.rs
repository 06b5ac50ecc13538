//! What `@skip` and `@include` leave out of a document, given its variables, worked out
//! before the executor does it (which it does only after validation, out of sight of the
//! extensions that need it).

use async_graphql::parser::types::{
    Directive, DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};
use async_graphql::{Positioned, Value, Variables};

/// Whether any selection of `document` carries `@skip` or `@include`.
pub fn has_conditions(document: &ExecutableDocument) -> bool {
    fn in_set(set: &SelectionSet) -> bool {
        set.items.iter().any(|selection| {
            conditional(selection.node.directives())
                || match &selection.node {
                    Selection::Field(field) => in_set(&field.node.selection_set.node),
                    Selection::InlineFragment(inline) => in_set(&inline.node.selection_set.node),
                    Selection::FragmentSpread(_) => false,
                }
        })
    }
    document
        .operations
        .iter()
        .any(|(_, operation)| in_set(&operation.node.selection_set.node))
        || document
            .fragments
            .values()
            .any(|fragment| in_set(&fragment.node.selection_set.node))
}

/// Whether `directives` include `@skip` or `@include`.
fn conditional(directives: &[Positioned<Directive>]) -> bool {
    directives
        .iter()
        .any(|directive| matches!(directive.node.name.node.as_str(), "skip" | "include"))
}

/// `document` without the selections `@skip` or `@include` leave out, given `variables`.
pub fn remove_skipped(document: &mut ExecutableDocument, variables: &Variables) {
    fn prune(set: &mut SelectionSet, variables: &Variables) {
        set.items
            .retain(|selection| included(selection.node.directives(), variables));
        for selection in &mut set.items {
            match &mut selection.node {
                Selection::Field(field) => prune(&mut field.node.selection_set.node, variables),
                Selection::InlineFragment(inline) => {
                    prune(&mut inline.node.selection_set.node, variables);
                }
                Selection::FragmentSpread(_) => {}
            }
        }
    }
    match &mut document.operations {
        DocumentOperations::Single(operation) => {
            prune(&mut operation.node.selection_set.node, variables);
        }
        DocumentOperations::Multiple(operations) => {
            for operation in operations.values_mut() {
                prune(&mut operation.node.selection_set.node, variables);
            }
        }
    }
    for fragment in document.fragments.values_mut() {
        prune(&mut fragment.node.selection_set.node, variables);
    }
}

/// Whether `directives` keep their selection: not `@skip(if: true)`, not `@include(if:
/// false)` (a condition that is no boolean keeps it: validation refuses the document).
pub fn included(directives: &[Positioned<Directive>], variables: &Variables) -> bool {
    directives.iter().all(|directive| {
        let condition = directive
            .node
            .get_argument("if")
            .and_then(|value| match &value.node {
                async_graphql_value::Value::Boolean(b) => Some(*b),
                async_graphql_value::Value::Variable(name) => match variables.get(name) {
                    Some(Value::Boolean(b)) => Some(*b),
                    _ => None,
                },
                _ => None,
            });
        !matches!(
            (directive.node.name.node.as_str(), condition),
            ("skip", Some(true)) | ("include", Some(false))
        )
    })
}
