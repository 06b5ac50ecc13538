//! Argument values that would fail to coerce once the operation ran, refused before
//! anything runs, as request errors (no `data`; `400` in `application/graphql-response+json`),
//! the way GraphQL coerces arguments and variables before execution.
//!
//! async-graphql's validation accepts any integer for `Int` and any value for `DateTime`,
//! and refuses the value only when a resolver reads it: a field error after other fields
//! (and, in a mutation, other mutations) may have run.

use async_graphql::parser::types::{
    ExecutableDocument, OperationType, Selection, SelectionSet, VariableDefinition,
};
use async_graphql::parser::Positioned;
use async_graphql::registry::{MetaInputValue, MetaType, MetaTypeName, Registry};
use async_graphql::{
    Name, Pos, Request, ServerError, ServerResult, Value as ConstValue, Variables,
};
use chrono::{DateTime, Utc};

use super::limits::MAX_FRAGMENT_DEPTH;
use super::single_root::selected_operation;

/// Refuses `request` if an argument of the operation it runs, given literally or through
/// a variable, holds an `Int` outside 32 bits or a `DateTime` that is not an RFC 3339
/// date and time. Arguments of fields the schema does not have are left to validation.
pub fn check_arguments(registry: &Registry, request: &mut Request) -> ServerResult<()> {
    let variables = std::mem::take(&mut request.variables);
    let operation_name = request.operation_name.clone();
    let checked = request.parsed_query().map(|document| {
        let Some((_, operation)) = selected_operation(document, operation_name.as_deref()) else {
            return Ok(());
        };
        let root = match operation.node.ty {
            OperationType::Query => Some(registry.query_type.as_str()),
            OperationType::Mutation => registry.mutation_type.as_deref(),
            OperationType::Subscription => registry.subscription_type.as_deref(),
        };
        let Some(root) = root else {
            return Ok(());
        };
        let walk = Walk {
            registry,
            document,
            variables: &variables,
            definitions: &operation.node.variable_definitions,
        };
        walk.selection_set(root, &operation.node.selection_set.node, 0)
    });
    request.variables = variables;
    checked?
}

/// What a walk over one operation's selections reads.
struct Walk<'a> {
    registry: &'a Registry,
    document: &'a ExecutableDocument,
    variables: &'a Variables,
    definitions: &'a [Positioned<VariableDefinition>],
}

impl Walk<'_> {
    /// Checks the arguments of every field `set` selects on `parent`, fragments included.
    fn selection_set(&self, parent: &str, set: &SelectionSet, depth: usize) -> ServerResult<()> {
        if depth > MAX_FRAGMENT_DEPTH {
            return Ok(());
        }
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) => {
                    let Some(meta) = self
                        .registry
                        .types
                        .get(parent)
                        .and_then(|ty| ty.field_by_name(&field.node.name.node))
                    else {
                        continue;
                    };
                    for (name, value) in &field.node.arguments {
                        let Some(argument) = meta.args.get(name.node.as_str()) else {
                            continue;
                        };
                        // A variable neither given nor defaulted is the executor's to
                        // refuse, if it is required.
                        if let Ok(given) = value
                            .node
                            .clone()
                            .into_const_with(|name| self.variable(&name))
                        {
                            self.argument(argument, &given, value.pos)?;
                        }
                    }
                    let child = MetaTypeName::concrete_typename(&meta.ty);
                    self.selection_set(child, &field.node.selection_set.node, depth + 1)?;
                }
                Selection::FragmentSpread(spread) => {
                    let name = &spread.node.fragment_name.node;
                    if let Some(fragment) = self.document.fragments.get(name) {
                        let on = fragment.node.type_condition.node.on.node.as_str();
                        self.selection_set(on, &fragment.node.selection_set.node, depth + 1)?;
                    }
                }
                Selection::InlineFragment(inline) => {
                    let on = inline
                        .node
                        .type_condition
                        .as_ref()
                        .map_or(parent, |condition| condition.node.on.node.as_str());
                    self.selection_set(on, &inline.node.selection_set.node, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Checks `value`, given to `argument` at `pos` (its variables read).
    fn argument(
        &self,
        argument: &MetaInputValue,
        value: &ConstValue,
        pos: Pos,
    ) -> ServerResult<()> {
        check_value(self.registry, &argument.ty, value).map_err(|(path, problem)| {
            ServerError::new(format!("{}{path}: {problem}", argument.name), Some(pos))
        })
    }

    /// The value of variable `name`: given, or its definition's default.
    fn variable(&self, name: &Name) -> Result<ConstValue, ()> {
        if let Some(value) = self.variables.get(name) {
            return Ok(value.clone());
        }
        self.definitions
            .iter()
            .find(|definition| &definition.node.name.node == name)
            .and_then(|definition| definition.node.default_value.as_ref())
            .map(|default| default.node.clone())
            .ok_or(())
    }
}

/// Where in `value` (`.field` and `[index]` steps) and why it cannot be coerced to `ty` (a
/// type as the registry spells it), as far as `Int` ranges and `DateTime`s go; every
/// other rule is validation's.
fn check_value(registry: &Registry, ty: &str, value: &ConstValue) -> Result<(), (String, String)> {
    match MetaTypeName::create(ty) {
        MetaTypeName::NonNull(inner) => check_value(registry, inner, value),
        MetaTypeName::List(item) => match value {
            ConstValue::List(items) => items.iter().enumerate().try_for_each(|(index, value)| {
                check_value(registry, item, value)
                    .map_err(|(path, problem)| (format!("[{index}]{path}"), problem))
            }),
            // A single value stands for a list of one.
            value => check_value(registry, item, value),
        },
        MetaTypeName::Named(name) => match (registry.types.get(name), value) {
            (Some(MetaType::InputObject { input_fields, .. }), ConstValue::Object(fields)) => {
                fields.iter().try_for_each(|(field, value)| {
                    match input_fields.get(field.as_str()) {
                        Some(meta) => check_value(registry, &meta.ty, value)
                            .map_err(|(path, problem)| (format!(".{field}{path}"), problem)),
                        None => Ok(()),
                    }
                })
            }
            (Some(MetaType::Scalar { .. }), ConstValue::Number(number)) if name == "Int" => {
                match number.as_i64().map(i32::try_from) {
                    Some(Ok(_)) => Ok(()),
                    _ => Err((
                        String::new(),
                        format!("{number} is not an Int (a 32-bit integer)"),
                    )),
                }
            }
            (Some(MetaType::Scalar { .. }), value) if name == "DateTime" => match value {
                ConstValue::Null => Ok(()),
                ConstValue::String(text) if text.parse::<DateTime<Utc>>().is_ok() => Ok(()),
                other => Err((
                    String::new(),
                    format!(
                        "{other} is not a DateTime (an RFC 3339 date and time, such as \
                         \"2026-01-31T12:00:00Z\")"
                    ),
                )),
            },
            _ => Ok(()),
        },
    }
}
