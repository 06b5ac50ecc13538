//! The operation of a document that runs, and the GraphQL rule async-graphql does not
//! check for it: a subscription selects exactly one root field ("Single root field",
//! GraphQL spec 5.2.3.1), fragments included. Two would interleave two event streams in
//! one subscription.

use std::collections::HashSet;

use async_graphql::parser::types::{
    ExecutableDocument, OperationDefinition, OperationType, Selection, SelectionSet,
};
use async_graphql::parser::Positioned;
use async_graphql::Name;
use async_graphql::ServerError;

use super::limits::MAX_FRAGMENT_DEPTH;

/// The error for the operation `operation_name` selects in `document`, if it is a
/// subscription that selects other than one root field (by response key).
pub fn refusal(document: &ExecutableDocument, operation_name: Option<&str>) -> Option<ServerError> {
    let (name, operation) = selected_operation(document, operation_name)?;
    if operation.node.ty != OperationType::Subscription {
        return None;
    }
    let mut keys = HashSet::new();
    collect(document, &operation.node.selection_set.node, 0, &mut keys);
    if keys.len() == 1 {
        return None;
    }
    let subject = match name {
        Some(name) => format!("Subscription \"{name}\""),
        None => "Anonymous Subscription".to_owned(),
    };
    Some(ServerError::new(
        format!("{subject} must select only one top level field."),
        Some(operation.pos),
    ))
}

/// The operation of `document` that would run: the one named `operation_name`, or the
/// first, with its name.
pub(super) fn selected_operation<'a>(
    document: &'a ExecutableDocument,
    operation_name: Option<&str>,
) -> Option<(Option<&'a Name>, &'a Positioned<OperationDefinition>)> {
    let mut operations = document.operations.iter();
    match operation_name {
        Some(name) => operations.find(|(op_name, _)| op_name.map(|n| n.as_str()) == Some(name)),
        None => operations.next(),
    }
}

/// Adds the response keys `set` selects at its level, through fragments, to `keys`,
/// stopping at two (enough to refuse).
fn collect<'a>(
    document: &'a ExecutableDocument,
    set: &'a SelectionSet,
    depth: usize,
    keys: &mut HashSet<&'a str>,
) {
    if depth > MAX_FRAGMENT_DEPTH {
        return;
    }
    for selection in &set.items {
        if keys.len() > 1 {
            return;
        }
        match &selection.node {
            Selection::Field(field) => {
                keys.insert(field.node.response_key().node.as_str());
            }
            Selection::FragmentSpread(spread) => {
                if let Some(fragment) = document.fragments.get(&spread.node.fragment_name.node) {
                    collect(document, &fragment.node.selection_set.node, depth + 1, keys);
                }
            }
            Selection::InlineFragment(inline) => {
                collect(document, &inline.node.selection_set.node, depth + 1, keys);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(query: &str, name: Option<&str>) -> Option<String> {
        let document = async_graphql::parser::parse_query(query).expect("parses");
        refusal(&document, name).map(|error| error.message)
    }

    #[test]
    fn a_subscription_selects_one_root_field() {
        assert_eq!(refused("subscription { a { b } }", None), None);
        assert_eq!(
            refused("subscription { a { b } a { c } }", None),
            None,
            "one key"
        );
        assert_eq!(
            refused("subscription S { a { b } c: a { b } }", None).as_deref(),
            Some("Subscription \"S\" must select only one top level field.")
        );
        assert_eq!(
            refused(
                "subscription { ...F } fragment F on Subscription { a { b } ... { x: a { b } } }",
                None
            )
            .as_deref(),
            Some("Anonymous Subscription must select only one top level field.")
        );
        // Only the operation that runs counts; queries may select many.
        let both = "query Q { a b } subscription S { a { b } x: a { b } }";
        assert_eq!(refused(both, Some("Q")), None);
        assert!(refused(both, Some("S")).is_some());
        assert_eq!(refused("{ a b c }", None), None);
    }
}
