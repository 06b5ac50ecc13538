//! The `JSON` scalar with exact numbers: a payload's numbers cross GraphQL as the text the
//! client wrote, never through a float.
//!
//! async-graphql's own `Json<T>` converts through serde, and with serde_json's
//! `arbitrary_precision` a number outside 64-bit range (or any non-integer) travels through
//! serde as a one-entry marker map, which async-graphql's values keep as an object. This
//! scalar converts between `serde_json::Value` and GraphQL values directly instead.

use async_graphql::{InputValueError, InputValueResult, Name, Number, Scalar, ScalarType, Value};
use serde_json::Value as JsonValue;

/// The key serde_json (with `arbitrary_precision`) gives the one entry of the map that
/// stands for a number while it passes through serde's generic data model.
const NUMBER_MARKER: &str = "$serde_json::private::Number";

/// A scalar that can represent any JSON value.
#[derive(Debug, Clone, PartialEq)]
pub struct Json(pub JsonValue);

/// A scalar that can represent any JSON value.
#[Scalar(name = "JSON")]
impl ScalarType for Json {
    fn parse(value: Value) -> InputValueResult<Self> {
        from_graphql(value)
            .map(Json)
            .map_err(InputValueError::custom)
    }

    fn to_value(&self) -> Value {
        to_graphql(&self.0)
    }
}

/// A marker map whose text is not a number.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a JSON number")]
struct NotANumber(String);

/// A JSON value as a GraphQL value; numbers keep their text.
pub fn to_graphql(value: &JsonValue) -> Value {
    match value {
        JsonValue::Null => Value::Null,
        JsonValue::Bool(b) => Value::Boolean(*b),
        JsonValue::Number(n) => Value::Number(n.clone()),
        JsonValue::String(s) => Value::String(s.clone()),
        JsonValue::Array(items) => Value::List(items.iter().map(to_graphql).collect()),
        JsonValue::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (Name::new(key), to_graphql(item)))
                .collect(),
        ),
    }
}

/// A GraphQL input value as JSON; numbers keep their text.
///
/// Variables that reached async-graphql through serde's buffering (the internally tagged
/// WebSocket messages, the variables of a GET) hold large or fractional numbers as the
/// marker map; it is read back as the number it stands for, as serde_json itself does.
fn from_graphql(value: Value) -> Result<JsonValue, NotANumber> {
    Ok(match value {
        Value::Null => JsonValue::Null,
        Value::Boolean(b) => JsonValue::Bool(b),
        Value::Number(n) => JsonValue::Number(n),
        Value::String(s) => JsonValue::String(s),
        Value::Enum(name) => JsonValue::String(name.to_string()),
        Value::Binary(bytes) => JsonValue::Array(
            bytes
                .iter()
                .map(|byte| JsonValue::Number(Number::from(*byte)))
                .collect(),
        ),
        Value::List(items) => JsonValue::Array(
            items
                .into_iter()
                .map(from_graphql)
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => {
            if let Some(number) = marked_number(&map)? {
                return Ok(JsonValue::Number(number));
            }
            JsonValue::Object(
                map.into_iter()
                    .map(|(key, item)| Ok((key.to_string(), from_graphql(item)?)))
                    .collect::<Result<_, _>>()?,
            )
        }
    })
}

/// The number a marker map stands for, if `map` is one.
fn marked_number(
    map: &async_graphql::indexmap::IndexMap<Name, Value>,
) -> Result<Option<Number>, NotANumber> {
    match (map.len(), map.get(NUMBER_MARKER)) {
        (1, Some(Value::String(text))) => text
            .parse::<Number>()
            .map(Some)
            .map_err(|_| NotANumber(text.clone())),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_their_text_both_ways() {
        let json: JsonValue = serde_json::from_str(
            r#"{"big": 18446744073709551617, "neg": -0, "dec": 0.1000000000000000055511151231257827}"#,
        )
        .unwrap();
        let graphql = to_graphql(&json);
        assert_eq!(
            graphql.to_string(),
            "{big: 18446744073709551617, dec: 0.1000000000000000055511151231257827, neg: -0}"
        );
        assert_eq!(from_graphql(graphql).unwrap(), json);
    }

    #[test]
    fn marker_maps_from_serde_buffering_are_numbers() {
        // What async-graphql makes of `{"n": 18446744073709551617}` after serde buffered it.
        let buffered: Value = serde_json::from_str::<async_graphql::Variables>(
            r#"{"n": 18446744073709551617, "s": {"x": 0.5}}"#,
        )
        .unwrap()
        .into_value();
        assert_eq!(
            from_graphql(buffered).unwrap().to_string(),
            r#"{"n":18446744073709551617,"s":{"x":0.5}}"#
        );
    }
}
