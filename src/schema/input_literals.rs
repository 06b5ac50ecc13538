//! Input object literals that name a field twice ("Input Object Field Uniqueness", GraphQL
//! spec 5.6.3), refused before anything runs: async-graphql's parser keeps the last value,
//! so `{endpointId: "a", endpointId: "b"}` ran against `b`. The parsed document no longer
//! shows the repeat, so the text is scanned, in one flat pass like the limits' scan.

use std::collections::HashSet;

use async_graphql::{Pos, ServerError};

/// What an open bracket of the document is.
enum Open<'a> {
    /// `(`: arguments or variable definitions, where values are written.
    Parenthesis,
    /// `[`: a list value, or a list type.
    Bracket,
    /// `{` of a selection set.
    Selection,
    /// `{` of an input object literal, with the field names it has named so far.
    Object(HashSet<&'a str>),
}

/// The first field an input object literal of `query` names twice, as the validation
/// error that refuses the document; `None` when every literal names each field once (or
/// the text does not parse, which the parser reports).
pub fn repeated_field(query: &str) -> Option<ServerError> {
    let bytes = query.as_bytes();
    let mut open: Vec<Open<'_>> = Vec::new();
    // A name just read directly inside an object literal: a field's, if `:` follows.
    let mut pending: Option<(&str, usize)> = None;
    let mut variable = false;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => {
                i += 1;
                continue;
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                    i += 1;
                }
                continue;
            }
            b'"' => {
                i = after_string(bytes, i);
                pending = None;
                continue;
            }
            b'{' => {
                let literal = matches!(
                    open.last(),
                    Some(Open::Parenthesis | Open::Bracket | Open::Object(_))
                );
                open.push(if literal {
                    Open::Object(HashSet::new())
                } else {
                    Open::Selection
                });
            }
            b'(' => open.push(Open::Parenthesis),
            b'[' => open.push(Open::Bracket),
            b'}' | b')' | b']' => {
                open.pop();
            }
            b':' => {
                if let (Some((name, at)), Some(Open::Object(named))) = (pending, open.last_mut()) {
                    if !named.insert(name) {
                        return Some(ServerError::new(
                            format!("There can be only one input field named \"{name}\"."),
                            Some(position(query, at)),
                        ));
                    }
                }
            }
            b'$' => {
                variable = true;
                pending = None;
                i += 1;
                continue;
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let is_field =
                    !std::mem::take(&mut variable) && matches!(open.last(), Some(Open::Object(_)));
                pending = is_field.then(|| (&query[start..i], start));
                continue;
            }
            b'-' | b'0'..=b'9' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'.' | b'+' | b'-'))
                {
                    i += 1;
                }
                pending = None;
                variable = false;
                continue;
            }
            _ => {}
        }
        pending = None;
        variable = false;
        i += 1;
    }
    None
}

/// Where the string (or block string) starting at `start` ends: just past its closing quotes,
/// or the end of the text.
fn after_string(bytes: &[u8], start: usize) -> usize {
    if bytes[start..].starts_with(b"\"\"\"") {
        let mut i = start + 3;
        while i < bytes.len() {
            if bytes[i..].starts_with(b"\\\"\"\"") {
                i += 4;
            } else if bytes[i..].starts_with(b"\"\"\"") {
                return i + 3;
            } else {
                i += 1;
            }
        }
        return i;
    }
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            b'\n' | b'\r' => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The line and column (from 1, in characters) of byte `at` of `query`.
fn position(query: &str, at: usize) -> Pos {
    let before = &query[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    Pos {
        line,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repeated(query: &str) -> Option<(String, usize, usize)> {
        repeated_field(query).map(|error| {
            let pos = error.locations[0];
            (error.message, pos.line, pos.column)
        })
    }

    #[test]
    fn a_field_named_twice_in_an_object_literal_is_found_where_it_repeats() {
        let query = "mutation {\n  submit(input: {endpointId: \"a\", endpointId: \"b\", payload: {}}) { created }\n}";
        assert_eq!(
            repeated(query),
            Some((
                "There can be only one input field named \"endpointId\".".to_owned(),
                2,
                35
            ))
        );
        // At any depth: inside a JSON payload, a list, a directive's or a default's value.
        for query in [
            "mutation { submit(input: {endpointId: \"a\", payload: {amount: 1, amount: 1000}}) { created } }",
            "{ f(a: [{x: 1}, {y: 2, y: 3}]) }",
            "{ f @d(a: {x: 1, x: 2}) }",
            "query($v: In = {x: 1, x: 2}) { f }",
            "{ f(a: {x: {y: 1}, x: {y: 2}}) }",
        ] {
            assert!(repeated(query).is_some(), "{query}");
        }
    }

    #[test]
    fn fields_named_once_per_literal_and_everything_else_pass() {
        for query in [
            // The same name in sibling and nested literals, each once.
            "{ f(a: [{x: 1}, {x: 2}], b: {x: {x: 1}}) }",
            // Selections, aliases and arguments are not input fields.
            "{ a: f(x: 1) { id id } b: f(x: 2) { id } }",
            // Enum values, variables, strings, block strings and comments named like a field.
            "query($x: Int) { f(a: {x: FOO, y: $x, z: \"x: 1\", w: \"\"\"x: \"\" x:\"\"\"}) # {x: 1, x: 1}\n }",
            // Numbers with exponents are not names.
            "{ f(a: {e: 1e5, x: -2.5E-3}) }",
            // Unbalanced text is the parser's to refuse.
            "{ f(a: {x: 1}) } } ]",
        ] {
            assert_eq!(repeated(query), None, "{query}");
        }
    }
}
