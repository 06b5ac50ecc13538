//! Event type names (`order.paid`) and an endpoint's subscription to them: what is a valid
//! type, and how a subscription list is stored (a JSON array; empty means every type).

use serde_json::Value;

use crate::error::{Error, Result};

/// Longest event type, in characters.
pub const MAX_EVENT_TYPE_CHARS: usize = 255;
/// Most event types one endpoint may subscribe to.
pub const MAX_SUBSCRIBED_TYPES: usize = 100;

/// Checks one event type: 1 to 255 characters, no whitespace or control characters.
pub fn validate(event_type: &str) -> Result<String> {
    let chars = event_type.chars().count();
    if chars == 0 || chars > MAX_EVENT_TYPE_CHARS {
        return Err(Error::bad_input(format!(
            "an event type must be 1 to {MAX_EVENT_TYPE_CHARS} characters"
        )));
    }
    if event_type
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::bad_input(
            "an event type must not contain whitespace or control characters",
        ));
    }
    Ok(event_type.to_owned())
}

/// Checks a subscription list and gives its stored form: each type valid, duplicates
/// dropped, sorted; `[]` subscribes to every type.
pub fn subscription(types: Vec<String>) -> Result<Value> {
    if types.len() > MAX_SUBSCRIBED_TYPES {
        return Err(Error::bad_input(format!(
            "an endpoint may subscribe to at most {MAX_SUBSCRIBED_TYPES} event types"
        )));
    }
    let mut valid = types
        .iter()
        .map(|event_type| validate(event_type))
        .collect::<Result<Vec<_>>>()?;
    valid.sort();
    valid.dedup();
    Ok(Value::Array(valid.into_iter().map(Value::String).collect()))
}

/// The subscription list as stored, read back (anything that is not a string is ignored).
pub fn subscribed(stored: &Value) -> Vec<String> {
    stored
        .as_array()
        .map(|types| {
            types
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_short_names_without_spaces() {
        assert!(validate("order.paid").is_ok());
        assert!(validate(&"x".repeat(255)).is_ok());
        for bad in [
            "",
            "order paid",
            "tab\there",
            "nl\n",
            "nul\0",
            &"x".repeat(256),
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn subscriptions_are_sorted_and_deduplicated() {
        let stored = subscription(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(subscribed(&stored), vec!["a", "b"]);
        assert_eq!(
            subscribed(&subscription(Vec::new()).unwrap()),
            Vec::<String>::new()
        );
        assert!(subscription(vec!["ok".into(), "not ok".into()]).is_err());
    }
}
