//! What a WebSocket's `connection_init` payload says of the API key: its `Authorization`
//! entry (the name in any case), none, or one that is no key at all.

/// What a `connection_init` payload says of the key.
#[derive(Debug, PartialEq, Eq)]
pub enum PayloadKey {
    /// No `Authorization` entry (or `null`, or no payload object): the upgrade request's
    /// header counts, if any.
    Absent,
    /// The entry's value.
    Given(String),
    /// An entry that is not a string, or one named twice in different case: a wrong key,
    /// as two `Authorization` headers on a request are.
    Malformed,
}

/// The `Authorization` entry of a `connection_init` payload, its key matched case-insensitively.
pub fn authorization_of(payload: &serde_json::Value) -> PayloadKey {
    let Some(object) = payload.as_object() else {
        return PayloadKey::Absent;
    };
    let mut entries = object
        .iter()
        .filter(|(key, _)| key.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value);
    match (entries.next(), entries.next()) {
        (None | Some(serde_json::Value::Null), None) => PayloadKey::Absent,
        (Some(serde_json::Value::String(value)), None) => PayloadKey::Given(value.clone()),
        _ => PayloadKey::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_key_is_case_insensitive() {
        let payload = serde_json::json!({ "authorization": "Bearer x" });
        assert_eq!(
            authorization_of(&payload),
            PayloadKey::Given("Bearer x".into())
        );
        let payload = serde_json::json!({ "Authorization": "Bearer y" });
        assert_eq!(
            authorization_of(&payload),
            PayloadKey::Given("Bearer y".into())
        );
        assert_eq!(
            authorization_of(&serde_json::json!(null)),
            PayloadKey::Absent
        );
        let payload = serde_json::json!({ "Authorization": null });
        assert_eq!(authorization_of(&payload), PayloadKey::Absent);
    }

    #[test]
    fn a_key_that_is_not_one_string_is_malformed() {
        for payload in [
            serde_json::json!({ "Authorization": 123 }),
            serde_json::json!({ "Authorization": ["Bearer x"] }),
            serde_json::json!({ "authorization": "Bearer x", "Authorization": "Bearer y" }),
        ] {
            assert_eq!(
                authorization_of(&payload),
                PayloadKey::Malformed,
                "{payload}"
            );
        }
    }
}
