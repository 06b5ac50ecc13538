//! An object whose every selection `@skip` or `@include` leaves out is `{}` (GraphQL spec
//! 6.3, "Executing Selection Sets": the fields collected are none, the result an empty map),
//! not `null`. async-graphql answers an empty selection with `null`, non-null types
//! included: `createTenant(...) { ... @include(if: $full) { id } }` with `full: false`
//! answered `{"createTenant": null}` for the tenant it had just created, and an existing
//! endpoint read as missing. Before the document runs, each such selection set gets one
//! `__typename` under an alias the document does not use, so that the executor makes the
//! object; the alias is taken out of the objects those sets made, in every response and
//! every subscription event (never out of a JSON value, nor out of a field of the client's).

use std::collections::HashMap;

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Field, FragmentDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Pos, Positioned, Value, Variables};

use super::conditions::{has_conditions, included};
use super::field_order::{collect_fields, objects_among, Fragments};

/// The alias of the `__typename` that holds an emptied object's place (with a number
/// after it should the document use it already): never in a response.
const PLACEHOLDER: &str = "_courierEmptySelection";

/// A document that got placeholders, under `alias`.
pub struct Placed {
    document: ExecutableDocument,
    alias: Name,
}

/// Places placeholders in `document` (of text `query`) where `@skip` and `@include` leave a
/// selection set empty, given `variables`: what to take out of its results, if any.
pub fn place(
    document: &mut ExecutableDocument,
    query: &str,
    variables: &Variables,
) -> Option<Placed> {
    if !has_conditions(document) {
        return None;
    }
    let alias = unused_alias(query);
    place_placeholders(document, variables, &alias).then(|| Placed {
        document: document.clone(),
        alias,
    })
}

impl Placed {
    /// Takes the placeholders out of `data`, the result of the operation named
    /// `operation_name` (or of every operation, for a subscription's event).
    pub fn remove_from(&self, data: &mut Value, operation_name: Option<&str>) {
        let sets: Vec<&SelectionSet> = self
            .document
            .operations
            .iter()
            .filter(|(name, _)| {
                operation_name.is_none() || name.map(|name| name.as_str()) == operation_name
            })
            .map(|(_, operation)| &operation.node.selection_set.node)
            .collect();
        remove_placeholders(vec![data], &sets, &self.document.fragments, &self.alias);
    }
}

/// [`PLACEHOLDER`], or, if `query` holds it, it with the first number after it that
/// `query` does not hold: never a name the client chose.
fn unused_alias(query: &str) -> Name {
    if !query.contains(PLACEHOLDER) {
        return Name::new(PLACEHOLDER);
    }
    let unused = (1u64..)
        .map(|n| format!("{PLACEHOLDER}{n}"))
        .find(|alias| !query.contains(alias.as_str()))
        .unwrap_or_else(|| PLACEHOLDER.to_owned());
    Name::new(unused)
}

/// Gives every field's selection set that `@skip` and `@include` leave empty (given
/// `variables`) a placeholder; whether any got one. The root's is left alone (an empty
/// `data` is made `{}` with the field errors' nulls, see [`super::nulls`]).
fn place_placeholders(
    document: &mut ExecutableDocument,
    variables: &Variables,
    alias: &Name,
) -> bool {
    let mut emptied = Emptied {
        fragments: &document.fragments,
        variables,
        known: HashMap::new(),
    };
    for name in document.fragments.keys() {
        emptied.fragment(name);
    }
    let empty_fragments = emptied.known;
    let mut placed = false;
    let mut place = |set: &mut SelectionSet| {
        placed |= place_in(set, &empty_fragments, variables, alias);
    };
    match &mut document.operations {
        DocumentOperations::Single(operation) => place(&mut operation.node.selection_set.node),
        DocumentOperations::Multiple(operations) => {
            for operation in operations.values_mut() {
                place(&mut operation.node.selection_set.node);
            }
        }
    }
    for fragment in document.fragments.values_mut() {
        place(&mut fragment.node.selection_set.node);
    }
    placed
}

/// Places placeholders in the fields of `set` and below (`set` itself excepted).
fn place_in(
    set: &mut SelectionSet,
    empty_fragments: &HashMap<Name, bool>,
    variables: &Variables,
    alias: &Name,
) -> bool {
    let mut placed = false;
    for selection in &mut set.items {
        match &mut selection.node {
            Selection::Field(field) => {
                let subset = &mut field.node.selection_set;
                if subset.node.items.is_empty() {
                    continue;
                }
                if left_empty(&subset.node, empty_fragments, variables) {
                    subset.node.items.push(placeholder(subset.pos, alias));
                    placed = true;
                } else {
                    placed |= place_in(&mut subset.node, empty_fragments, variables, alias);
                }
            }
            Selection::InlineFragment(inline) => {
                let inner = &mut inline.node.selection_set.node;
                placed |= place_in(inner, empty_fragments, variables, alias);
            }
            Selection::FragmentSpread(_) => {}
        }
    }
    placed
}

/// Whether `@skip` and `@include` leave out every field `set` selects, fragments expanded
/// (whether each fragment's own set is left empty is in `empty_fragments`).
fn left_empty(
    set: &SelectionSet,
    empty_fragments: &HashMap<Name, bool>,
    variables: &Variables,
) -> bool {
    set.items.iter().all(|selection| {
        !included(selection.node.directives(), variables)
            || match &selection.node {
                Selection::Field(_) => false,
                Selection::InlineFragment(inline) => {
                    left_empty(&inline.node.selection_set.node, empty_fragments, variables)
                }
                Selection::FragmentSpread(spread) => empty_fragments
                    .get(&spread.node.fragment_name.node)
                    .copied()
                    .unwrap_or(false),
            }
    })
}

/// Works out, once per fragment, whether `@skip` and `@include` leave its selection empty.
struct Emptied<'a> {
    fragments: &'a HashMap<Name, Positioned<FragmentDefinition>>,
    variables: &'a Variables,
    /// Fragments worked out so far (and, as not empty, those being worked out: a cycle,
    /// which validation refuses, ends there).
    known: HashMap<Name, bool>,
}

impl Emptied<'_> {
    fn fragment(&mut self, name: &Name) -> bool {
        if let Some(known) = self.known.get(name) {
            return *known;
        }
        let Some(fragment) = self.fragments.get(name) else {
            return false;
        };
        self.known.insert(name.clone(), false);
        let empty = self.set(&fragment.node.selection_set.node);
        self.known.insert(name.clone(), empty);
        empty
    }

    fn set(&mut self, set: &SelectionSet) -> bool {
        set.items.iter().all(|selection| {
            !included(selection.node.directives(), self.variables)
                || match &selection.node {
                    Selection::Field(_) => false,
                    Selection::InlineFragment(inline) => self.set(&inline.node.selection_set.node),
                    Selection::FragmentSpread(spread) => {
                        self.fragment(&spread.node.fragment_name.node)
                    }
                }
        })
    }
}

/// `__typename` aliased `alias`, at `pos`.
fn placeholder(pos: Pos, alias: &Name) -> Positioned<Selection> {
    Positioned::new(
        Selection::Field(Positioned::new(
            Field {
                alias: Some(Positioned::new(alias.clone(), pos)),
                name: Positioned::new(Name::new("__typename"), pos),
                arguments: Vec::new(),
                directives: Vec::new(),
                selection_set: Positioned::new(SelectionSet::default(), pos),
            },
            pos,
        )),
        pos,
    )
}

/// Takes the placeholder `alias` out of the objects among `values` (in lists at any depth)
/// whose selection sets `sets` hold it, then out of their fields' values likewise: only
/// where a set got one, never into a value without a selection (a JSON payload).
fn remove_placeholders(
    values: Vec<&mut Value>,
    sets: &[&SelectionSet],
    fragments: &Fragments,
    alias: &Name,
) {
    let mut objects = objects_among(values);
    if objects.is_empty() {
        return;
    }
    for (key, subsets) in collect_fields(sets, fragments) {
        if key == alias {
            for object in &mut objects {
                object.shift_remove(alias);
            }
        } else if !subsets.is_empty() {
            let children = objects
                .iter_mut()
                .filter_map(|object| object.get_mut(key.as_str()))
                .collect();
            remove_placeholders(children, &subsets, fragments, alias);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(query: &str, variables: serde_json::Value) -> Option<ExecutableDocument> {
        let mut document = async_graphql::parser::parse_query(query).expect("a document");
        let variables = Variables::from_json(variables);
        place_placeholders(&mut document, &variables, &unused_alias(query)).then_some(document)
    }

    #[test]
    fn only_a_set_left_empty_gets_a_placeholder() {
        assert!(placed("{ a { b @skip(if: true) } }", serde_json::json!({})).is_some());
        assert!(placed("{ a { b @skip(if: false) } }", serde_json::json!({})).is_none());
        assert!(placed("{ a { b @skip(if: true) c } }", serde_json::json!({})).is_none());
        assert!(placed(
            "query($f: Boolean!) { a { ... @include(if: $f) { b } } }",
            serde_json::json!({ "f": false })
        )
        .is_some());
        assert!(placed(
            "query($f: Boolean!) { a { ... @include(if: $f) { b } } }",
            serde_json::json!({ "f": true })
        )
        .is_none());
        // Through fragments, at any depth, and fragments in a cycle (refused later) end.
        assert!(placed(
            "{ a { ...F } } fragment F on A { ...G } fragment G on A { b @skip(if: true) }",
            serde_json::json!({})
        )
        .is_some());
        assert!(placed(
            "{ a { ...F } } fragment F on A { ...G } fragment G on A { ...F }",
            serde_json::json!({})
        )
        .is_none());
        // The root's set is left alone.
        assert!(placed("{ a @skip(if: true) }", serde_json::json!({})).is_none());
    }

    #[test]
    fn the_alias_is_one_the_document_does_not_use() {
        assert_eq!(unused_alias("{ a }").as_str(), PLACEHOLDER);
        let taken = format!("{{ {PLACEHOLDER}: a {PLACEHOLDER}1: b }}");
        assert_eq!(unused_alias(&taken).as_str(), format!("{PLACEHOLDER}2"));
    }

    #[test]
    fn placeholders_leave_only_the_objects_whose_sets_got_them() {
        let query = "{ a { b @skip(if: true) } l { x payload } }";
        let document = placed(query, serde_json::json!({})).expect("placed");
        let alias = unused_alias(query);
        // `payload` is a value without a selection (JSON): its members are its own.
        let mut data = Value::from_json(serde_json::json!({
            "a": { PLACEHOLDER: "A" },
            "l": [{ "x": 1, "payload": { PLACEHOLDER: "kept" } }]
        }))
        .expect("a value");
        let DocumentOperations::Single(operation) = &document.operations else {
            panic!("one operation");
        };
        let sets = [&operation.node.selection_set.node];
        remove_placeholders(vec![&mut data], &sets, &document.fragments, &alias);
        assert_eq!(
            data.into_json().expect("JSON"),
            serde_json::json!({ "a": {}, "l": [{ "x": 1, "payload": { PLACEHOLDER: "kept" } }] })
        );
    }
}
