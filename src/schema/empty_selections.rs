//! An object whose every selection `@skip` or `@include` leaves out is `{}` (GraphQL spec
//! 6.3, "Executing Selection Sets": the fields collected are none, the result an empty map),
//! not `null`. async-graphql answers an empty selection with `null`, non-null types
//! included: `createTenant(...) { ... @include(if: $full) { id } }` with `full: false`
//! answered `{"createTenant": null}` for the tenant it had just created, and an existing
//! endpoint read as missing. Before the document runs, each such selection set gets one
//! `__typename` under a reserved alias, so that the executor makes the object; the alias
//! is taken out of every response and every subscription event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextSubscribe,
};
use async_graphql::futures_util::stream::{BoxStream, StreamExt};
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Field, FragmentDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Pos, Positioned, Response, ServerResult, Value, Variables};

use super::conditions::{has_conditions, included};

/// The alias of the `__typename` that holds an emptied object's place: never in a response.
pub const PLACEHOLDER: &str = "_courierEmptySelection";

/// The schema extension that answers an object with every selection left out as `{}`.
pub struct EmptySelections;

impl ExtensionFactory for EmptySelections {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Placeholders::default())
    }
}

/// One request's half of [`EmptySelections`]: whether its document got placeholders.
/// (Shared with the stream of a subscription's events, which outlives the borrow.)
#[derive(Default)]
struct Placeholders {
    placed: Arc<AtomicBool>,
}

#[async_graphql::async_trait::async_trait]
impl Extension for Placeholders {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let mut document = next.run(ctx, query, variables).await?;
        if has_conditions(&document) && place_placeholders(&mut document, variables) {
            self.placed.store(true, Ordering::Relaxed);
        }
        Ok(document)
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let mut response = next.run(ctx, operation_name).await;
        if self.placed.load(Ordering::Relaxed) {
            remove_placeholders(&mut response.data);
        }
        response
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let placed = self.placed.clone();
        let events = stream.map(move |mut response| {
            if placed.load(Ordering::Relaxed) {
                remove_placeholders(&mut response.data);
            }
            response
        });
        next.run(ctx, events.boxed())
    }
}

/// Gives every field's selection set that `@skip` and `@include` leave empty (given
/// `variables`) a placeholder; whether any got one. The root's is left alone (an empty
/// `data` is made `{}` with the field errors' nulls, see [`super::nulls`]).
fn place_placeholders(document: &mut ExecutableDocument, variables: &Variables) -> bool {
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
        placed |= place_in(set, &empty_fragments, variables);
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
                    subset.node.items.push(placeholder(subset.pos));
                    placed = true;
                } else {
                    placed |= place_in(&mut subset.node, empty_fragments, variables);
                }
            }
            Selection::InlineFragment(inline) => {
                placed |= place_in(
                    &mut inline.node.selection_set.node,
                    empty_fragments,
                    variables,
                );
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

/// `__typename` aliased [`PLACEHOLDER`], at `pos`.
fn placeholder(pos: Pos) -> Positioned<Selection> {
    Positioned::new(
        Selection::Field(Positioned::new(
            Field {
                alias: Some(Positioned::new(Name::new(PLACEHOLDER), pos)),
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

/// Takes every [`PLACEHOLDER`] out of `data`, at any depth.
fn remove_placeholders(data: &mut Value) {
    match data {
        Value::Object(object) => {
            object.shift_remove(PLACEHOLDER);
            object.values_mut().for_each(remove_placeholders);
        }
        Value::List(items) => items.iter_mut().for_each(remove_placeholders),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(query: &str, variables: serde_json::Value) -> Option<String> {
        let mut document = async_graphql::parser::parse_query(query).expect("a document");
        let variables = Variables::from_json(variables);
        place_placeholders(&mut document, &variables).then(|| format!("{document:?}"))
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
    fn placeholders_leave_the_response() {
        let mut data = Value::from_json(serde_json::json!({
            "a": { PLACEHOLDER: "A" },
            "l": [{ "x": 1, PLACEHOLDER: "B" }, { "y": { PLACEHOLDER: "C" } }]
        }))
        .expect("a value");
        remove_placeholders(&mut data);
        assert_eq!(
            data.into_json().expect("JSON"),
            serde_json::json!({ "a": {}, "l": [{ "x": 1 }, { "y": {} }] })
        );
    }
}
