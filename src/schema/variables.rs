//! Required variables a request leaves out or gives as `null`: refused before anything
//! runs, as a request error (no `data`; `400` in `application/graphql-response+json`), the
//! way GraphQL coerces variables before execution, rather than as an error of each field
//! that uses one (or none at all: the executor's argument check passes over an argument
//! naming a variable the request leaves out, and a `JSON!` takes a `null`). And a variable
//! left out that has a default takes it before anything runs, so that what `@skip` and
//! `@include` leave out follows the default (the executor read a variable left out as
//! `false`, whatever its default).

use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Name, Request, ServerError, ServerResult, Value as ConstValue, Variables};

/// Refuses `request` if its operation declares a non-null variable that its variables give
/// as `null`, or leave out when it has no default; gives each variable left out that has a
/// default its default.
pub fn check_required(request: &mut Request) -> ServerResult<()> {
    let mut variables = std::mem::take(&mut request.variables);
    let operation_name = request.operation_name.clone();
    let missing = request.parsed_query().map(|document| {
        let missing = missing_variable(document, operation_name.as_deref(), &variables);
        if missing.is_none() {
            fill_defaults(document, operation_name.as_deref(), &mut variables);
        }
        missing
    });
    request.variables = variables;
    match missing? {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Gives each variable of the operation named `operation_name` (or the only one) that
/// `variables` leaves out its default, where it has one.
fn fill_defaults(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    variables: &mut Variables,
) {
    let mut operations = document.operations.iter();
    let operation = match operation_name {
        Some(name) => operations.find(|(op_name, _)| op_name.map(Name::as_str) == Some(name)),
        None => operations
            .next()
            .filter(|_| document.operations.iter().count() == 1),
    };
    let Some((_, operation)) = operation else {
        return;
    };
    for definition in &operation.node.variable_definitions {
        let definition = &definition.node;
        if let Some(default) = &definition.default_value {
            if !variables.contains_key(&definition.name.node) {
                variables.insert(definition.name.node.clone(), default.node.clone());
            }
        }
    }
}

/// The first required variable of the operation named `operation_name` (or the only one)
/// that `variables` gives as `null` or leaves out (with no default), as an error at its
/// definition.
fn missing_variable(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    variables: &Variables,
) -> Option<ServerError> {
    let mut operations = document.operations.iter();
    let (_, operation) = match operation_name {
        Some(name) => operations.find(|(op_name, _)| op_name.map(Name::as_str) == Some(name)),
        // Several operations and no name: the executor says which is missing.
        None => operations
            .next()
            .filter(|_| document.operations.iter().count() == 1),
    }?;
    operation
        .node
        .variable_definitions
        .iter()
        .find_map(|definition| {
            let (pos, definition) = (definition.pos, &definition.node);
            if definition.var_type.node.nullable {
                return None;
            }
            let wrong = match variables.get(&definition.name.node) {
                Some(ConstValue::Null) => "was given null",
                Some(_) => return None,
                None if definition.default_value.is_some() => return None,
                None => "was not given",
            };
            Some(ServerError::new(
                format!(
                    "variable ${} of type {} is required and {wrong}",
                    definition.name.node, definition.var_type.node
                ),
                Some(pos),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(query: &str, variables: serde_json::Value) -> Request {
        Request::new(query).variables(Variables::from_json(variables))
    }

    #[test]
    fn a_required_variable_left_out_is_refused_before_execution() {
        let query = "query($id: ID!, $first: Int, $after: String! = \"x\") { a(id: $id) }";
        let mut missing = request(query, serde_json::json!({ "first": 1 }));
        let error = check_required(&mut missing)
            .err()
            .map(|error| error.message);
        assert_eq!(
            error.as_deref(),
            Some("variable $id of type ID! is required and was not given")
        );
        let mut given = request(query, serde_json::json!({ "id": "1" }));
        assert!(
            check_required(&mut given).is_ok(),
            "optional and defaulted may be left out"
        );
        assert_eq!(
            given.variables.len(),
            2,
            "the variables are handed on, with the default of the one left out"
        );
        let named = "query A { a } query B($id: ID!) { a(id: $id) }";
        let mut other = request(named, serde_json::json!({})).operation_name("A");
        assert!(
            check_required(&mut other).is_ok(),
            "only the chosen operation counts"
        );
        let mut chosen = request(named, serde_json::json!({})).operation_name("B");
        assert!(check_required(&mut chosen).is_err());
    }

    #[test]
    fn a_variable_left_out_takes_its_default() {
        let query = "query($a: Boolean = true, $b: Int, $c: String! = \"x\") { a }";
        let mut request = request(query, serde_json::json!({ "c": "given" }));
        assert!(check_required(&mut request).is_ok());
        assert_eq!(
            request.variables.into_value().into_json().expect("JSON"),
            serde_json::json!({ "a": true, "c": "given" })
        );
    }

    #[test]
    fn a_required_variable_given_null_is_refused_before_execution() {
        let query = "mutation($p: JSON!, $k: String, $d: Int! = 1) { a(p: $p, k: $k, d: $d) }";
        let refusal = |variables| {
            check_required(&mut request(query, variables))
                .err()
                .map(|error| error.message)
        };
        let expected = Some("variable $p of type JSON! is required and was given null".to_owned());
        assert_eq!(refusal(serde_json::json!({ "p": null })), expected);
        assert_eq!(
            refusal(serde_json::json!({ "p": null, "k": null })),
            expected
        );
        assert_eq!(
            refusal(serde_json::json!({ "p": {}, "d": null })),
            Some("variable $d of type Int! is required and was given null".to_owned()),
            "a default does not stand in for an explicit null"
        );
        assert_eq!(refusal(serde_json::json!({ "p": {}, "k": null })), None);
    }
}
