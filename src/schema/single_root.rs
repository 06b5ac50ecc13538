//! The operation of a document that runs, and what async-graphql does not do for a
//! subscription's root: check that it selects exactly one field ("Single root field",
//! GraphQL spec 5.2.3.1), fragments included (two would interleave two event streams in one
//! subscription), without `@skip` or `@include` there; and run a root field selected
//! through a fragment (async-graphql starts streams for plain root fields only, and ends a
//! subscription whose field came in a fragment at once, having sent nothing).

use std::collections::HashSet;

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType, Selection,
    SelectionSet,
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
    let subject = match name {
        Some(name) => format!("Subscription \"{name}\""),
        None => "Anonymous Subscription".to_owned(),
    };
    let root = &operation.node.selection_set.node;
    if skips_or_includes(document, root, 0) {
        return Some(ServerError::new(
            format!(
                "{subject} must not use `@skip` or `@include` directives in the top level selection."
            ),
            Some(operation.pos),
        ));
    }
    let mut keys = HashSet::new();
    collect(document, root, 0, &mut keys);
    if keys.len() == 1 {
        return None;
    }
    Some(ServerError::new(
        format!("{subject} must select only one top level field."),
        Some(operation.pos),
    ))
}

/// Whether a selection at the root of a subscription (through fragments) carries `@skip`
/// or `@include`: whether it runs would depend on variables (graphql-js refuses it too).
fn skips_or_includes(document: &ExecutableDocument, set: &SelectionSet, depth: usize) -> bool {
    if depth > MAX_FRAGMENT_DEPTH {
        return false;
    }
    let conditional = |directives: &[Positioned<async_graphql::parser::types::Directive>]| {
        directives
            .iter()
            .any(|directive| matches!(directive.node.name.node.as_str(), "skip" | "include"))
    };
    set.items.iter().any(|selection| match &selection.node {
        Selection::Field(field) => conditional(&field.node.directives),
        Selection::FragmentSpread(spread) => {
            conditional(&spread.node.directives)
                || document
                    .fragments
                    .get(&spread.node.fragment_name.node)
                    .is_some_and(|fragment| {
                        skips_or_includes(document, &fragment.node.selection_set.node, depth + 1)
                    })
        }
        Selection::InlineFragment(inline) => {
            conditional(&inline.node.directives)
                || skips_or_includes(document, &inline.node.selection_set.node, depth + 1)
        }
    })
}

/// `document` with the root field of its subscription `operation_name` selected as a plain
/// field where it was selected through fragments (on the type `root_type`, with no
/// directive), the fragments only used there dropped; `None` when there is nothing to
/// change (not a subscription, or its root field already plain).
pub fn root_fields_inlined(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    root_type: &str,
) -> Option<ExecutableDocument> {
    let (_, operation) = selected_operation(document, operation_name)?;
    if operation.node.ty != OperationType::Subscription {
        return None;
    }
    let root = &operation.node.selection_set.node;
    let mut fields = Vec::new();
    let inlined = inline(document, root, root_type, 0, &mut fields);
    // async-graphql starts one stream per root field: the same field selected twice
    // (plainly, or once plainly and once through a fragment) would send every event twice.
    let merged = merge_repeated(&mut fields);
    if !inlined && !merged {
        return None;
    }
    let used_before = used_fragments(document);
    let mut inlined = document.clone();
    let operation = match (&mut inlined.operations, operation_name) {
        (DocumentOperations::Single(operation), _) => operation,
        (DocumentOperations::Multiple(operations), Some(name)) => {
            operations.get_mut(&Name::new(name))?
        }
        (DocumentOperations::Multiple(_), None) => return None,
    };
    operation.node.selection_set.node.items = fields;
    // A fragment the root no longer spreads would fail validation as unused.
    let used_after = used_fragments(&inlined);
    inlined
        .fragments
        .retain(|name, _| used_after.contains(name) || !used_before.contains(name));
    Some(inlined)
}

/// Adds the selections of `set` to `out`, those of fragments on `root_type` without
/// directives in their place; whether any fragment was taken apart.
fn inline(
    document: &ExecutableDocument,
    set: &SelectionSet,
    root_type: &str,
    depth: usize,
    out: &mut Vec<Positioned<Selection>>,
) -> bool {
    let mut changed = false;
    for selection in &set.items {
        let inner = match &selection.node {
            Selection::FragmentSpread(spread) if depth < MAX_FRAGMENT_DEPTH => document
                .fragments
                .get(&spread.node.fragment_name.node)
                .filter(|fragment| {
                    spread.node.directives.is_empty()
                        && fragment.node.directives.is_empty()
                        && fragment.node.type_condition.node.on.node == root_type
                })
                .map(|fragment| &fragment.node.selection_set.node),
            Selection::InlineFragment(inline) if depth < MAX_FRAGMENT_DEPTH => Some(inline)
                .filter(|inline| {
                    inline.node.directives.is_empty()
                        && inline
                            .node
                            .type_condition
                            .as_ref()
                            .is_none_or(|condition| condition.node.on.node == root_type)
                })
                .map(|inline| &inline.node.selection_set.node),
            _ => None,
        };
        match inner {
            Some(inner) => {
                inline(document, inner, root_type, depth + 1, out);
                changed = true;
            }
            None => out.push(selection.clone()),
        }
    }
    changed
}

/// Merges fields of `selections` that repeat an earlier one (the same response key, name
/// and arguments) into it, their selections appended to its own; whether any was.
fn merge_repeated(selections: &mut Vec<Positioned<Selection>>) -> bool {
    let mut kept: Vec<Positioned<Selection>> = Vec::with_capacity(selections.len());
    let mut merged = false;
    for selection in selections.drain(..) {
        let Selection::Field(field) = &selection.node else {
            kept.push(selection);
            continue;
        };
        let same = |earlier: &Positioned<Selection>| match &earlier.node {
            Selection::Field(earlier) => {
                earlier.node.response_key().node == field.node.response_key().node
                    && earlier.node.name.node == field.node.name.node
                    && earlier.node.directives.is_empty()
                    && field.node.directives.is_empty()
                    && earlier.node.arguments.len() == field.node.arguments.len()
                    && earlier
                        .node
                        .arguments
                        .iter()
                        .zip(&field.node.arguments)
                        .all(|((name, value), (other_name, other_value))| {
                            name.node == other_name.node && value.node == other_value.node
                        })
            }
            _ => false,
        };
        match kept.iter_mut().find(|earlier| same(earlier)) {
            Some(earlier) => {
                if let Selection::Field(earlier) = &mut earlier.node {
                    let more = field.node.selection_set.node.items.iter().cloned();
                    earlier.node.selection_set.node.items.extend(more);
                    merged = true;
                }
            }
            None => kept.push(selection),
        }
    }
    *selections = kept;
    merged
}

/// The fragments the operations of `document` spread, directly or through others.
fn used_fragments(document: &ExecutableDocument) -> HashSet<Name> {
    let mut used = HashSet::new();
    for (_, operation) in document.operations.iter() {
        spreads(document, &operation.node.selection_set.node, &mut used);
    }
    used
}

/// Adds the fragments `set` spreads, at any depth, to `used`.
fn spreads(document: &ExecutableDocument, set: &SelectionSet, used: &mut HashSet<Name>) {
    for selection in &set.items {
        match &selection.node {
            Selection::Field(field) => spreads(document, &field.node.selection_set.node, used),
            Selection::FragmentSpread(spread) => {
                let name = &spread.node.fragment_name.node;
                if used.insert(name.clone()) {
                    if let Some(fragment) = document.fragments.get(name) {
                        spreads(document, &fragment.node.selection_set.node, used);
                    }
                }
            }
            Selection::InlineFragment(inline) => {
                spreads(document, &inline.node.selection_set.node, used)
            }
        }
    }
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

    #[test]
    fn a_subscription_root_is_never_conditional() {
        for query in [
            "subscription { a @skip(if: true) { b } }",
            "subscription($x: Boolean!) { a @include(if: $x) { b } }",
            "subscription { ... @include(if: false) { a { b } } }",
            "subscription { ...F } fragment F on Subscription { a @skip(if: false) { b } }",
        ] {
            assert!(
                refused(query, None).is_some_and(|message| message.contains("@skip")),
                "{query}"
            );
        }
        assert_eq!(
            refused("subscription { a { b @skip(if: true) } }", None),
            None
        );
    }

    fn inlined(query: &str, name: Option<&str>) -> Option<String> {
        let document = async_graphql::parser::parse_query(query).expect("parses");
        root_fields_inlined(&document, name, "Subscription").map(|document| {
            let (_, operation) = selected_operation(&document, name).expect("operation");
            let root: Vec<String> = operation
                .node
                .selection_set
                .node
                .items
                .iter()
                .map(|selection| match &selection.node {
                    Selection::Field(field) => field.node.name.node.to_string(),
                    _ => "fragment".to_owned(),
                })
                .collect();
            let mut fragments: Vec<String> = document
                .fragments
                .keys()
                .map(|name| name.to_string())
                .collect();
            fragments.sort();
            format!("{} / {}", root.join(" "), fragments.join(" "))
        })
    }

    #[test]
    fn a_root_field_selected_through_fragments_is_selected_plainly() {
        assert_eq!(inlined("subscription { a { b } }", None), None);
        assert_eq!(
            inlined("query { ...F } fragment F on Query { a }", None),
            None
        );
        assert_eq!(
            inlined(
                "subscription { ...F } fragment F on Subscription { a { b } }",
                None
            )
            .as_deref(),
            Some("a / ")
        );
        assert_eq!(
            inlined(
                "subscription { ... on Subscription { ... { a { ...G } } } } fragment G on A { b }",
                None
            )
            .as_deref(),
            Some("a / G"),
            "a fragment used below the root stays"
        );
        // A fragment on another type, or with a directive, is left for validation to judge.
        assert_eq!(
            inlined("subscription { ...F } fragment F on Query { a }", None),
            None
        );
        // A field selected again, plainly or through a fragment, is selected once.
        assert_eq!(
            inlined(
                "subscription { a { x } ...F } fragment F on Subscription { a { y } }",
                None
            )
            .as_deref(),
            Some("a / ")
        );
        assert_eq!(
            inlined("subscription { a { x } a { y } }", None).as_deref(),
            Some("a / ")
        );
        assert_eq!(
            inlined("subscription { a(n: 1) { x } a(n: 2) { y } }", None).as_deref(),
            None,
            "arguments that differ are validation's to refuse"
        );
        // The fragment another operation of the document uses stays.
        assert_eq!(
            inlined(
                "subscription S { ...F } query Q { x { ...F } } fragment F on Subscription { a }",
                Some("S")
            )
            .as_deref(),
            Some("a / F")
        );
    }
}
