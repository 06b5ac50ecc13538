//! `__typename` held to the rules every other field is held to. async-graphql's validation
//! passes over a `__typename` field altogether: it ran `{ __typename(x: 1) { y } }`,
//! `{ __typename @foo }` and `{ __typename @skip(if: "yes") }`, and refused a valid
//! `query($s: Boolean!) { __typename @include(if: $s) }` for not using `$s`. Before the
//! document is validated, an argument or a selection on `__typename` is refused, as the
//! spec's validation refuses it, and a `__typename` carrying directives is run as an inline
//! fragment carrying them (`... @include(if: $s) { __typename }`, the same result), which
//! validation does check: the directive known and its argument of the right type, its
//! variable defined and used.

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, InlineFragment, Selection, SelectionSet,
};
use async_graphql::{Positioned, ServerError, ServerResult};

/// Refuses an argument or a selection on `__typename` anywhere in `document`, and turns
/// each `__typename` carrying directives into an inline fragment carrying them.
pub fn hold_to_the_rules(document: &mut ExecutableDocument) -> ServerResult<()> {
    match &mut document.operations {
        DocumentOperations::Single(operation) => in_set(&mut operation.node.selection_set.node)?,
        DocumentOperations::Multiple(operations) => {
            for operation in operations.values_mut() {
                in_set(&mut operation.node.selection_set.node)?;
            }
        }
    }
    for fragment in document.fragments.values_mut() {
        in_set(&mut fragment.node.selection_set.node)?;
    }
    Ok(())
}

fn in_set(set: &mut SelectionSet) -> ServerResult<()> {
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
            Selection::Field(field) => in_set(&mut field.node.selection_set.node)?,
            Selection::InlineFragment(inline) => in_set(&mut inline.node.selection_set.node)?,
            Selection::FragmentSpread(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(query: &str) -> Result<String, String> {
        let mut document = async_graphql::parser::parse_query(query).expect("a document");
        hold_to_the_rules(&mut document)
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
        let plain = held("{ __typename }").expect("valid");
        assert!(!plain.contains("InlineFragment"), "{plain}");
    }
}
