//! Required variables a request leaves out or gives as `null`: refused before anything
//! runs, as a request error (no `data`; `400` in `application/graphql-response+json`), the
//! way GraphQL coerces variables before execution, rather than as an error of each field
//! that uses one (or none at all: the executor's argument check passes over an argument
//! naming a variable the request leaves out, and a `JSON!` takes a `null`).

use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Name, Request, ServerError, ServerResult, Value as ConstValue, Variables};

/// Refuses `request` if its operation declares a non-null variable that its variables give
/// as `null`, or leave out when it has no default.
pub fn check_required(request: &mut Request) -> ServerResult<()> {
    let variables = std::mem::take(&mut request.variables);
    let operation_name = request.operation_name.clone();
    let missing = request
        .parsed_query()
        .map(|document| missing_variable(document, operation_name.as_deref(), &variables));
    request.variables = variables;
    match missing? {
        Some(error) => Err(error),
        None => Ok(()),
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
        assert_eq!(given.variables.len(), 1, "the variables are handed on");
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
