//! Argument values that would fail to coerce once the operation ran, refused before
//! anything runs, as request errors (no `data`; `400` in `application/graphql-response+json`),
//! the way GraphQL coerces arguments and variables before execution.
//!
//! async-graphql's validation accepts any integer for `Int`, any value for `DateTime` and a
//! quoted string for an enum, and refuses the first two only when a resolver reads them: a
//! field error after other fields (and, in a mutation, other mutations) may have run.

use async_graphql::parser::types::{
    Directive, ExecutableDocument, Field, InlineFragment, OperationType, Selection, SelectionSet,
    VariableDefinition,
};
use async_graphql::parser::Positioned;
use async_graphql::registry::{MetaField, MetaInputValue, MetaType, MetaTypeName, Registry};
use async_graphql::{
    Name, Number, Pos, Request, ServerError, ServerResult, Value as ConstValue, Variables,
};
use async_graphql_value::Value;
use chrono::{DateTime, Utc};

use super::limits::MAX_FRAGMENT_DEPTH;
use super::single_root::selected_operation;

/// Refuses `request` if an argument of an operation of its document, given literally or
/// through a variable (the request's, for the operation it runs), is a variable of a type
/// not allowed there, or holds an `Int` outside 32 bits or a `DateTime` that is not an RFC
/// 3339 date and time, or a literal holds a quoted string where an enum value goes.
/// Arguments of fields the schema does not have are left to validation.
pub fn check_arguments(registry: &Registry, request: &mut Request) -> ServerResult<()> {
    let variables = std::mem::take(&mut request.variables);
    let operation_name = request.operation_name.clone();
    let unused = Variables::default();
    let checked = request.parsed_query().map(|document| {
        let Some((_, selected)) = selected_operation(document, operation_name.as_deref()) else {
            return Ok(());
        };
        // Every operation of the document, as validation covers them all: the one that
        // runs with the request's variables, the others' variables' types against where
        // they are used (and their literals).
        for (_, operation) in document.operations.iter() {
            let root = match operation.node.ty {
                OperationType::Query => Some(registry.query_type.as_str()),
                OperationType::Mutation => registry.mutation_type.as_deref(),
                OperationType::Subscription => registry.subscription_type.as_deref(),
            };
            let Some(root) = root else {
                continue;
            };
            let walk = Walk {
                registry,
                document,
                variables: if std::ptr::eq(operation, selected) {
                    &variables
                } else {
                    &unused
                },
                definitions: &operation.node.variable_definitions,
            };
            walk.selection_set(root, &operation.node.selection_set.node, 0)?;
        }
        Ok(())
    });
    request.variables = variables;
    checked?
}

/// The schema's definition of `field`, selected on type `parent`, when there is anything
/// to look at: not for a leaf without arguments (nor for a field the schema does not have,
/// which is validation's to refuse).
pub(super) fn field_to_look_at<'r>(
    registry: &'r Registry,
    parent: &str,
    field: &Field,
) -> Option<&'r MetaField> {
    if field.arguments.is_empty() && field.selection_set.node.items.is_empty() {
        return None;
    }
    registry
        .types
        .get(parent)
        .and_then(|ty| ty.field_by_name(&field.name.node))
}

/// The type an inline fragment's selections are on, within type `parent`.
pub(super) fn inline_type<'a>(parent: &'a str, inline: &'a InlineFragment) -> &'a str {
    inline
        .type_condition
        .as_ref()
        .map_or(parent, |condition| condition.node.on.node.as_str())
}

/// What a walk over one operation's selections reads.
struct Walk<'a> {
    registry: &'a Registry,
    document: &'a ExecutableDocument,
    variables: &'a Variables,
    definitions: &'a [Positioned<VariableDefinition>],
}

impl<'a> Walk<'a> {
    /// Checks the arguments of every field `set` selects on `parent`, fragments included.
    fn selection_set(&self, parent: &str, set: &SelectionSet, depth: usize) -> ServerResult<()> {
        if depth > MAX_FRAGMENT_DEPTH {
            return Ok(());
        }
        for selection in &set.items {
            self.directives(selection.node.directives())?;
            match &selection.node {
                Selection::Field(field) => {
                    let Some(meta) = field_to_look_at(self.registry, parent, &field.node) else {
                        continue;
                    };
                    for (name, value) in &field.node.arguments {
                        let Some(argument) = meta.args.get(name.node.as_str()) else {
                            continue;
                        };
                        self.argument(argument, Input::Literal(&value.node), value.pos)?;
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
                    let on = inline_type(parent, &inline.node);
                    self.selection_set(on, &inline.node.selection_set.node, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Checks the arguments of `directives` the schema knows (`@skip(if:)`, `@include(if:)`),
    /// which validation checks only when given: `query($v: String) { a @include(if: $v) }`
    /// with `$v` left out ran.
    fn directives(&self, directives: &[Positioned<Directive>]) -> ServerResult<()> {
        for directive in directives {
            let Some(meta) = self
                .registry
                .directives
                .get(directive.node.name.node.as_str())
            else {
                continue;
            };
            for (name, value) in &directive.node.arguments {
                if let Some(argument) = meta.args.get(name.node.as_str()) {
                    self.argument(argument, Input::Literal(&value.node), value.pos)?;
                }
            }
        }
        Ok(())
    }

    /// Checks `value`, given to `argument` at `pos`.
    fn argument(&self, argument: &MetaInputValue, value: Input<'a>, pos: Pos) -> ServerResult<()> {
        self.position(&argument.ty, value)
            .map_err(|(path, problem)| {
                ServerError::new(format!("{}{path}: {problem}", argument.name), Some(pos))
            })
    }

    /// [`Walk::check`] of `input` at a position of type `ty` (an argument, an input
    /// object's field, an item of a list literal), where a variable's declared type is
    /// checked against the position's too.
    fn position(&self, ty: &str, input: Input<'a>) -> Result<(), (String, String)> {
        if let Input::Literal(Value::Variable(name)) = input {
            self.usage(name, ty)?;
        }
        self.check(ty, input)
    }

    /// Refuses variable `name` where a value of type `location` goes, unless GraphQL
    /// allows its declared type there ("All Variable Usages Are Allowed"): the same type,
    /// or a non-null one where null is allowed, or a nullable one with a non-null default.
    fn usage(&self, name: &Name, location: &str) -> Result<(), (String, String)> {
        let Some(definition) = self
            .definitions
            .iter()
            .find(|definition| &definition.node.name.node == name)
        else {
            return Ok(());
        };
        let declared = definition.node.var_type.node.to_string();
        let defaulted = definition
            .node
            .default_value
            .as_ref()
            .is_some_and(|default| default.node != ConstValue::Null);
        let allowed = match MetaTypeName::create(location) {
            MetaTypeName::NonNull(nullable) if !declared.ends_with('!') => {
                defaulted && compatible(&declared, nullable)
            }
            _ => compatible(&declared, location),
        };
        if allowed {
            Ok(())
        } else {
            Err((
                String::new(),
                format!("variable ${name} of type {declared} cannot be used where {location} is expected"),
            ))
        }
    }

    /// The value of variable `name`: given, or its definition's default; `None` if neither.
    fn variable(&self, name: &Name) -> Option<&'a ConstValue> {
        self.variables.get(name).or_else(|| {
            self.definitions
                .iter()
                .find(|definition| &definition.node.name.node == name)
                .and_then(|definition| definition.node.default_value.as_ref())
                .map(|default| &default.node)
        })
    }

    /// What `input` holds, its variables read (by reference: a payload is never copied).
    fn shape(&self, input: Input<'a>) -> Shape<'a> {
        match input {
            Input::Literal(Value::Variable(name)) => match self.variable(name) {
                Some(given) => self.shape(Input::Given(given)),
                None => Shape::Unknown,
            },
            Input::Literal(Value::Null) | Input::Given(ConstValue::Null) => Shape::Null,
            Input::Literal(Value::Number(number)) | Input::Given(ConstValue::Number(number)) => {
                Shape::Number(number)
            }
            Input::Literal(Value::String(text)) | Input::Given(ConstValue::String(text)) => {
                Shape::String(text)
            }
            Input::Literal(Value::List(items)) => {
                Shape::List(items.iter().map(Input::Literal).collect())
            }
            Input::Given(ConstValue::List(items)) => {
                Shape::List(items.iter().map(Input::Given).collect())
            }
            Input::Literal(Value::Object(fields)) => Shape::Object(
                fields
                    .iter()
                    .map(|(name, value)| (name, Input::Literal(value)))
                    .collect(),
            ),
            Input::Given(ConstValue::Object(fields)) => Shape::Object(
                fields
                    .iter()
                    .map(|(name, value)| (name, Input::Given(value)))
                    .collect(),
            ),
            _ => Shape::Other,
        }
    }

    /// Where in `input` (`.field` and `[index]` steps) and why it cannot be coerced to `ty`
    /// (a type as the registry spells it), as far as `Int` ranges, `DateTime`s and enum
    /// literals go; every other rule is validation's. Values of other scalars (a `JSON` payload) are not walked.
    fn check(&self, ty: &str, input: Input<'a>) -> Result<(), (String, String)> {
        let name = match MetaTypeName::create(ty) {
            MetaTypeName::NonNull(inner) => return self.check(inner, input),
            MetaTypeName::List(item) => {
                return match self.shape(input) {
                    Shape::List(items) => {
                        items
                            .into_iter()
                            .enumerate()
                            .try_for_each(|(index, value)| {
                                self.position(item, value).map_err(|(path, problem)| {
                                    (format!("[{index}]{path}"), problem)
                                })
                            })
                    }
                    // A single value stands for a list of one.
                    _ => self.check(item, input),
                };
            }
            MetaTypeName::Named(name) => name,
        };
        match (self.registry.types.get(name), name) {
            (Some(MetaType::InputObject { input_fields, .. }), _) => match self.shape(input) {
                Shape::Object(fields) => fields.into_iter().try_for_each(|(field, value)| {
                    match input_fields.get(field.as_str()) {
                        Some(meta) => self
                            .position(&meta.ty, value)
                            .map_err(|(path, problem)| (format!(".{field}{path}"), problem)),
                        None => Ok(()),
                    }
                }),
                Shape::Null | Shape::Unknown => Ok(()),
                // A literal of another kind is validation's to refuse; a variable's value
                // is only read here.
                _ if matches!(input, Input::Literal(value) if !matches!(value, Value::Variable(_))) => {
                    Ok(())
                }
                _ => Err((
                    String::new(),
                    format!("expected an input object of type {name}"),
                )),
            },
            // An enum value is written as a name; a quoted string is not one (GraphQL spec
            // 5.6.1), though async-graphql takes it. A variable's value is JSON, where enum
            // values are strings, and stands.
            (Some(MetaType::Enum { .. }), _) => match input {
                Input::Literal(Value::String(text)) => Err((
                    String::new(),
                    format!(
                        "{text:?} is a string; a value of enum {name} is written without quotes"
                    ),
                )),
                _ => Ok(()),
            },
            (Some(MetaType::Scalar { .. }), "Int") => match self.shape(input) {
                Shape::Number(number) => match number.as_i64().map(i32::try_from) {
                    Some(Ok(_)) => Ok(()),
                    _ => Err((
                        String::new(),
                        format!("{number} is not an Int (a 32-bit integer)"),
                    )),
                },
                _ => Ok(()),
            },
            (Some(MetaType::Scalar { .. }), "DateTime") => match self.shape(input) {
                Shape::Null | Shape::Unknown => Ok(()),
                Shape::String(text) if text.parse::<DateTime<Utc>>().is_ok() => Ok(()),
                Shape::String(text) => Err(not_a_date_time(&format!("{text:?}"))),
                Shape::Number(number) => Err(not_a_date_time(&number.to_string())),
                Shape::List(_) => Err(not_a_date_time("a list")),
                Shape::Object(_) => Err(not_a_date_time("an object")),
                Shape::Other => Err(not_a_date_time("this value")),
            },
            _ => Ok(()),
        }
    }
}

/// Whether a variable of type `variable` may stand where `location` goes (GraphQL's
/// `AreTypesCompatible`; both as the registry spells types).
fn compatible(variable: &str, location: &str) -> bool {
    match (
        MetaTypeName::create(variable),
        MetaTypeName::create(location),
    ) {
        (MetaTypeName::NonNull(variable), MetaTypeName::NonNull(location)) => {
            compatible(variable, location)
        }
        (_, MetaTypeName::NonNull(_)) => false,
        (MetaTypeName::NonNull(variable), _) => compatible(variable, location),
        (MetaTypeName::List(variable), MetaTypeName::List(location)) => {
            compatible(variable, location)
        }
        (MetaTypeName::List(_), _) | (_, MetaTypeName::List(_)) => false,
        (MetaTypeName::Named(variable), MetaTypeName::Named(location)) => variable == location,
    }
}

/// The problem with `what`, given for a `DateTime`.
fn not_a_date_time(what: &str) -> (String, String) {
    (
        String::new(),
        format!(
            "{what} is not a DateTime (an RFC 3339 date and time, such as \"2026-01-31T12:00:00Z\")"
        ),
    )
}

/// An argument's value as the walk reads it: a literal of the document (which may name
/// variables) or a value the request's variables gave.
#[derive(Clone, Copy)]
enum Input<'a> {
    Literal(&'a Value),
    Given(&'a ConstValue),
}

/// What an [`Input`] holds, its variables read.
enum Shape<'a> {
    Null,
    Number(&'a Number),
    String(&'a str),
    List(Vec<Input<'a>>),
    Object(Vec<(&'a Name, Input<'a>)>),
    /// A variable neither given nor defaulted: the executor's to refuse, if it is required.
    Unknown,
    /// A boolean, an enum value, or binary data.
    Other,
}
