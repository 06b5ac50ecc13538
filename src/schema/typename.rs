//! `__typename` held to the rules every other field is held to. async-graphql's validation
//! passes over a `__typename` field altogether: it ran `{ __typename(x: 1) { y } }`,
//! `{ __typename @foo }` and `{ __typename @skip(if: "yes") }`, and refused a valid
//! `query($s: Boolean!) { __typename @include(if: $s) }` for not using `$s`. Before the
//! document is validated, an argument or a selection on `__typename` is refused, as the
//! spec's validation refuses it, and a `__typename` carrying directives is run as an inline
//! fragment carrying them (`... @include(if: $s) { __typename }`, the same result), which
//! validation does check: the directive known and its argument of the right type, its
//! variable defined and used. A directive the schema knows but not on fields is refused
//! first, as a field's, so that the message names the field's location, not the fragment's.

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, InlineFragment, Selection, SelectionSet,
};
use async_graphql::registry::{__DirectiveLocation, Registry};
use async_graphql::{Positioned, ServerError, ServerResult};

/// Refuses an argument or a selection on `__typename` anywhere in `document`, or a
/// directive of `registry` that does not go on fields, and turns each `__typename`
/// carrying directives into an inline fragment carrying them.
pub fn hold_to_the_rules(
    document: &mut ExecutableDocument,
    registry: &Registry,
) -> ServerResult<()> {
    match &mut document.operations {
        DocumentOperations::Single(operation) => {
            in_set(&mut operation.node.selection_set.node, registry)?;
        }
        DocumentOperations::Multiple(operations) => {
            for operation in operations.values_mut() {
                in_set(&mut operation.node.selection_set.node, registry)?;
            }
        }
    }
    for fragment in document.fragments.values_mut() {
        in_set(&mut fragment.node.selection_set.node, registry)?;
    }
    Ok(())
}

fn in_set(set: &mut SelectionSet, registry: &Registry) -> ServerResult<()> {
    for selection in &mut set.items {
        let pos = selection.pos;
        match &mut selection.node {
            Selection::Field(field) if field.node.name.node == "__typename" => {
                if let Some((name, _)) = field.node.arguments.first() {
                    return Err(ServerError::new(
                        format!(r#"Unknown argument "{}" on field "__typename"."#, name.node),
                        Some(name.pos),
                    ));
                }
                if !field.node.selection_set.node.items.is_empty() {
                    return Err(ServerError::new(
                        r#"Field "__typename" must not have a selection since type "String!" has no subfields."#,
                        Some(field.pos),
                    ));
                }
                if field.node.directives.is_empty() {
                    continue;
                }
                let misplaced = field.node.directives.iter().find(|directive| {
                    registry
                        .directives
                        .get(directive.node.name.node.as_str())
                        .is_some_and(|known| !known.locations.contains(&__DirectiveLocation::FIELD))
                });
                if let Some(directive) = misplaced {
                    return Err(ServerError::new(
                        format!(
                            r#"Directive "{}" may not be used on "FIELD""#,
                            directive.node.name.node
                        ),
                        Some(directive.pos),
                    ));
                }
                let directives = std::mem::take(&mut field.node.directives);
                let plain = Positioned::new(Selection::Field(field.clone()), pos);
                selection.node = Selection::InlineFragment(Positioned::new(
                    InlineFragment {
                        type_condition: None,
                        directives,
                        selection_set: Positioned::new(SelectionSet { items: vec![plain] }, pos),
                    },
                    pos,
                ));
            }
            Selection::Field(field) => in_set(&mut field.node.selection_set.node, registry)?,
            Selection::InlineFragment(inline) => {
                in_set(&mut inline.node.selection_set.node, registry)?;
            }
            Selection::FragmentSpread(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::registry::MetaDirective;

    fn directive(name: &str, location: __DirectiveLocation) -> MetaDirective {
        MetaDirective {
            name: name.to_owned(),
            description: None,
            locations: vec![location],
            args: Default::default(),
            is_repeatable: false,
            visible: None,
            composable: None,
        }
    }

    fn held(query: &str) -> Result<String, String> {
        let mut document = async_graphql::parser::parse_query(query).expect("a document");
        let mut registry = Registry::default();
        registry.add_directive(directive(
            "deprecated",
            __DirectiveLocation::FIELD_DEFINITION,
        ));
        registry.add_directive(directive("include", __DirectiveLocation::FIELD));
        hold_to_the_rules(&mut document, &registry)
            .map(|()| format!("{document:?}"))
            .map_err(|err| err.message)
    }

    #[test]
    fn arguments_and_selections_are_refused_and_directives_move_to_a_fragment() {
        assert_eq!(
            held("{ a { __typename(x: 1) } }"),
            Err(r#"Unknown argument "x" on field "__typename"."#.to_owned())
        );
        assert!(held("{ ... on Query { __typename { y } } }")
            .is_err_and(|message| message.contains("must not have a selection")));
        let moved = held("query($s: Boolean!) { t: __typename @include(if: $s) }").expect("valid");
        assert!(moved.contains("InlineFragment"), "{moved}");
        assert_eq!(
            held("{ __typename @deprecated }"),
            Err(r#"Directive "deprecated" may not be used on "FIELD""#.to_owned()),
            "a known directive that does not go on fields is refused as a field's"
        );
        let unknown = held("{ __typename @nothing }").expect("left to validation");
        assert!(unknown.contains("InlineFragment"), "{unknown}");
        let plain = held("{ __typename }").expect("valid");
        assert!(!plain.contains("InlineFragment"), "{plain}");
    }
}
