//! What a submitted payload must be to be stored, delivered and hashed alike on every
//! backend: numbers in their exact plain form, no NUL characters, within the size limit.

pub mod canonical;
pub mod decimal;

use serde_json::{Number, Value};

use crate::error::{Error, Result};
use crate::service::payload::decimal::Decimal;
use crate::service::submissions::store::storable;

/// Accepts `payload` for storage, or says why it cannot be stored (`BAD_USER_INPUT`).
///
/// Every number is rewritten to its plain decimal form (`1E2` -> `100`, `-0` -> `0`), so
/// PostgreSQL's `jsonb` and SQLite's text store the same thing, the webhook body is the
/// same on both, and the body carries the exact value sent, never a float's rounding.
pub fn accept(mut payload: Value, max_bytes: usize) -> Result<Value> {
    // Numbers written out in full count against the limit as they are written, so a small
    // body of exponents (`[1e999, 1e999, ...]`) cannot grow in memory past the limit.
    let mut budget = max_bytes;
    exact_numbers(&mut payload, &mut budget, max_bytes)?;
    if !storable(&payload) {
        return Err(Error::bad_input(
            "payload must not contain NUL characters (\\u0000)",
        ));
    }
    let size = serde_json::to_vec(&payload)
        .map_err(|err| Error::bad_input(format!("payload is not valid JSON: {err}")))?
        .len();
    if size > max_bytes {
        return Err(Error::bad_input(format!(
            "payload is {size} bytes; the limit is {max_bytes}"
        )));
    }
    Ok(payload)
}

fn exact_numbers(value: &mut Value, budget: &mut usize, max_bytes: usize) -> Result<()> {
    match value {
        Value::Number(number) => {
            let decimal = Decimal::parse(number.as_str())
                .map_err(|err| Error::bad_input(format!("payload: {err}")))?;
            *budget = budget.checked_sub(decimal.plain_len()).ok_or_else(|| {
                Error::bad_input(format!(
                    "payload is over {max_bytes} bytes with its numbers written out in full; \
                         the limit is {max_bytes}"
                ))
            })?;
            let plain = decimal.to_string();
            *number = plain
                .parse::<Number>()
                .map_err(|err| Error::bad_input(format!("payload: {plain}: {err}")))?;
            Ok(())
        }
        Value::Array(items) => items
            .iter_mut()
            .try_for_each(|item| exact_numbers(item, budget, max_bytes)),
        Value::Object(map) => map
            .values_mut()
            .try_for_each(|item| exact_numbers(item, budget, max_bytes)),
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn numbers_are_stored_in_their_plain_form() {
        let accepted = accept(
            parse(r#"{"a": [1E2, -0, 1.50, 1e-3], "b": {"c": 18446744073709551617}}"#),
            1024,
        )
        .unwrap();
        assert_eq!(
            accepted.to_string(),
            r#"{"a":[100,0,1.5,0.001],"b":{"c":18446744073709551617}}"#
        );
    }

    #[test]
    fn exponents_cannot_outgrow_the_limit() {
        let hostile = parse(&format!("[{}]", vec!["1e999"; 64].join(",")));
        let err = accept(hostile, 16 * 1024).unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
        let err = accept(parse("[1e999999999]"), 16 * 1024).unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
        assert!(err.to_string().contains("digits"), "{err}");
    }

    #[test]
    fn nul_characters_and_oversized_payloads_are_refused() {
        assert!(accept(parse(r#"{"a": "x\u0000"}"#), 1024).is_err());
        assert!(accept(parse(r#""0123456789""#), 8).is_err());
        assert!(accept(parse(r#""0123456""#), 9).is_ok());
    }
}
