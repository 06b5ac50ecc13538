//! Response fields in the order the operation asks for them (GraphQL spec 7.2.2,
//! "Serialized Map Ordering"): async-graphql 7 adds each object's fields as their resolvers
//! finish, so `{ role tenant { name } expiresAt }` came back in either order from one
//! request to the next. Each object is put back in the order of its selections, fragments
//! expanded where they stand and what `@skip` and `@include` leave out taking no place,
//! before the response leaves, on every transport.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery,
};
use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, FragmentDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Positioned, Response, ServerResult, Value, Variables};

use super::conditions::{has_conditions, remove_skipped};
use super::documents::ParsedDocument;

/// The schema extension that puts every response's fields in the document's order.
pub struct FieldOrder;

impl ExtensionFactory for FieldOrder {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(InOrder::default())
    }
}

/// One request's half of [`FieldOrder`]: the document it runs. (A subscription's events
/// do not pass through `execute`; async-graphql resolves them in order.)
#[derive(Default)]
struct InOrder {
    document: Mutex<Option<Arc<ExecutableDocument>>>,
}

#[async_graphql::async_trait::async_trait]
impl Extension for InOrder {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let document = next.run(ctx, query, variables).await?;
        // The cache's copy when there is one (a document kept by its text is the one
        // parsed), else a copy of this one; with what `@skip` and `@include` leave out
        // taken out, as the executor takes it out.
        let shared = ctx
            .data_opt::<ParsedDocument>()
            .map(|parsed| parsed.0.clone())
            .unwrap_or_else(|| Arc::new(document.clone()));
        let shared = if has_conditions(&shared) {
            let mut pruned = ExecutableDocument::clone(&shared);
            remove_skipped(&mut pruned, variables);
            Arc::new(pruned)
        } else {
            shared
        };
        *self.document.lock().unwrap_or_else(PoisonError::into_inner) = Some(shared);
        Ok(document)
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let mut response = next.run(ctx, operation_name).await;
        let document = self
            .document
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(document) = document {
            put_in_order(&mut response.data, &document, operation_name);
        }
        response
    }
}

/// The fragments of a document, by name.
pub(super) type Fragments = HashMap<Name, Positioned<FragmentDefinition>>;

/// `data`, the result of the operation named `operation_name` (or the only one) of
/// `document`, with every object's fields in the order the operation selects them.
pub fn put_in_order(data: &mut Value, document: &ExecutableDocument, operation_name: Option<&str>) {
    let operation = match (&document.operations, operation_name) {
        (DocumentOperations::Single(operation), _) => Some(operation),
        (DocumentOperations::Multiple(operations), Some(name)) => operations.get(name),
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => {
            operations.values().next()
        }
        (DocumentOperations::Multiple(_), None) => None,
    };
    if let Some(operation) = operation {
        order_all(
            vec![data],
            &[&operation.node.selection_set.node],
            &document.fragments,
        );
    }
}

/// Puts the objects among `values` (in lists at any depth), all results of the same
/// selection sets `sets`, in their order, then each field's values likewise: one
/// collection of the fields for every object a list holds.
fn order_all(values: Vec<&mut Value>, sets: &[&SelectionSet], fragments: &Fragments) {
    let mut objects = objects_among(values);
    if objects.is_empty() {
        return;
    }
    let fields = collect_fields(sets, fragments);
    let place: HashMap<&str, usize> = fields
        .iter()
        .enumerate()
        .map(|(at, (key, _))| (key.as_str(), at))
        .collect();
    let place_of = |key: &Name| place.get(key.as_str()).copied().unwrap_or(usize::MAX);
    for object in &mut objects {
        if !in_order(object, &place_of) {
            object.sort_by(|a, _, b, _| place_of(a).cmp(&place_of(b)));
        }
    }
    for (key, subsets) in &fields {
        if subsets.is_empty() {
            continue;
        }
        let children: Vec<&mut Value> = objects
            .iter_mut()
            .filter_map(|object| object.get_mut(key.as_str()))
            .collect();
        order_all(children, subsets, fragments);
    }
}

/// The objects among `values`, in lists at any depth (the rest, scalars and nulls, has no
/// fields).
pub(super) fn objects_among(values: Vec<&mut Value>) -> Vec<&mut IndexMap<Name, Value>> {
    let mut objects = Vec::new();
    let mut pending = values;
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(object) => objects.push(object),
            Value::List(items) => pending.extend(items.iter_mut()),
            _ => {}
        }
    }
    objects
}

/// Whether `object`'s keys already follow their places.
fn in_order(object: &IndexMap<Name, Value>, place_of: &impl Fn(&Name) -> usize) -> bool {
    let mut last = 0;
    object.keys().all(|key| {
        let place = place_of(key);
        let follows = place >= last;
        last = place;
        follows
    })
}

/// The response keys `sets` select, in order (CollectFields: each key where it first
/// appears, fragments expanded in place), each with the selection sets of its fields.
/// Each fragment is expanded once, so a document spreading one many times (or, before
/// validation refused it, in a cycle) costs its size, not its expansion.
pub(super) fn collect_fields<'a>(
    sets: &[&'a SelectionSet],
    fragments: &'a Fragments,
) -> Vec<(&'a Name, Vec<&'a SelectionSet>)> {
    let mut collected = Collected {
        fields: Vec::new(),
        index: HashMap::new(),
        spread: HashSet::new(),
    };
    for set in sets {
        collected.add(set, fragments);
    }
    collected.fields
}

/// What [`collect_fields`] has gathered so far.
struct Collected<'a> {
    fields: Vec<(&'a Name, Vec<&'a SelectionSet>)>,
    index: HashMap<&'a str, usize>,
    spread: HashSet<&'a str>,
}

impl<'a> Collected<'a> {
    fn add(&mut self, set: &'a SelectionSet, fragments: &'a Fragments) {
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) => {
                    let key = &field.node.response_key().node;
                    let at = match self.index.get(key.as_str()) {
                        Some(at) => *at,
                        None => {
                            self.fields.push((key, Vec::new()));
                            self.index.insert(key.as_str(), self.fields.len() - 1);
                            self.fields.len() - 1
                        }
                    };
                    let subset = &field.node.selection_set.node;
                    let subsets = &mut self.fields[at].1;
                    if !subset.items.is_empty() && !subsets.iter().any(|s| std::ptr::eq(*s, subset))
                    {
                        subsets.push(subset);
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let name = &spread.node.fragment_name.node;
                    if self.spread.insert(name.as_str()) {
                        if let Some(fragment) = fragments.get(name) {
                            self.add(&fragment.node.selection_set.node, fragments);
                        }
                    }
                }
                Selection::InlineFragment(inline) => {
                    self.add(&inline.node.selection_set.node, fragments);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(query: &str, data: serde_json::Value) -> String {
        let document = async_graphql::parser::parse_query(query).expect("a document");
        let mut data = Value::from_json(data).expect("a value");
        put_in_order(&mut data, &document, None);
        serde_json::to_string(&data).expect("JSON")
    }

    #[test]
    fn objects_follow_their_selections_at_every_depth() {
        assert_eq!(
            ordered(
                "{ key { role tenant { name id } expiresAt } list { b a } }",
                serde_json::json!({
                    "list": [{ "a": 1, "b": 2 }, { "b": 3, "a": 4 }],
                    "key": { "expiresAt": null, "tenant": { "id": "t", "name": "n" }, "role": "R" }
                })
            ),
            r#"{"key":{"role":"R","tenant":{"name":"n","id":"t"},"expiresAt":null},"list":[{"b":2,"a":1},{"b":3,"a":4}]}"#
        );
    }

    #[test]
    fn what_skip_and_include_leave_out_takes_no_place() {
        let query = "query($no: Boolean!) { ... @skip(if: true) { b } c @include(if: $no) a b c }";
        let mut document = async_graphql::parser::parse_query(query).expect("a document");
        let variables = Variables::from_json(serde_json::json!({ "no": false }));
        assert!(has_conditions(&document));
        remove_skipped(&mut document, &variables);
        let mut data =
            Value::from_json(serde_json::json!({ "b": 2, "c": 3, "a": 1 })).expect("a value");
        put_in_order(&mut data, &document, None);
        assert_eq!(
            serde_json::to_string(&data).expect("JSON"),
            r#"{"a":1,"b":2,"c":3}"#
        );
    }

    #[test]
    fn fragments_and_aliases_take_the_place_they_are_written_in() {
        let query = "query Q { ...F c: x ... on Query { d } a } fragment F on Query { b ...F }";
        assert_eq!(
            ordered(query, serde_json::json!({ "a": 1, "d": 2, "c": 3, "b": 4 })),
            r#"{"b":4,"c":3,"d":2,"a":1}"#
        );
    }
}
